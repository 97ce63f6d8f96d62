#include "collectives/nccl_watchdog.h"

#include "runtime/env.h"
#include "runtime/error.h"

#include <utility>
#include <vector>

namespace ddp {
namespace {

using Released = std::vector<std::shared_ptr<void>>;

double seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

}  // namespace

NcclWatchdog::NcclWatchdog(int rank, Backend backend) : rank_(rank), backend_(std::move(backend)) {
  DDP_ASSERT(backend_.now && backend_.finished && backend_.async_error && backend_.abort,
             "NcclWatchdog: now, finished, async_error and abort are required");
}

void NcclWatchdog::start(Entry entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  DDP_ASSERT(entry.sequence >= next_sequence_, "NcclWatchdog: sequence {} after {}", entry.sequence,
             next_sequence_ - 1);
  next_sequence_ = entry.sequence + 1;
  const Clock::time_point deadline = backend_.now() + entry.timeout;
  in_flight_.push_back({std::move(entry), deadline});
}

std::optional<std::string> NcclWatchdog::tick() {
  // Note [nccl regroup]: the departure check reads the store, so it runs holding
  // no lock (a slow store must not hold up the launches), and only while
  // collectives are in flight.
  std::string abandoned;
  if (backend_.abandoned) {
    bool busy = false;
    {
      std::lock_guard<std::mutex> peek(mutex_);
      busy = !error_ && !in_flight_.empty();
    }
    try {
      if (busy) abandoned = backend_.abandoned();
    } catch (const std::exception&) {
      // The store did not answer: asked again at the next tick.
    }
  }
  Released released;  // destroyed after the lock is released: freeing tensors takes time
  std::unique_lock<std::mutex> lock(mutex_);
  std::optional<std::string> news = tick_locked(released, abandoned);
  tell_unlocked(lock);
  return news;
}

std::optional<std::string> NcclWatchdog::tick_locked(std::vector<std::shared_ptr<void>>& released,
                                                     const std::string& abandoned) {
  try_abort_locked();
  std::optional<std::string> news;
  // Collectives start and finish in order (one NCCL stream): stop at the first
  // that has not finished.
  while (!in_flight_.empty()) {
    InFlight& f = in_flight_.front();
    if (!f.told_started && !f.told_failed && backend_.tell && backend_.started) {
      bool began = false;
      try {
        began = backend_.started(f.entry);
      } catch (...) {
        // Not known to have started: told with its end.
      }
      if (began) {
        f.told_started = true;
        notice_locked(f.entry, CollectiveState::started);
      }
    }
    bool finished = false;
    try {
      finished = backend_.finished(f.entry);
    } catch (const std::exception& e) {
      const std::string why = fmt::format("CUDA reported an error: {}", e.what());
      news = fail_locked(failure(f.entry, why));
      break;
    }
    if (!finished) break;
    if (!f.told_started && !f.told_failed) notice_locked(f.entry, CollectiveState::started);
    // The end event also passes when an abort ended the kernels: the error decides.
    const bool failed = error_ && f.entry.sequence >= failed_from_;
    if (!f.told_failed)
      notice_locked(f.entry, failed ? CollectiveState::failed : CollectiveState::completed);
    released.push_back(std::move(f.entry.keep_alive));
    in_flight_.pop_front();
  }
  if (error_ || in_flight_.empty()) return news;

  const Entry& oldest = in_flight_.front().entry;
  std::string async;
  try {
    async = backend_.async_error();
  } catch (const std::exception& e) {
    async = e.what();
  }
  if (!async.empty()) {
    const std::string why = fmt::format("NCCL reported an asynchronous error: {}", async);
    return fail_locked(failure(oldest, why));
  }
  if (!abandoned.empty()) return fail_locked(failure(oldest, abandoned));
  const Clock::time_point now = backend_.now();
  for (const InFlight& f : in_flight_) {
    if (now >= f.deadline) return fail_locked(timeout_error(f.entry, f.entry.timeout));
  }
  return std::nullopt;
}

std::optional<std::string> NcclWatchdog::time_out(int64_t sequence,
                                                  std::chrono::milliseconds waited) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (error_) return std::nullopt;
  std::optional<std::string> news;
  for (const InFlight& f : in_flight_) {
    if (f.entry.sequence == sequence) {
      news = fail_locked(timeout_error(f.entry, waited));
      break;
    }
  }
  tell_unlocked(lock);
  return news;  // nullopt: it finished (or was never started here)
}

