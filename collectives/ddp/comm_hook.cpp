#include "collectives/ddp/comm_hook.h"

#include "runtime/ops/ops.h"

namespace ddp {

BucketFuture BucketFuture::ready(Tensor reduced) {
  BucketFuture f;
  f.state_ = std::make_shared<State>();
  f.state_->value = std::move(reduced);
  f.state_->resolved = true;
  return f;
}

BucketFuture BucketFuture::after(std::shared_ptr<Work> work, std::function<Tensor()> then) {
  DDP_CHECK(work != nullptr && then != nullptr,
            "BucketFuture::after needs a Work and a function that makes the result");
  BucketFuture f;
  f.state_ = std::make_shared<State>();
  f.state_->work = std::move(work);
  f.state_->then = std::move(then);
  return f;
}

Tensor BucketFuture::wait() {
  DDP_CHECK(state_ != nullptr,
            "BucketFuture::wait on an empty future; a comm hook must return "
            "BucketFuture::ready(...) or BucketFuture::after(...)");
  State& s = *state_;
  if (s.resolved) return s.value;
  s.work->wait();
  s.value = s.then();
  s.resolved = true;
  s.then = nullptr;  // releases what it captured
  return s.value;
}

void BucketFuture::wait_collective() noexcept {
  if (state_ == nullptr || state_->resolved || state_->work == nullptr) return;
  try {
    state_->work->wait();
  } catch (...) {
    // A Work throws its error again on every wait: wait() reports it.
  }
}

BucketFuture allreduce_hook(Communicator& comm, GradBucket& bucket) {
  Tensor buffer = bucket.buffer;
  return BucketFuture::after(comm.all_reduce(buffer, ReduceOp::avg), [buffer] { return buffer; });
}

namespace {

// Sends a float32 bucket as `wire` and restores float32 into the buffer. f16 (largest
// value 65504) is divided by the world size before it is sent and summed, as torch's
// fp16_compress_hook does: backends that add 16-bit values pairwise in f16 (gloo, mpi)
// would otherwise overflow to inf where the average is finite.
BucketFuture compress_hook(Communicator& comm, GradBucket& bucket, DType wire) {
  if (bucket.buffer.dtype() != DType::f32) return allreduce_hook(comm, bucket);
  Tensor buffer = bucket.buffer;
  const bool divide_first = wire == DType::f16;
  Tensor compressed = divide_first
                          ? cast(scale(buffer, 1.0f / static_cast<float>(comm.size())), wire)
                          : cast(buffer, wire);
  const ReduceOp op = divide_first ? ReduceOp::sum : ReduceOp::avg;
  return BucketFuture::after(comm.all_reduce(compressed, op), [buffer, compressed] {
    Tensor restored = cast(compressed, buffer.dtype());
    Tensor out = buffer;
    copy_(out, restored);
    return buffer;
  });
}

}  // namespace

BucketFuture bf16_compress_hook(Communicator& comm, GradBucket& bucket) {
  return compress_hook(comm, bucket, DType::bf16);
}

BucketFuture fp16_compress_hook(Communicator& comm, GradBucket& bucket) {
  return compress_hook(comm, bucket, DType::f16);
}

CommHookFn builtin_comm_hook(CommHook kind) {
  switch (kind) {
    case CommHook::none:
      return allreduce_hook;
    case CommHook::bf16:
      return bf16_compress_hook;
    case CommHook::fp16:
      return fp16_compress_hook;
  }
  DDP_ASSERT(false, "unknown comm hook {}", static_cast<int>(kind));
}

}  // namespace ddp
