// --on-nonfinite: a step whose loss or gradient norm is NaN or infinite stops the
// run with an error naming the step and the rank (stop), or is left out of the
// optimizer's updates on every rank alike (skip). Note [non-finite check] in
// nonfinite.cpp says what it costs.
#pragma once

#include "collectives/communicator.h"
#include "runtime/tensor.h"

#include <string>
#include <vector>

namespace ddp::train {

class NonfiniteCheck {
 public:
  // action: "stop" | "skip". comm: null for a single process. skipped: the steps
  // skipped before a resume (the checkpoint's skipped_steps), counted on from.
  NonfiniteCheck(const std::string& action, const Device& device, Communicator* comm, int rank,
                 int64_t skipped = 0);
  // After the step's backward, with the gradients final (averaged over ranks under
  // DDP). stop: records `loss` (this rank's, a scalar) for check() and returns
  // false. skip: reads the loss and the squared L2 norm of `grads` (the .grad
  // tensors, or ZeRO-2's gradient shard; undefined ones are skipped) now and
  // returns true when the update must be left out (the same answer on every rank).
  bool after_backward(int64_t step, int64_t epoch, const Tensor& loss,
                      const std::vector<Tensor>& grads);
  // stop: reads the recorded values and throws ValueError naming the first
  // non-finite step and the rank whose loss it was. Every rank must call it at the
  // same steps (it all-reduces which ranks saw a non-finite loss): where the loop
  // reads the device anyway (progress lines, the end of an epoch) and before every
  // checkpoint.
  void check();
  // Throws ValueError on every rank when a weight is not finite on any rank (a
  // non-finite gradient with a finite loss), naming the step and the lowest such
  // rank; reads the device and all-reduces the verdict, so every rank must call it
  // at the same steps: before every checkpoint and at each epoch's end.
  void check_weights(int64_t step, const std::vector<Tensor>& params) const;
  int64_t skipped() const { return skipped_; }

 private:
  Tensor squared_grad_norm(const std::vector<Tensor>& grads) const;
  // culprit: the rank whose loss is not finite.
  [[noreturn]] void fail(int64_t step, int culprit, float loss) const;
  int64_t epoch_of(int64_t step) const;

  bool skip_;
  Device device_;
  Communicator* comm_;
  int rank_;
  Tensor losses_;  // stop: one slot per recorded step, on the device
  std::vector<std::pair<int64_t, int64_t>> steps_;  // stop: (step, epoch) of each slot
  int64_t skipped_;
};

}  // namespace ddp::train