std::optional<std::string> NcclWatchdog::fail(std::exception_ptr error) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::optional<std::string> news = fail_locked(std::move(error));
  tell_unlocked(lock);
  return news;
}

void NcclWatchdog::notice_locked(const Entry& entry, CollectiveState moment) {
  if (backend_.tell) notices_.push_back({entry.sequence, entry.subject, moment});
}

// Note [watchdog notices]
// Moments are gathered under mutex_ in the order they happen and told by one
// thread at a time, holding no lock: the thread that finds notices and nobody
// telling becomes the teller and tells until none is left; a thread that finds
// a teller busy leaves its notices to it and returns. So no thread ever waits for
// a lock while it holds mutex_, a slow observer (the flight recorder writing its
// dump, a GPU clock) delays only the teller, never the waiters, state() or
// time_out(), and an observer may call back into the watchdog. Notices carry the
// subject only, never the tensors, whose last reference tick() drops.
void NcclWatchdog::tell_unlocked(std::unique_lock<std::mutex>& lock) {
  if (telling_) return;
  telling_ = true;
  while (!notices_.empty()) {
    std::vector<Notice> notices = std::move(notices_);
    notices_.clear();
    lock.unlock();
    for (const Notice& n : notices) {
      try {
        backend_.tell(n);
      } catch (...) {
        // An observer's problem never stops the watchdog.
      }
    }
    notices.clear();  // subjects released without the lock
    lock.lock();
  }
  telling_ = false;
}

// The first failure wins. Collectives still in flight fail with it (their results
// cannot be trusted once the communicator is aborted), and so does every later one.
std::optional<std::string> NcclWatchdog::fail_locked(std::exception_ptr error) {
  if (error_) return std::nullopt;
  error_ = std::move(error);
  failed_from_ = in_flight_.empty() ? next_sequence_ : in_flight_.front().entry.sequence;
  for (InFlight& f : in_flight_) {  // every collective in flight fails with it
    f.told_failed = true;
    notice_locked(f.entry, CollectiveState::failed);
  }
  std::string text = "unknown error";
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    text = e.what();
  }
  if (backend_.tear_down) backend_.tear_down(text);  // logs and ends the process
  abort_pending_ = true;
  try_abort_locked();
  return text;
}

void NcclWatchdog::try_abort_locked() {
  if (!abort_pending_) return;
  bool done = true;
  try {
    done = backend_.abort();
  } catch (...) {
    // An abort that failed leaves nothing to retry: the communicator is unusable either way.
  }
  if (done) {
    abort_pending_ = false;
    aborted_ = true;
  }
}

NcclWatchdog::State NcclWatchdog::state(int64_t sequence) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_ && sequence >= failed_from_) return State::failed;
  if (sequence >= next_sequence_) return State::in_flight;  // not started yet
  if (!in_flight_.empty() && sequence >= in_flight_.front().entry.sequence) {
    return State::in_flight;
  }
  return State::finished;
}

std::exception_ptr NcclWatchdog::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

bool NcclWatchdog::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (abort_pending_) return false;
  return in_flight_.empty() || aborted_;
}

std::exception_ptr NcclWatchdog::timeout_error(const Entry& e,
                                               std::chrono::milliseconds after) const {
  return std::make_exception_ptr(CommTimeoutError(
      fmt::format("rank {}: {} timed out after {:.1f} s on the nccl backend: its kernels did not "
                  "finish, so a rank stopped, died or issued a different collective. The "
                  "communicator was aborted (ncclCommAbort); NCCL_DEBUG=INFO shows NCCL's view",
                  rank_, e.description, seconds(after)),
      rank_, e.description, e.sequence, e.count));
}

std::exception_ptr NcclWatchdog::failure(const Entry& e, const std::string& why) const {
  return std::make_exception_ptr(
      CommError(fmt::format("rank {}: {} failed on the nccl backend: {}. The communicator was "
                            "aborted (ncclCommAbort); NCCL_DEBUG=INFO tells more",
                            rank_, e.description, why),
                rank_, e.description, e.sequence, e.count));
}

bool nccl_tear_down_on_error() {
  const std::optional<std::string> value = env::get(env::kNcclAsyncErrorHandling);
  if (!value || *value == "0") return false;
  DDP_CHECK(*value == "1",
            "{}='{}' is not valid: 0 records a failed nccl collective and aborts the communicator "
            "(the default), 1 also ends the process",
            env::kNcclAsyncErrorHandling, *value);
  return true;
}

}  // namespace ddp
