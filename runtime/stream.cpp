#include "runtime/stream.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/error.h"

#include <map>
#include <utility>

namespace ddp {
namespace {

// Current stream per (thread, CUDA device); absent means the default stream.
thread_local std::map<int, Stream> t_current;

}  // namespace

Stream Stream::default_stream(const Device& device) {
  return Stream(device, nullptr, nullptr);
}

Stream Stream::create(const Device& device) {
  if (!device.is_cuda()) return Stream(device, nullptr, nullptr);
  check_available(device);
  void* handle = cuda_api::stream_create(device.index);
  std::shared_ptr<void> owner(handle, [index = device.index](void* h) {
    try {
      cuda_api::stream_destroy(index, h);
    } catch (...) {
      // Destroying a stream during shutdown may fail once the driver is gone; nothing to do.
    }
  });
  return Stream(device, handle, std::move(owner));
}

Stream Stream::from_external(const Device& device, void* handle) {
  if (!device.is_cuda()) return Stream();
  return Stream(device, handle, nullptr);
}

void Stream::synchronize() const {
  if (device_.is_cuda()) cuda_api::stream_synchronize(device_.index, handle_);
}

bool Stream::query() const {
  return !device_.is_cuda() || cuda_api::stream_query(device_.index, handle_);
}

Stream current_stream(const Device& device) {
  if (!device.is_cuda()) return Stream::default_stream(device);
  auto it = t_current.find(device.index);
  return it == t_current.end() ? Stream::default_stream(device) : it->second;
}

void set_current_stream(const Stream& stream) {
  if (stream.device().is_cuda()) t_current[stream.device().index] = stream;
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  set_current_stream(previous_);
}

Event::Event(const Device& device, bool enable_timing) : device_(device) {
  if (device_.is_cuda()) handle_ = cuda_api::event_create(device_.index, enable_timing);
}

Event::~Event() {
  if (handle_ != nullptr) {
    try {
      cuda_api::event_destroy(device_.index, handle_);
    } catch (...) {
      // See Stream::create: teardown after the driver is gone.
    }
  }
}

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      handle_(std::exchange(other.handle_, nullptr)),
      recorded_(other.recorded_),
      host_time_(other.host_time_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    this->~Event();
    new (this) Event(std::move(other));
  }
  return *this;
}

void Event::record(const Stream& stream) {
  DDP_CHECK_T(DeviceError, stream.device() == device_,
              "Event on {} cannot record a stream of {}; create the event on the stream's device",
              device_.str(), stream.device().str());
  if (handle_ != nullptr) {
    cuda_api::event_record(device_.index, handle_, stream.handle());
  } else {
    host_time_ = std::chrono::steady_clock::now();
  }
  recorded_ = true;
}

void Event::synchronize() const {
  if (handle_ != nullptr && recorded_) cuda_api::event_synchronize(device_.index, handle_);
}

bool Event::query() const {
  return handle_ == nullptr || !recorded_ || cuda_api::event_query(device_.index, handle_);
}

void Event::block(const Stream& stream) const {
  if (handle_ != nullptr && recorded_ && stream.device().is_cuda()) {
    cuda_api::stream_wait_event(stream.device().index, stream.handle(), handle_);
  }
}

float Event::elapsed_ms(const Event& end) const {
  DDP_CHECK(recorded_ && end.recorded_, "Event::elapsed_ms: both events must be recorded first");
  if (handle_ != nullptr) return cuda_api::event_elapsed_ms(device_.index, handle_, end.handle_);
  return std::chrono::duration<float, std::milli>(end.host_time_ - host_time_).count();
}

void synchronize(const Device& device) {
  if (device.is_cuda()) cuda_api::device_synchronize(device.index);
}

}  // namespace ddp
