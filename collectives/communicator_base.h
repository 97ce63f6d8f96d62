// The one validated path every backend's collectives go through
// (Note [collective path]): the public calls check their tensors, take the next
// sequence number and describe the collective; the backend then runs it.
//
// ThreadedCommunicator runs a backend's blocking `run()` on one communication
// thread, in issue order, so the caller is blocked only in Work::wait() and DDP's
// backward overlaps the all-reduces. Note [waiter runs it]: a thread that waits
// for a collective the communication thread has not started yet runs it (and
// any collectives queued before it) itself, one at a time and in issue order,
// which saves two thread hand-offs exactly where the caller blocks anyway (DDP's
// last bucket, small collectives). The backend's own timeout then applies, so a
// wait given a shorter timeout does not run it (it waits that long at most). Tensors
// that are not host memory (CUDA tensors) are staged through pinned host buffers
// (Note [host staging]); the communication thread makes the communicator's device
// current when it starts, so a rank's CUDA work stays on its GPU. After the first failure
// the communicator is broken: every later collective fails at once with the first error, as NCCL's
// aborted communicators do.
#pragma once

#include "collectives/collective_events.h"
#include "collectives/communicator.h"
#include "collectives/work.h"
#include "runtime/stream.h"

#include <deque>
#include <string_view>
#include <thread>

namespace ddp {

namespace comm {
struct HostStaging;
}

struct Collective {
  CollectiveKind kind = CollectiveKind::barrier;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  int64_t sequence = 0;
  Tensor input;  // all_reduce, broadcast, reduce: input and output are the same tensor
  Tensor output;
  // Set when input/output are host buffers standing in for the caller's tensors
  // (Note [host staging] in collectives/host_staging.h).
  std::shared_ptr<const comm::HostStaging> staging;
  std::string label;  // Note [collective labels]
  int64_t count() const { return input.defined() ? input.numel() : 0; }
  DType dtype() const { return input.defined() ? input.dtype() : DType::u8; }
  // "all_reduce(sum) #12 of 1024 f32", "broadcast(root 0) #3 of 10 i64", "barrier #7"
  std::string describe() const;
};

// A CommOptions::timeout of at least 1 ms (ValueError naming `backend` and the value
// otherwise); factories call it before they connect, CommunicatorBase again.
void check_comm_options(const CommOptions& options, std::string_view backend);

class CommunicatorBase : public Communicator {
 public:
  CommunicatorBase(int rank, int size, CommOptions options);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return options_.device; }
  // Default: the bound device, and host tensors when bound to a GPU (the host
  // staging backends); nccl and local override it.
  bool accepts(const Device& device) const override;
  int64_t next_sequence() const override { return next_sequence_; }
  const CommOptions& options() const override { return options_; }
  // This process's number for the communicator (Note [collective events]).
  int comm_id() const { return comm_id_; }

  std::shared_ptr<Work> all_reduce(Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, int root) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override;
  std::shared_ptr<Work> all_gather(const Tensor& input, Tensor& output) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) override;
  std::shared_ptr<Work> reduce(Tensor& tensor, int root, ReduceOp op) override;
  std::shared_ptr<Work> barrier() override;

 protected:
  // Runs (or starts) one validated collective. Its `enqueued` event was sent;
  // the backend sends the others (Note [collective events]).
  virtual std::shared_ptr<Work> submit(Collective collective) = 0;
  // The collective as observers see it.
  CollectiveInfo info_of(const Collective& c) const;

 private:
  void check_tensor(const char* op, const Tensor& t, bool allow_u8) const;
  std::shared_ptr<Work> start(Collective c);
  std::shared_ptr<Work> start_broadcast(const Tensor& tensor, int root, bool root_only);

  int rank_;
  int size_;
  CommOptions options_;
  int comm_id_;
  int64_t next_sequence_ = 0;
};

// DDP_DEBUG=detail, in any case (off, info or detail, as TORCH_DISTRIBUTED_DEBUG);
// another value is a ValueError naming it.
bool debug_detail();

class ThreadedCommunicator : public CommunicatorBase {
 public:
  ThreadedCommunicator(int rank, int size, CommOptions options);
  ~ThreadedCommunicator() override;

 protected:
  // Starts the communication thread; call at the end of the backend's constructor.
  void start_thread();
  // Stops it (pending collectives fail); call first in the backend's destructor.
  void stop_thread();
  // Runs one collective to completion on the communication thread. Must give up
  // within options().timeout and throw CommError (or CommTimeoutError).
  virtual void run(const Collective& collective) = 0;
  std::shared_ptr<Work> submit(Collective collective) override;

  // Throws a CommError for `c` with this rank and the message.
  [[noreturn]] void fail(const Collective& c, const std::string& message) const;
  [[noreturn]] void fail_timeout(const Collective& c, const std::string& message) const;

 private:
  struct Task {
    Collective collective;
    std::shared_ptr<ThreadWork> work;
  };
  // The queue, shared with the Works' waiters (they hold it weakly: a Work may
  // outlive its communicator).
  struct Queue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<Task> tasks;
    bool stopping = false;
    bool running = false;  // a thread is inside run(): others must not start one
    std::exception_ptr broken;
  };
  void loop();
  // Note [waiter runs it]: runs queued collectives on the calling thread, from the
  // front, until `work` is done or another thread is running one.
  void run_queued_until(Queue& q, const ThreadWork& work);
  // Runs one claimed task (q.running is set) and releases the claim.
  void execute(Queue& q, Task& task);
  void check_fingerprints(const Collective& c);
  const Stream& staging_stream(const Collective& c);

  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  Stream staging_stream_;  // made on first use by whichever thread runs a collective
  bool debug_ = false;
  std::thread thread_;
};

}  // namespace ddp
