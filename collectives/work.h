// Work objects for backends that complete collectives on a thread of their own
// (shm, gloo, mpi) or immediately (local).
#pragma once

#include "collectives/collective_events.h"
#include "collectives/communicator.h"

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>

namespace ddp {

// Completed by the backend with finish() or fail(); wait() enforces the timeout.
class ThreadWork : public Work {
 public:
  // Sends wait_begin/wait_end for `info` around every blocking wait (Note
  // [collective events]).
  ThreadWork(CollectiveInfo info, std::string description,
             std::chrono::milliseconds default_timeout);
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  bool done() const override;
  int64_t sequence() const override { return info_.sequence; }
  const CollectiveInfo& info() const { return info_; }
  std::optional<std::chrono::nanoseconds> duration() const override;
  void start();  // the backend begins running it (for duration())
  // Called by wait() before blocking, with run_here = false when the wait has a timeout
  // of its own (shorter than the backend's): the communicator may run the collective
  // on the waiting thread, or else must see that its own thread runs it (Note [waiter
  // runs it] in communicator_base.h).
  using Helper = std::function<void(const ThreadWork&, bool run_here)>;
  void set_helper(Helper helper);
  void finish();
  void fail(std::exception_ptr error);
  const std::string& description() const { return description_; }

 private:
  CollectiveInfo info_;
  std::string description_;
  std::chrono::milliseconds default_timeout_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::chrono::steady_clock::time_point started_{}, finished_{};
  Helper helper_;  // set once, before the Work is returned
};

// A Work that is already complete (or failed) when returned.
std::shared_ptr<Work> completed_work(int64_t sequence, std::exception_ptr error = nullptr);

}  // namespace ddp
