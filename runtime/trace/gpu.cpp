#include "runtime/trace/gpu.h"

#include "runtime/fmt.h"

#include <unistd.h>

#include <cmath>
#include <map>
#include <thread>
#include <tuple>

namespace ddp::trace {

GpuClock::GpuClock(const Device& device, Hooks hooks)
    : device_(device), hooks_(std::move(hooks)), stream_(Stream::create(device)) {
  if (!hooks_.now) hooks_.now = [] { return now_ns(); };
  if (!hooks_.passed) hooks_.passed = [](const Event& e) { return e.query(); };
  // The first anchor (Note [gpu clock]): waited for, once, on an idle stream.
  auto event = std::make_unique<Event>(device_, true);
  const int64_t before = hooks_.now();
  event->record(stream_);
  event->synchronize();
  const int64_t after = hooks_.now();
  std::lock_guard<std::mutex> lock(mutex_);
  anchors_.push_back({std::move(event), before + (after - before) / 2, (after - before + 1) / 2});
  last_attempt_ = after;
}

// A pending anchor seen passing soon enough becomes the newest; one seen too
// late, or not seen within the window, is dropped (Note [gpu clock]).
bool GpuClock::take_pending_locked() {
  bool passed = false;
  try {
    passed = hooks_.passed(*pending_);
  } catch (...) {
    pending_.reset();  // a CUDA error: begun again after kAnchorRetryNs
    throw;
  }
  const int64_t seen = hooks_.now();
  if (passed && seen - pending_before_ <= kMaxAnchorWindowNs) {
    anchors_.push_back({std::move(pending_), pending_before_ + (seen - pending_before_) / 2,
                        (seen - pending_before_ + 1) / 2});
    if (anchors_.size() > kMaxAnchors + 1) anchors_.erase(anchors_.begin() + 1);  // keep the first
    pending_.reset();
    return true;
  }
  if (passed || seen - pending_before_ > kMaxAnchorWindowNs) {
    pending_.reset();  // begun again after kAnchorRetryNs
    return true;
  }
  return false;
}

void GpuClock::refresh_locked() {
  if (pending_) {
    take_pending_locked();
    return;
  }
  const int64_t now = hooks_.now();
  if (now - anchors_.back().host_ns < kAnchorAge || now - last_attempt_ < kAnchorRetryNs) return;
  last_attempt_ = now;
  auto event = std::make_unique<Event>(device_, true);
  const int64_t before = hooks_.now();
  event->record(stream_);  // throws: no anchor is pending
  pending_ = std::move(event);
  pending_before_ = before;
  while (!take_pending_locked() && hooks_.now() - pending_before_ < kAnchorSpinNs) {
  }
}

int64_t GpuClock::host_ns(const Event& event, int64_t recorded_after_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  refresh_locked();
  // The newest anchor that surely passed before the event was recorded; the
  // first one precedes every event (Note [gpu clock]).
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

int64_t GpuClock::first_error_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return anchors_.front().error_ns;
}

size_t GpuClock::anchors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return anchors_.size();
}

bool GpuClock::refreshing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_ != nullptr;
}

namespace {

struct Clocks {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::unique_ptr<GpuClock>> clocks;
  // Per device and thread (Note [device spans]); never destroyed, as the records.
  std::map<std::tuple<int, int, std::thread::id>, std::unique_ptr<DeviceSpans>> spans;
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

DeviceSpans::DeviceSpans(const Device& device, std::string track_name)
    : device_(device),
      track_name_(track_name.empty() ? fmt::format("{} compute stream", device.str())
                                     : std::move(track_name)),
      track_(stream_track(track_name_)),
      track_generation_(generation()) {
  gpu_clock(device);  // the first anchor precedes every phase
}

std::shared_ptr<Event> DeviceSpans::take_event_locked() {
  if (!free_.empty()) {
    std::shared_ptr<Event> event = std::move(free_.back());
    free_.pop_back();
    return event;
  }
  ++events_created_;
  return std::make_shared<Event>(device_, true);
}

// Back to the pool once no phase refers to it (a boundary's event ends one phase
// and begins the next).
void DeviceSpans::give_back_locked(std::shared_ptr<Event>& event) {
  if (event && event.use_count() == 1 && free_.size() < kPooledEvents)
    free_.push_back(std::move(event));
  event.reset();
}

void DeviceSpans::boundary(std::string_view name, Args args) {
  std::shared_ptr<Event> event;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    event = take_event_locked();
  }
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
    if (track_generation_ != generation()) {  // a start() since made the tracks anew
      track_ = stream_track(track_name_);
      track_generation_ = generation();
    }
    complete(p.name, "gpu", start, end - start, p.args, track_);
    Phase done = std::move(pending_.front());
    pending_.pop_front();
    give_back_locked(done.start);
    give_back_locked(done.end);
  }
}

size_t DeviceSpans::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

int64_t DeviceSpans::events_created() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_created_;
}

DeviceSpans& device_spans(const Device& device) {
  const auto mine = std::tuple_cat(key(device), std::tuple{std::this_thread::get_id()});
  bool first_of_device = true;
  {
    Clocks& c = clocks();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (auto it = c.spans.find(mine); it != c.spans.end()) return *it->second;
    for (const auto& [k, s] : c.spans) {
      if (std::get<0>(k) == std::get<0>(mine) && std::get<1>(k) == std::get<1>(mine))
        first_of_device = false;
    }
  }
  // Outside the lock: it makes a clock.
  auto spans = std::make_unique<DeviceSpans>(
      device, first_of_device
                  ? ""
                  : fmt::format("{} compute stream (thread {})", device.str(), ::gettid()));
  Clocks& c = clocks();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto& slot = c.spans[mine];
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
