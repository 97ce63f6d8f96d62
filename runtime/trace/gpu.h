// GPU times on the host's timeline: a clock that maps CUDA events to steady_clock
// nanoseconds, and the phases of a step as the device ran them.
//
// Note [gpu clock]
// A CUDA event's time is the GPU's; the timeline's is the host's steady clock. A
// GpuClock keeps anchors: an event recorded on an idle stream of its own whose
// host time is the middle of [just before the record, when it was seen passed]
// (the event passed in between; the half width is its error). An event's host
// time is an anchor's plus elapsed_ms(anchor, event), from the newest anchor
// made before the event was recorded. The first anchor is made when the clock
// is (waiting for it, once, on the thread that makes the clock) and kept for the
// clock's life: every event the clock maps was recorded after it, so the elapsed
// time is never negative, however old the event. cudaEventElapsedTime returns
// float milliseconds, whose resolution falls with the distance (about 1 us at
// 10 s), and the two clocks drift apart, so a new anchor is begun when the
// newest is older than kAnchorAge; the newest kMaxAnchors are kept besides the
// first.
// Mapping never blocks (it runs on the nccl watchdog's thread and the training
// thread): a new anchor's event is recorded and polled with cudaEventQuery for
// at most kAnchorSpinNs, then at each later mapping; it is taken when seen passed
// within kMaxAnchorWindowNs of its record, else dropped and begun again a second
// later (a busy GPU): the older anchors serve meanwhile. On a CPU device events
// record the host clock and the same code maps them exactly (what the unit tests
// use, with a fake host clock and fake queries: GpuClock::Hooks).
//
// Note [device spans]
// On CUDA the host's spans of a step (forward, backward, ...) time the launches,
// not the work. DeviceSpans records an event on the current stream at each phase
// boundary and, once the device passed both ends of a phase, records it as a
// complete span on the track "<device> compute stream" (category "gpu"), mapped by
// the GpuClock. Pending phases are looked at (never waited for) at each boundary
// and when the trace is written. Events come from a small pool (a step has about
// six boundaries), and each thread has its own DeviceSpans per device (a second
// thread's track is "<device> compute stream (thread <tid>)"), so threads that
// use Phases on one device do not end each other's phases.
#pragma once

#include "runtime/device.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ddp::trace {

class GpuClock {
 public:
  static constexpr int64_t kAnchorAge = 5'000'000'000;      // ns: then a new anchor is begun
  static constexpr int64_t kAnchorSpinNs = 50'000;          // polled at once for so long
  static constexpr int64_t kMaxAnchorWindowNs = 200'000;    // seen passing later: dropped
  static constexpr int64_t kAnchorRetryNs = 1'000'000'000;  // after a dropped one
  static constexpr size_t kMaxAnchors = 8;                  // besides the first

  // The host clock and "has this event passed?" (tests fake them; Note [gpu clock]).
  struct Hooks {
    std::function<int64_t()> now;
    std::function<bool(const Event&)> passed;
  };
  // Waits once for the first anchor (on an idle stream of its own).
  explicit GpuClock(const Device& device, Hooks hooks = {});
  GpuClock(const GpuClock&) = delete;
  GpuClock& operator=(const GpuClock&) = delete;

  // The host time at which `event` passed on the device. It must have been
  // recorded after this clock was made, after host time `recorded_after_ns`,
  // and must have passed (query()). Never blocks.
  int64_t host_ns(const Event& event, int64_t recorded_after_ns);
  int64_t error_ns() const;        // the newest anchor's
  int64_t first_error_ns() const;  // the first anchor's (it maps the oldest events)
  size_t anchors() const;
  bool refreshing() const;  // a new anchor is recorded, not yet seen passing

 private:
  struct Anchor {
    std::unique_ptr<Event> event;
    int64_t host_ns = 0;
    int64_t error_ns = 0;
  };
  void refresh_locked();
  bool take_pending_locked();  // true when the pending anchor was decided (taken or dropped)

  Device device_;
  Hooks hooks_;
  Stream stream_;
  mutable std::mutex mutex_;
  std::deque<Anchor> anchors_;      // oldest first: the first, then at most kMaxAnchors
  std::unique_ptr<Event> pending_;  // recorded at pending_before_, not yet seen passing
  int64_t pending_before_ = 0;
  int64_t last_attempt_ = 0;
};

// One clock per device, made on first use (the calling thread's device must
// allow recording on it: the CUDA calls name the device).
GpuClock& gpu_clock(const Device& device);

class DeviceSpans {
 public:
  static constexpr size_t kPooledEvents = 16;
  // `track_name` empty: "<device> compute stream".
  explicit DeviceSpans(const Device& device, std::string track_name = "");
  // Ends the open phase (if any) and begins `name` ("" begins none) at an event
  // recorded now on the current stream.
  void boundary(std::string_view name, Args args = {});
  // Records the phases the device has finished; with wait, waits for them all.
  void poll(bool wait = false);
  size_t pending() const;
  int64_t events_created() const;  // CUDA events made so far (the rest are reused)

 private:
  struct Phase {
    std::string name;
    std::vector<Arg> args;
    std::shared_ptr<Event> start, end;
    int64_t start_recorded_ns = 0, end_recorded_ns = 0;
  };
  std::shared_ptr<Event> take_event_locked();
  void give_back_locked(std::shared_ptr<Event>& event);

  Device device_;
  std::string track_name_;
  Track track_;
  uint64_t track_generation_;  // trace::generation() of track_
  mutable std::mutex mutex_;
  std::deque<Phase> pending_;  // ended, not yet finished on the device
  std::optional<Phase> open_;
  std::vector<std::shared_ptr<Event>> free_;  // recorded before, referenced by no phase
  int64_t events_created_ = 0;
};

// The calling thread's spans on `device` (Note [device spans]); only for CUDA
// devices in Phases.
DeviceSpans& device_spans(const Device& device);
// Records every finished device phase of every device (before a write).
void poll_device_spans();

}  // namespace ddp::trace
