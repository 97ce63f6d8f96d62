// Note [gradient destinations] (runtime/autograd/autograd.h): Linear writes its
// weight gradient into the destination, which becomes .grad without a copy, and
// the gradient is the same as without one, also when the weight is used twice.
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/ops/ops.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

Tensor leaf(const Shape& shape, uint64_t seed) {
  Tensor t = randn(shape, seed);
  set_requires_grad(t, true);
  return t;
}

// d(sum(linear(x, w, b)))/dw for x of 3 rows, with or without a destination.
std::vector<float> weight_grad(bool use_twice, Tensor* destination) {
  Tensor w = leaf({4, 5}, 1), b = leaf({4}, 2);
  const Tensor x = randn({3, 5}, 3);
  if (destination != nullptr) set_gradient_destination(w, *destination);
  Tensor y = functional::linear(x, w, b);
  if (use_twice) y = functional::add(y, functional::linear(ddp::scale(x, 2.0f), w, b));
  backward(functional::sum(y));
  // Used twice, the engine sums the two gradients into fresh memory: .grad is
  // that sum (DDP's hook then copies it), not the destination.
  if (destination != nullptr && !use_twice) {
    EXPECT_EQ(grad(w).data_ptr(), destination->data_ptr()) << ".grad is not the destination";
  }
  return grad(w).to_vector<float>();
}

TEST(GradientDestination, LinearWritesTheWeightGradientThere) {
  Tensor destination = full({4, 5}, 123.0f);
  const std::vector<float> reference = weight_grad(false, nullptr);
  EXPECT_EQ(weight_grad(false, &destination), reference);
  EXPECT_EQ(destination.to_vector<float>(), reference);
}

TEST(GradientDestination, AWeightUsedTwiceGetsTheSum) {
  Tensor destination = zeros({4, 5});
  const std::vector<float> reference = weight_grad(true, nullptr);
  const std::vector<float> got = weight_grad(true, &destination);
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], reference[i], 1e-5f) << i;
}

TEST(GradientDestination, OnlyTheFirstGradientSinceZeroGradUsesIt) {
  Tensor w = leaf({2, 2}, 4);
  Tensor destination = zeros({2, 2});
  set_gradient_destination(w, destination);
  EXPECT_TRUE(gradient_destination(w).defined());
  EXPECT_FALSE(gradient_destination(w).defined()) << "handed out twice in one accumulation";
  set_grad(w, ones({2, 2}));
  set_gradient_destination(w, destination);
  EXPECT_FALSE(gradient_destination(w).defined()) << "handed out while .grad is set";
  set_gradient_destination(w, Tensor());
  set_grad(w, Tensor());
  EXPECT_FALSE(gradient_destination(w).defined()) << "handed out after being cleared";
}

TEST(GradientDestination, RejectsAMismatchedDestination) {
  Tensor w = leaf({2, 3}, 5);
  EXPECT_THROW(set_gradient_destination(w, zeros({3, 2})), ValueError);
  EXPECT_THROW(set_gradient_destination(w, zeros({2, 3}, {.dtype = DType::f16})), ValueError);
}

}  // namespace
}  // namespace ddp
