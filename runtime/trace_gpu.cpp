#include "runtime/trace_gpu.h"

#include <fmt/format.h>

#include <cmath>
#include <map>

namespace ddp::trace {
namespace {

constexpr size_t kMaxAnchors = 8;

}  // namespace

GpuClock::GpuClock(const Device& device) : device_(device), stream_(Stream::create(device)) {
  std::lock_guard<std::mutex> lock(mutex_);
  add_anchor_locked();
}

// Note [gpu clock]: the anchor passes between `before` and `after` (its stream is idle).
void GpuClock::add_anchor_locked() {
  auto event = std::make_unique<Event>(device_, true);
  const int64_t before = now_ns();
  event->record(stream_);
  event->synchronize();
  const int64_t after = now_ns();
  anchors_.push_back({std::move(event), before + (after - before) / 2, (after - before + 1) / 2});
  if (anchors_.size() > kMaxAnchors) anchors_.pop_front();
}

int64_t GpuClock::host_ns(const Event& event, int64_t recorded_after_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (now_ns() - anchors_.back().host_ns > kAnchorAge) add_anchor_locked();
  // The newest anchor that surely passed before the event was recorded.
  const Anchor* anchor = &anchors_.front();
  for (const Anchor& a : anchors_) {
    if (a.host_ns + a.error_ns <= recorded_after_ns) anchor = &a;
  }
  const double ms = anchor->event->elapsed_ms(event);
  return anchor->host_ns + std::llround(ms * 1e6);
}

int64_t GpuClock::error_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return anchors_.back().error_ns;
}

size_t GpuClock::anchors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return anchors_.size();
}

namespace {

struct Clocks {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::unique_ptr<GpuClock>> clocks;
  std::map<std::pair<int, int>, std::unique_ptr<DeviceSpans>> spans;
};

Clocks& clocks() {
  static auto* c = new Clocks();  // never destroyed: the trace is written at exit
  return *c;
}

std::pair<int, int> key(const Device& d) {
  return {static_cast<int>(d.type), d.index};
}

}  // namespace

GpuClock& gpu_clock(const Device& device) {
  Clocks& c = clocks();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto& clock = c.clocks[key(device)];
  if (!clock) clock = std::make_unique<GpuClock>(device);
  return *clock;
}

DeviceSpans::DeviceSpans(const Device& device)
    : device_(device), track_(stream_track(fmt::format("{} compute stream", device.str()))) {
  gpu_clock(device);  // the first anchor precedes every phase
}

void DeviceSpans::boundary(std::string_view name, Args args) {
  auto event = std::make_shared<Event>(device_, true);
  const int64_t recorded = now_ns();
  event->record(current_stream(device_));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_) {
      open_->end = event;
      open_->end_recorded_ns = recorded;
      pending_.push_back(std::move(*open_));
      open_.reset();
    }
    if (!name.empty()) {
      open_ = Phase{std::string(name), std::vector<Arg>(args), event, nullptr, recorded, 0};
    }
  }
  poll(false);
}

void DeviceSpans::poll(bool wait) {
  GpuClock& clock = gpu_clock(device_);
  std::lock_guard<std::mutex> lock(mutex_);
  while (!pending_.empty()) {
    const Phase& p = pending_.front();
    if (wait) p.end->synchronize();
    if (!p.end->query()) return;
    const int64_t start = clock.host_ns(*p.start, p.start_recorded_ns);
    const int64_t end = clock.host_ns(*p.end, p.end_recorded_ns);
    complete(p.name, "gpu", start, end - start, p.args, track_);
    pending_.pop_front();
  }
}

size_t DeviceSpans::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

DeviceSpans& device_spans(const Device& device) {
  {
    Clocks& c = clocks();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (auto it = c.spans.find(key(device)); it != c.spans.end()) return *it->second;
  }
  auto spans = std::make_unique<DeviceSpans>(device);  // outside the lock: it makes a clock
  Clocks& c = clocks();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto& slot = c.spans[key(device)];
  if (!slot) slot = std::move(spans);
  return *slot;
}

void poll_device_spans() {
  std::vector<DeviceSpans*> all;
  {
    Clocks& c = clocks();
    std::lock_guard<std::mutex> lock(c.mutex);
    for (auto& [k, s] : c.spans) all.push_back(s.get());
  }
  for (DeviceSpans* s : all) {
    try {
      s->poll(false);
    } catch (...) {
      // A CUDA error at exit: the device phases not yet recorded are lost.
    }
  }
}

namespace detail {

DeviceSpans* device_spans_for(const Device& device) noexcept {
  try {
    return &device_spans(device);
  } catch (...) {
    return nullptr;  // no device timing: the host spans stay
  }
}

void device_boundary(DeviceSpans* spans, std::string_view name, Args args) noexcept {
  try {
    spans->boundary(name, args);
  } catch (...) {
    // A CUDA error: this phase is not timed on the device; the next call reports the error.
  }
}

}  // namespace detail
}  // namespace ddp::trace
