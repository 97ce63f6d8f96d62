// ddp has no float64 dtype: a double tensor stops the compilation with a message
// that says so and how to convert (runtime/dtype.h, DTypeOf), not an
// incomplete-type error or an undefined symbol at link time.
// expect-error: there is no float64 (double) dtype
#include "runtime/tensor.h"

int main() {
  ddp::Tensor t = ddp::from_vector<double>({1.0, 2.0}, {2});
  return static_cast<int>(t.item<double>());
}
