// item<double>() on a float tensor: named at compile time, not an undefined
// reference to ddp::Tensor::item<double>() at link time.
// expect-error: there is no float64 (double) dtype
#include "runtime/tensor.h"

int main() {
  return static_cast<int>(ddp::zeros({1}).item<double>());
}
