// The communicator (process group): rank, world size and asynchronous
// collectives over tensors, as torch.distributed's ProcessGroup.
//
// Contract:
// - Collectives are issued in the same order on every rank; each gets the next
//   sequence number of this communicator (0, 1, 2, ...).
// - Every call returns at once with a Work; the caller blocks only in
//   Work::wait(). The communicator holds the tensors it was given until the
//   collective finished (so a temporary may be passed); their data must not be
//   touched until then.
// - Inputs are `const Tensor&` (all_gather's and reduce_scatter's input, and
//   broadcast's tensor on the root only), so a const tensor or a temporary can be
//   sent; what a collective writes is a `Tensor&`, so a result cannot be dropped
//   by passing a temporary. In place: all_reduce and reduce overwrite `tensor`;
//   broadcast overwrites it on every rank but root (Note [broadcast overloads]).
// - Every collective has a timeout (CommOptions::timeout, default DDP_TIMEOUT_S
//   or 300 s). A rank that died or stopped makes the others fail within it with
//   a CommError naming the op, sequence number, element count and, where the
//   backend knows, the ranks that did not arrive. Never a hang.
// - A size-1 communicator is the identity (LocalCommunicator), so single-process
//   code never asks "am I distributed?".
// - Note [communicator devices]: a communicator is bound to one device, this
//   rank's (CommOptions::device; nccl: its GPU). Every tensor of a collective is
//   checked with accepts(), and one it does not accept fails at once with a
//   DeviceError naming both devices. nccl accepts only its GPU; shm, gloo and mpi
//   accept their device and, when that is a GPU, host (cpu) tensors too, staging
//   CUDA tensors through pinned host memory (Note [host staging]); the local
//   communicator accepts every device. Metadata that code exchanges through a
//   communicator (model fingerprints, counts, orders) is created on device(), so
//   the same code works on every backend.
// - Dtypes f32, bf16, f16, i32, i64 (and u8 for broadcast/all_gather); avg on
//   integer tensors is an error.
#pragma once

#include "runtime/error.h"
#include "runtime/tensor.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace ddp {

enum class ReduceOp { sum, avg, max, min };
std::string_view reduce_op_name(ReduceOp op);

enum class CollectiveKind { all_reduce, broadcast, all_gather, reduce_scatter, reduce, barrier };
std::string_view collective_name(CollectiveKind kind);

// A failed or timed-out collective, with its distributed context.
class CommError : public Error {
 public:
  CommError(std::string message, int rank, std::string op, int64_t sequence, int64_t count)
      : Error(std::move(message)),
        rank_(rank),
        op_(std::move(op)),
        sequence_(sequence),
        count_(count) {}
  int rank() const { return rank_; }
  const std::string& op() const { return op_; }
  int64_t sequence() const { return sequence_; }
  int64_t count() const { return count_; }

 private:
  int rank_;
  std::string op_;
  int64_t sequence_;
  int64_t count_;
};
// The collective did not complete within its timeout.
class CommTimeoutError : public CommError {
  using CommError::CommError;
};

// The handle of one asynchronous collective.
//
// wait() and synchronize(): on the CPU backends (shm, gloo, mpi, local) both
// block the host until the collective finished. On nccl, wait() returns once the
// caller's current stream (of the communicator's device) is ordered after the
// collective: work queued on that stream afterwards sees the result, but the host
// is not blocked (PyTorch's WorkNCCL::wait); synchronize() blocks the host. The
// nccl watchdog enforces the timeout of every collective from its launch and
// aborts the communicator on a timeout or NCCL error; that error is thrown by
// the next wait(), synchronize() or collective (Note [nccl watchdog] in
// nccl_communicator.cpp).
class Work {
 public:
  virtual ~Work() = default;
  // Returns once the collective's result can be used (see above), or throws its
  // CommError. A timeout of zero means the communicator's timeout; on nccl a
  // non-zero timeout, or a barrier, makes wait() block the host like synchronize().
  // A CommTimeoutError after a non-zero timeout shorter than the communicator's
  // leaves the collective running (a later wait may still see it complete); the
  // communicator's own timeout fails it, and the communicator with it.
  // Waiting again returns (or throws) again.
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
  // Blocks the host until the collective finished, or throws its CommError (a
  // CommTimeoutError after `timeout`; zero: the communicator's timeout).
  virtual void synchronize(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    wait(timeout);
  }
  // True once finished (successfully or not); never blocks.
  virtual bool done() const = 0;
  virtual int64_t sequence() const = 0;
  // Once done(): how long the backend ran the collective (from its start on the
  // communication thread or stream to its end; queueing excluded). nullopt where
  // the backend does not measure it. Benchmarks use it to tell hidden from
  // exposed communication.
  virtual std::optional<std::chrono::nanoseconds> duration() const { return std::nullopt; }
};

struct CommOptions {
  std::chrono::milliseconds timeout{300000};
  Device device = Device::cpu();  // this rank's device (Note [communicator devices])
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "shm", "gloo", "mpi", "nccl"
  // Note [communicator devices]: the device this rank's collectives are bound to,
  // where metadata tensors for a collective belong; and whether tensors on
  // `device` are taken.
  virtual Device device() const = 0;
  virtual bool accepts(const Device& device) const = 0;

  virtual std::shared_ptr<Work> all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::sum) = 0;
  // Note [broadcast overloads]: every rank calls broadcast with the same root.
  // - broadcast(Tensor&): the one to call on every rank. Root's tensor is read;
  //   every other rank's tensor receives root's data.
  // - broadcast(const Tensor&): sending only, so valid only on the root, where
  //   a const tensor or a temporary (`t.to(dev)`, `t.clone()`) can be sent.
  //   On any other rank it is a ValueError naming the rank and the root: there
  //   it would receive root's data into a tensor the caller cannot see (a
  //   temporary) or did not mean to change, and the data would be lost.
  // Root-only code that has a const tensor calls the const overload on the root
  // and the Tensor& one with its receiving tensor elsewhere.
  virtual std::shared_ptr<Work> broadcast(Tensor& tensor, int root) = 0;
  virtual std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) = 0;
  // output holds size() * input.numel() elements: rank r's input at [r * n, (r + 1) * n).
  virtual std::shared_ptr<Work> all_gather(const Tensor& input, Tensor& output) = 0;
  // input holds size() * output.numel() elements; rank r gets the reduction of block r.
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output,
                                               ReduceOp op = ReduceOp::sum) = 0;
  // The reduction lands in `tensor` on `root`; other ranks' tensors are left unspecified.
  virtual std::shared_ptr<Work> reduce(Tensor& tensor, int root, ReduceOp op = ReduceOp::sum) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // Sequence number the next collective will get.
  virtual int64_t next_sequence() const = 0;
  virtual const CommOptions& options() const = 0;
};

// The identity communicator of world size 1.
std::shared_ptr<Communicator> make_local_communicator(CommOptions options = {});

}  // namespace ddp
