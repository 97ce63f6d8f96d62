#include "collectives/work.h"

namespace ddp {

ThreadWork::ThreadWork(CollectiveInfo info, std::string description,
                       std::chrono::milliseconds default_timeout)
    : info_(std::move(info)),
      description_(std::move(description)),
      default_timeout_(default_timeout) {}

void ThreadWork::set_helper(Helper helper) {
  helper_ = std::move(helper);
}

void ThreadWork::wait(std::chrono::milliseconds timeout) {
  // Note [waiter runs it] (communicator_base.h) runs a collective under the backend's
  // timeout: a wait given a shorter one leaves the collective to the communication
  // thread and waits only that long, as its contract says (torch's work.wait(timeout)).
  const bool own_timeout = timeout.count() > 0 && timeout < default_timeout_;
  if (timeout.count() <= 0) timeout = default_timeout_;
  // The moments of blocking (Note [collective events]); a wait on a finished
  // collective blocks nothing and is not told.
  struct WaitEvents {
    const CollectiveInfo* info = nullptr;
    ~WaitEvents() {
      if (info != nullptr) notify_collective(*info, CollectiveState::wait_end);
    }
  } events;
  if (collective_observers_present() && !done()) {
    events.info = &info_;
    notify_collective(info_, CollectiveState::wait_begin);
  }
  if (helper_) helper_(*this, /*run_here=*/!own_timeout);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [this] { return done_; })) {
    lock.unlock();
    notify_collective(info_, CollectiveState::timed_out);
    throw CommTimeoutError(
        fmt::format("rank {}: {} did not complete within {:.1f} s (Work::wait timeout). A rank may "
                    "have died, stopped or issued a different collective; set DDP_DEBUG=detail to "
                    "compare collectives across ranks, or raise DDP_TIMEOUT_S.",
                    info_.rank, description_, static_cast<double>(timeout.count()) / 1000.0),
        info_.rank, description_, info_.sequence, info_.count);
  }
  if (error_) std::rethrow_exception(error_);
}

bool ThreadWork::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void ThreadWork::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  started_ = std::chrono::steady_clock::now();
}

std::optional<std::chrono::nanoseconds> ThreadWork::duration() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_ || error_ || started_ == std::chrono::steady_clock::time_point{}) return std::nullopt;
  return finished_ - started_;
}

void ThreadWork::finish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = std::chrono::steady_clock::now();
    done_ = true;
  }
  cv_.notify_all();
}

void ThreadWork::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

namespace {

class CompletedWork : public Work {
 public:
  CompletedWork(int64_t sequence, std::exception_ptr error)
      : sequence_(sequence), error_(std::move(error)) {}
  void wait(std::chrono::milliseconds) override {
    if (error_) std::rethrow_exception(error_);
  }
  bool done() const override { return true; }
  int64_t sequence() const override { return sequence_; }

 private:
  int64_t sequence_;
  std::exception_ptr error_;
};

}  // namespace

std::shared_ptr<Work> completed_work(int64_t sequence, std::exception_ptr error) {
  return std::make_shared<CompletedWork>(sequence, std::move(error));
}

}  // namespace ddp
