#include "collectives/ddp/hook_communicator.h"

namespace ddp {

std::shared_ptr<Work> HookCommunicator::record(const Tensor& sent, std::shared_ptr<Work> work) {
  if (sent.defined()) bytes_ += static_cast<int64_t>(sent.nbytes());
  works_.push_back(work);
  return work;
}

void HookCommunicator::clear() {
  bytes_ = 0;
  works_.clear();
}

std::shared_ptr<Work> HookCommunicator::all_reduce(Tensor& tensor, ReduceOp op) {
  return record(tensor, inner_->all_reduce(tensor, op));
}

std::shared_ptr<Work> HookCommunicator::broadcast(Tensor& tensor, int root) {
  return record(tensor, inner_->broadcast(tensor, root));
}

// Forwarded as const, so the inner communicator refuses it off the root
// (Note [broadcast overloads]).
std::shared_ptr<Work> HookCommunicator::broadcast(const Tensor& tensor, int root) {
  return record(tensor, inner_->broadcast(tensor, root));
}

std::shared_ptr<Work> HookCommunicator::all_gather(const Tensor& input, Tensor& output) {
  return record(input, inner_->all_gather(input, output));
}

std::shared_ptr<Work> HookCommunicator::reduce_scatter(const Tensor& input, Tensor& output,
                                                       ReduceOp op) {
  return record(input, inner_->reduce_scatter(input, output, op));
}

std::shared_ptr<Work> HookCommunicator::reduce(Tensor& tensor, int root, ReduceOp op) {
  return record(tensor, inner_->reduce(tensor, root, op));
}

std::shared_ptr<Work> HookCommunicator::barrier() {
  return record(Tensor(), inner_->barrier());
}

}  // namespace ddp
