// GPU times on the host's timeline: a clock that maps CUDA events to steady_clock
// nanoseconds, and the phases of a step as the device ran them.
//
// Note [gpu clock]
// A CUDA event's time is the GPU's; the timeline's is the host's steady clock. A
// GpuClock keeps anchors: an event recorded on an idle stream of its own and
// waited for, whose host time is the middle of [just before the record, just
// after the wait] (the event passed in between; the half width is its error).
// An event's host time is the anchor's plus elapsed_ms(anchor, event), from the
// newest anchor made before the event was recorded (so the elapsed time is never
// negative). cudaEventElapsedTime returns float milliseconds, whose resolution
// falls with the distance (about 1 us at 10 s), so a new anchor is made when the
// newest is older than kAnchorAge. On a CPU device events record the host clock
// and the same code maps them exactly (what the unit tests use).
//
// Note [device spans]
// On CUDA the host's spans of a step (forward, backward, ...) time the launches,
// not the work. DeviceSpans records an event on the current stream at each phase
// boundary and, once the device passed both ends of a phase, records it as a
// complete span on the track "<device> compute stream" (category "gpu"), mapped by
// the GpuClock. Pending phases are looked at (never waited for) at each boundary
// and when the trace is written.
#pragma once

#include "runtime/device.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ddp::trace {

class GpuClock {
 public:
  static constexpr int64_t kAnchorAge = 5'000'000'000;  // ns
  explicit GpuClock(const Device& device);
  GpuClock(const GpuClock&) = delete;
  GpuClock& operator=(const GpuClock&) = delete;

  // The host time at which `event` passed on the device. It must have been
  // recorded after host time `recorded_after_ns` and must have passed (query()).
  int64_t host_ns(const Event& event, int64_t recorded_after_ns);
  int64_t error_ns() const;  // the newest anchor's
  size_t anchors() const;

 private:
  struct Anchor {
    std::unique_ptr<Event> event;
    int64_t host_ns = 0;
    int64_t error_ns = 0;
  };
  void add_anchor_locked();

  Device device_;
  Stream stream_;
  mutable std::mutex mutex_;
  std::deque<Anchor> anchors_;  // oldest first; at most kMaxAnchors
};

// One clock per device, made on first use (the calling thread's device must
// allow recording on it: the CUDA calls name the device).
GpuClock& gpu_clock(const Device& device);

class DeviceSpans {
 public:
  explicit DeviceSpans(const Device& device);
  // Ends the open phase (if any) and begins `name` ("" begins none) at an event
  // recorded now on the current stream.
  void boundary(std::string_view name, Args args = {});
  // Records the phases the device has finished; with wait, waits for them all.
  void poll(bool wait = false);
  size_t pending() const;

 private:
  struct Phase {
    std::string name;
    std::vector<Arg> args;
    std::shared_ptr<Event> start, end;
    int64_t start_recorded_ns = 0, end_recorded_ns = 0;
  };
  Device device_;
  Track track_;
  mutable std::mutex mutex_;
  std::deque<Phase> pending_;  // ended, not yet finished on the device
  std::optional<Phase> open_;
};

// The device's spans (Note [device spans]); only for CUDA devices in Phases.
DeviceSpans& device_spans(const Device& device);
// Records every finished device phase of every device (before a write).
void poll_device_spans();

}  // namespace ddp::trace
