// Streams and events.
//
// Every call on a CUDA stream or event runs with the stream's (event's) device
// current (Note [stream device] in cuda/cuda_api.h), whatever the calling thread's
// current device is.
//
// A Stream is a cheap, copyable handle; streams made by Stream::create are owned
// by a shared handle and destroyed with the last copy. Each thread has a current
// stream per device (the default stream until set), as in PyTorch. On the CPU
// every stream is the same synchronous stream: waits are no-ops and events
// record the host clock, so elapsed_ms() times CPU work too.
#pragma once

#include "runtime/device.h"

#include <chrono>
#include <memory>

namespace ddp {

class Stream {
 public:
  Stream() = default;  // the CPU stream
  static Stream default_stream(const Device& device);
  // A new CUDA stream (on a cpu device: that device's one synchronous stream).
  static Stream create(const Device& device);
  // A stream ddp did not create (a cudaStream_t of another library, or of the user)
  // on `device`, as PyTorch's getStreamFromExternal. ddp never destroys it; the caller
  // keeps it alive while ddp may use it. nullptr is the device's default stream.
  static Stream from_external(const Device& device, void* handle);

  const Device& device() const { return device_; }
  void* handle() const { return handle_; }  // cudaStream_t, nullptr for default/CPU
  void synchronize() const;  // blocks the host until the work queued so far has finished
  bool query() const;        // true when all work queued so far has finished
  friend bool operator==(const Stream& a, const Stream& b) {
    return a.device_ == b.device_ && a.handle_ == b.handle_;
  }

 private:
  Stream(Device device, void* handle, std::shared_ptr<void> owner)
      : device_(device), handle_(handle), owner_(std::move(owner)) {}
  Device device_ = Device::cpu();
  void* handle_ = nullptr;
  std::shared_ptr<void> owner_;
};

Stream current_stream(const Device& device);
void set_current_stream(const Stream& stream);

// Makes `stream` current for its device for the scope, restoring the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

class Event {
 public:
  explicit Event(const Device& device = Device::cpu(), bool enable_timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  void record(const Stream& stream);
  void record() { record(current_stream(device_)); }
  void synchronize() const;
  bool query() const;
  // Makes `stream` wait (on the device, without blocking the host) for this event.
  void block(const Stream& stream) const;
  // Milliseconds from this event to `end`; both must have been recorded.
  float elapsed_ms(const Event& end) const;
  const Device& device() const { return device_; }

 private:
  Device device_;
  void* handle_ = nullptr;
  bool recorded_ = false;
  std::chrono::steady_clock::time_point host_time_{};
};

// Waits for all work on a device (CPU: nothing to wait for).
void synchronize(const Device& device);

}  // namespace ddp
