// The decisions of the nccl backend's watchdog (Note [nccl watchdog] in
// nccl_communicator.cpp), apart from its thread, CUDA and NCCL, so that they are
// unit-tested on any machine: which collectives are in flight and until when,
// which finished (their tensors are released then), the first failure (it
// wins: every later question gets that error), and what is done about it
// (abort the communicator, or tear the process down).
//
// Thread-safe: the caller's thread starts collectives and asks for states, the
// watchdog thread calls tick(). The Backend's functions run under the internal
// lock (now() also from start()), except tell (Note [watchdog notices]).
#pragma once

#include "collectives/collective_events.h"
#include "collectives/communicator.h"

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

class NcclWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  struct Entry {
    int64_t sequence = 0;
    std::string description;  // Collective::describe()
    int64_t count = 0;
    std::chrono::milliseconds timeout{0};
    // Its tensors: released once the collective finished, by tick() after it
    // unlocked (on the watchdog's thread), never by a notice.
    std::shared_ptr<void> keep_alive;
    // What its moments are told with (events, the collective's description).
    std::shared_ptr<const void> subject;
  };

  // A moment of one collective, to tell (Note [nccl events] in nccl_communicator.cpp).
  struct Notice {
    int64_t sequence = 0;
    std::shared_ptr<const void> subject;  // the Entry's
    CollectiveState moment = CollectiveState::started;
  };

  struct Backend {
    std::function<Clock::time_point()> now;
    // Has the collective finished on the device (its end event passed)? May throw
    // (a CUDA error): that is a failure of the collective.
    std::function<bool(const Entry& entry)> finished;
    // NCCL's asynchronous error (ncclCommGetAsyncError) in words; "" when none.
    std::function<std::string()> async_error;
    // Aborts the communicator (ncclCommAbort). False when it cannot be done right
    // now (a launch holds the communicator): tick() tries again.
    std::function<bool()> abort;
    // Logs the failure and ends the process (DDP_NCCL_ASYNC_ERROR_HANDLING=1). Null:
    // never (the default: the error is recorded and the communicator aborted).
    std::function<void(const std::string& message)> tear_down;
    // Has the collective begun on the device (its start event passed)? Null, or
    // false: `started` is told with its completion. Errors count as false.
    std::function<bool(const Entry& entry)> started = nullptr;
    // Told each collective's moments (Note [nccl events] in nccl_communicator.cpp)
    // in order, holding no lock (Note [watchdog notices]): started once, then
    // completed or failed once. May call back into the watchdog. Null: nothing is
    // told.
    std::function<void(const Notice& notice)> tell = nullptr;
    // --on-failure continue: why the group went on without a member of this
    // communicator (a newer membership, Note [elastic membership] in
    // collectives/elastic.h), "" while it has not. Asked only while collectives are
    // in flight: a member is gone, so they fail (and the communicator is aborted)
    // at once, not at their deadline, and the rank regroups (Note [nccl regroup]).
    // Null: never.
    std::function<std::string()> abandoned = nullptr;
  };

  enum class State { in_flight, finished, failed };

  NcclWatchdog(int rank, Backend backend);

  // A collective was launched now; it must finish by now + entry.timeout.
  // Sequences increase. Throws the first error if the communicator has failed.
  void start(Entry entry);

  // One round: forgets the collectives that finished, in order (releasing their
  // keep_alive outside the lock), then fails on a CUDA error of the oldest one,
  // NCCL's asynchronous error, a departure (Backend::abandoned) or the first
  // passed deadline. Returns the message
  // of a failure found in this round (the caller logs it), else nullopt; with a
  // collective in flight, Backend::abandoned fails it too (Note [nccl regroup]). Tells
  // the moments it saw (Backend::tell): started as the oldest collective's start
  // passed, completed as it finished, failed for every collective in flight when
  // the communicator failed.
  std::optional<std::string> tick();

  // A host waiter gave up on `sequence` after `waited` (Work::synchronize with a
  // timeout): the same as its deadline passing now. No-op once it finished or
  // after an earlier failure. Returns the message when it failed it.
  std::optional<std::string> time_out(int64_t sequence, std::chrono::milliseconds waited);

  // A failure found outside tick() (a launch that NCCL refused): recorded as the
  // first error unless there is one, then handled like the others. Returns its
  // message when it became the first error.
  std::optional<std::string> fail(std::exception_ptr error);

  // in_flight until the watchdog saw it finish; failed when it was in flight (or
  // not yet started) when the communicator failed.
  State state(int64_t sequence) const;
  std::exception_ptr error() const;  // the first failure; null while none
  // Nothing left to watch: no collective in flight (or the communicator failed and
  // was aborted, so nothing more will be decided) and no abort pending.
  bool idle() const;

 private:
  // `abandoned`: Backend::abandoned's answer, asked before the lock ("": none).
  std::optional<std::string> tick_locked(std::vector<std::shared_ptr<void>>& released,
                                         const std::string& abandoned);
  std::optional<std::string> fail_locked(std::exception_ptr error);
  // Tells the notices gathered so far unless another thread is telling (Note
  // [watchdog notices]); returns with `lock` held.
  void tell_unlocked(std::unique_lock<std::mutex>& lock);
  void notice_locked(const Entry& entry, CollectiveState moment);
  void try_abort_locked();
  std::exception_ptr timeout_error(const Entry& e, std::chrono::milliseconds after) const;
  std::exception_ptr failure(const Entry& e, const std::string& why) const;

  const int rank_;
  const Backend backend_;
  mutable std::mutex mutex_;
  struct InFlight {
    Entry entry;
    Clock::time_point deadline;
    bool told_started = false;
    bool told_failed = false;
  };
  std::deque<InFlight> in_flight_;  // in sequence order
  int64_t next_sequence_ = 0;       // one past the last started
  std::exception_ptr error_;
  int64_t failed_from_ = 0;  // with error_: collectives from this sequence on failed
  bool abort_pending_ = false;
  bool aborted_ = false;
  std::vector<Notice> notices_;  // to tell, in order
  bool telling_ = false;         // a thread is telling notices_ (guarded by mutex_)
};

// DDP_NCCL_ASYNC_ERROR_HANDLING: false for 0 or unset (record and abort), true for
// 1 (also end the process); any other value is a ValueError naming the valid ones.
bool nccl_tear_down_on_error();

}  // namespace ddp
