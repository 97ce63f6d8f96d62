// What happens to each collective, told to whoever listens: the flight recorder
// (the last N collectives of this rank, for hang diagnosis), the timeline tracer
// and the straggler accounting all subscribe here, so the backends report each
// moment once, in one shape.
//
// Note [collective events]
// Every collective issued through a Communicator passes through these moments:
//   enqueued      the caller's thread issued it (CommunicatorBase::start), before
//                 the backend saw it; the sequence number is taken here.
//   started       the backend began running it: the communication thread (or a
//                 waiter, Note [waiter runs it]) entered run(); on nccl, the
//                 collective's start event passed on the NCCL stream.
//   completed     it finished successfully; failed: it ended with an error.
//   wait_begin    a thread began to block in Work::wait() or synchronize() on it;
//   timed_out     a wait gave up at its timeout (Work::wait's CommTimeoutError
//                 follows; the collective itself may still complete or fail), or
//                 the backend's own timeout ended the collective (shm, gloo, mpi:
//                 failed follows at once).
//   wait_end      that thread stopped blocking (done, failed or timed out).
// enqueued comes first and completed/failed once; wait_begin/wait_end pairs
// (with timed_out between them when the wait gives up) may come any number of
// times, before or after completion, from any thread; a backend's timeout comes
// just before its failed.
// Observers are called synchronously on the thread where the moment happens (the
// caller's, the communication thread, the nccl watchdog), holding no lock of the
// communicator: they must be thread-safe, must not throw and must be cheap (a
// collective of 4 KiB takes a few microseconds on shm). With no observer the
// cost is one relaxed atomic load per moment.
//
// Times are steady_clock (CLOCK_MONOTONIC) nanoseconds: comparable between the
// processes of one node; a tracer maps them to other nodes' clocks.
//
// Note [collective labels]
// A collective's label says who issued it and why ("ddp bucket 3", "eval
// counts"), so a diagnosis can name it in the user's words. It is taken from the
// issuing thread's innermost CollectiveLabel scope at enqueue time; empty when
// none is open. Labels are short (kMaxLabelBytes; longer ones are cut).
#pragma once

#include "collectives/communicator.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ddp {

enum class CollectiveState : uint8_t {
  enqueued,
  started,
  completed,
  failed,
  wait_begin,
  wait_end,
  timed_out
};
std::string_view collective_state_name(CollectiveState state);

// What identifies and describes one collective; the same for all its moments.
struct CollectiveInfo {
  int comm_id = 0;  // this process's communicators are numbered 0, 1, ... as made
  int rank = 0;
  int world_size = 1;
  std::string_view backend;  // "shm", "gloo", ... (a static string)
  CollectiveKind kind = CollectiveKind::barrier;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  int64_t sequence = 0;
  int64_t count = 0;  // elements of the input (0 for a barrier)
  DType dtype = DType::u8;
  int64_t bytes = 0;    // count x the dtype's size
  std::string label{};  // Note [collective labels]
};

struct CollectiveEvent {
  const CollectiveInfo& info;
  CollectiveState state;
  int64_t time_ns;  // steady_clock
};

class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  virtual void on_collective(const CollectiveEvent& event) noexcept = 0;
};

// Subscribes for every later moment of every communicator of this process. The
// registry holds the observer until it is removed.
void add_collective_observer(std::shared_ptr<CollectiveObserver> observer);
void remove_collective_observer(const CollectiveObserver* observer);

// Tells every observer; for the backends. Cheap when nobody listens.
void notify_collective(const CollectiveInfo& info, CollectiveState state);
void notify_collective(const CollectiveInfo& info, CollectiveState state, int64_t time_ns);
bool collective_observers_present();

int64_t steady_now_ns();

inline constexpr size_t kMaxLabelBytes = 47;

// Labels the collectives this thread issues while it lives (Note [collective
// labels]); scopes nest, the innermost wins. The string must outlive the scope.
class CollectiveLabel {
 public:
  explicit CollectiveLabel(std::string_view label);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  std::string_view previous_;
};

// The innermost label of this thread, or empty.
std::string_view current_collective_label();

// Note [caller runs it]: while a CallerRuns lives on a thread, the collectives
// that thread issues on a backend with a communication thread (shm, gloo, mpi)
// are queued without waking that thread, for a caller that waits for them at
// once: its wait runs them itself (Note [waiter runs it] in
// communicator_base.h; a wait with a shorter timeout than the backend's wakes the
// thread instead). That saves two thread hand-offs, each a futex wake-up
// that, with as many ranks as cores, lands on a core where another rank's
// training thread runs. (A communication thread that is awake anyway may still
// take them first; the waiter then waits.) The caller must wait before it does
// anything that depends on another rank; a collective it never waits for runs
// when the communication thread next wakes (the next collective issued without
// the scope). DDP issues its last bucket so (Note [last bucket on the caller]
// in reducer.cpp). Other backends ignore it.
class CallerRuns {
 public:
  CallerRuns();
  ~CallerRuns();
  CallerRuns(const CallerRuns&) = delete;
  CallerRuns& operator=(const CallerRuns&) = delete;

 private:
  bool previous_;
};

// Whether a CallerRuns lives on this thread.
bool caller_runs();

}  // namespace ddp
