// The communicator a comm hook is given (internal to the reducer): forwards every
// call to DDP's communicator and records what the hook's collectives send and
// their Works, so CommStats covers any hook, built-in or user-written.
#pragma once

#include "collectives/communicator.h"

#include <memory>
#include <vector>

namespace ddp {

class HookCommunicator : public Communicator {
 public:
  explicit HookCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  bool accepts(const Device& device) const override { return inner_->accepts(device); }
  int64_t next_sequence() const override { return inner_->next_sequence(); }
  const CommOptions& options() const override { return inner_->options(); }

  std::shared_ptr<Work> all_reduce(Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override;
  std::shared_ptr<Work> all_gather(const Tensor& input, Tensor& output) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) override;
  std::shared_ptr<Work> reduce(Tensor& tensor, int root, ReduceOp op) override;
  std::shared_ptr<Work> barrier() override;

  // Bytes passed to collectives since the last clear(); their Works.
  int64_t bytes() const { return bytes_; }
  const std::vector<std::shared_ptr<Work>>& works() const { return works_; }
  void clear();

 private:
  std::shared_ptr<Work> record(const Tensor& sent, std::shared_ptr<Work> work);

  std::shared_ptr<Communicator> inner_;
  int64_t bytes_ = 0;
  std::vector<std::shared_ptr<Work>> works_;
};

}  // namespace ddp
