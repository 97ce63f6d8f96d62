// Communication hooks of DistributedDataParallel (PyTorch's register_comm_hook):
// a hook decides how one bucket of gradients is reduced across ranks.
//
// Note [comm hooks]: DDP calls the hook once per bucket and synchronized
// backward, as soon as the bucket's gradients are all in, in bucket order
// (0, 1, ...) on every rank, so collectives the hook issues match across ranks.
// The hook starts its collectives and returns at once with a BucketFuture; DDP
// waits for the futures in bucket order in finish_backward() and writes each
// result into the bucket's .grad tensors. The result must be the average over
// ranks (what .grad should hold): bucket.buffer.numel() elements of
// bucket.buffer's dtype on its device, else finish_backward() throws a
// ValueError naming the bucket and both shapes.
//
// The built-ins are ordinary hooks (allreduce_hook, bf16_compress_hook,
// fp16_compress_hook); DdpOptions::comm_hook registers one of them. Compression
// halves the bytes on the wire at the price of rounding the averaged gradient to
// 8 (bf16) or 11 (fp16) significant bits; fp16 overflows above 65504, bf16 keeps
// float32's range. What each costs on a CPU: docs/ddp.md.
#pragma once

#include "collectives/communicator.h"
#include "collectives/ddp/ddp_types.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace ddp {

// One bucket of this rank's gradients, as a hook sees it (PyTorch's GradBucket).
struct GradBucket {
  size_t index = 0;      // 0, 1, ...: the order hooks run in on every rank
  bool is_last = false;  // the last bucket of this backward
  // This rank's gradients of `parameters`, concatenated. The hook may overwrite
  // it (returning it as the result is the usual way to reduce in place).
  Tensor buffer;
  std::vector<Tensor> parameters;
  std::vector<Tensor> gradients;  // parameter-shaped views into `buffer`
};

// The pending result of a hook (PyTorch's Future[Tensor]). Copies share the result.
class BucketFuture {
 public:
  // A result that is already known (a hook that reduced synchronously).
  static BucketFuture ready(Tensor reduced);
  // Once `work` has finished, `then()` makes the result. DDP runs `then` on the
  // thread that finishes backward, for buckets 0, 1, ... in order on every rank,
  // so it may issue further collectives and wait for them (a second round, as
  // PowerSGD's). The tensors `work` uses must live until then: capture them.
  static BucketFuture after(std::shared_ptr<Work> work, std::function<Tensor()> then);

  // Waits (once; later calls return the same tensor) and returns the result, or
  // throws the collective's CommError or what `then` threw.
  Tensor wait();
  // Waits for the collective only: `then` still runs in wait(), which also throws
  // what the collective threw (Note [last bucket on the caller] in reducer.cpp).
  void wait_collective() noexcept;
  bool valid() const { return state_ != nullptr; }

 private:
  struct State {
    std::shared_ptr<Work> work;
    std::function<Tensor()> then;
    Tensor value;
    bool resolved = false;
  };
  std::shared_ptr<State> state_;
};

// A hook: starts the reduction of `bucket` over `comm` and returns its future.
using CommHookFn = std::function<BucketFuture(Communicator& comm, GradBucket& bucket)>;

// The built-in hooks (PyTorch's default_hooks). allreduce_hook: all_reduce(avg)
// of the buffer in place. The compress hooks send float32 buckets as bf16 or
// f16 and restore float32 into the buffer; other dtypes go as they are. f16 is
// divided by the world size before the sum (as torch's): its range is small.
BucketFuture allreduce_hook(Communicator& comm, GradBucket& bucket);
BucketFuture bf16_compress_hook(Communicator& comm, GradBucket& bucket);
BucketFuture fp16_compress_hook(Communicator& comm, GradBucket& bucket);
// The built-in hook of `kind` (DdpOptions::comm_hook).
CommHookFn builtin_comm_hook(CommHook kind);

}  // namespace ddp
