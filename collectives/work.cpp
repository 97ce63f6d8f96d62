#include "collectives/work.h"

namespace ddp {

ThreadWork::ThreadWork(int64_t sequence, std::string description, int rank, int64_t count,
                       std::chrono::milliseconds default_timeout)
    : sequence_(sequence),
      description_(std::move(description)),
      rank_(rank),
      count_(count),
      default_timeout_(default_timeout) {}

void ThreadWork::set_helper(std::function<void(const ThreadWork&)> helper) {
  helper_ = std::move(helper);
}

void ThreadWork::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = default_timeout_;
  if (helper_) helper_(*this);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [this] { return done_; })) {
    throw CommTimeoutError(
        fmt::format("rank {}: {} did not complete within {:.1f} s (Work::wait timeout). A rank may "
                    "have died, stopped or issued a different collective; set DDP_DEBUG=detail to "
                    "compare collectives across ranks, or raise DDP_TIMEOUT_S.",
                    rank_, description_, static_cast<double>(timeout.count()) / 1000.0),
        rank_, description_, sequence_, count_);
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
