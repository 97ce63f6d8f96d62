// Devices: where a tensor lives.
//
// `Device::parse("cuda:1")`, `available_devices()`, `default_device()` (cuda,
// then mps, then cpu; the environment variable DDP_DEVICE overrides). A device
// this build or this machine does not have is unavailable, never a crash:
// `check_available(d)` throws DeviceError naming it and listing what exists.
//
// Note [virtual cpu devices]: DDP_VIRTUAL_CPU_DEVICES=N gives the CPU N distinct
// devices cpu:0 .. cpu:N-1 (JAX's xla_force_host_platform_device_count). Their
// memory is all host memory, but they are different devices to every check: a
// cpu:1 tensor does not mix with a cpu:0 one, moving between them is an explicit
// copy, and a communicator bound to cpu:1 rejects cpu:0 tensors. This lets tests
// on a machine without a GPU exercise "a tensor on the wrong device" and "two
// devices" exactly where CUDA code would meet them. cpu:0 prints as "cpu".
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace ddp {

enum class DeviceType : uint8_t { cpu, cuda, mps };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // always 0 for mps; cpu:N > 0 only with virtual cpu devices

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  static Device mps() { return {DeviceType::mps, 0}; }
  // Accepts "cpu", "cpu:N", "cuda", "cuda:N", "mps", "mps:0" (any case, spaces trimmed).
  // Throws ValueError naming the text and the accepted forms. Does not check availability.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "cpu", "cpu:1", "cuda:0", "mps"
  friend bool operator==(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& os, const Device& d);
std::string_view device_type_name(DeviceType type);

// Number of usable devices of a type: cpu 1 (or DDP_VIRTUAL_CPU_DEVICES), cuda the
// visible GPUs (0 without a driver or GPU), mps 0 on builds without Metal.
int device_count(DeviceType type);
// Every usable device: cuda:0..N-1, then mps if present, then cpu (cpu:0..N-1).
std::vector<Device> available_devices();
bool is_available(const Device& device);
// Throws DeviceError: "cuda:1 is not available: ... Available devices: cuda:0, cpu".
void check_available(const Device& device);
// Why a device type has no devices ("" when it has some), e.g. the CUDA driver error.
std::string unavailable_reason(DeviceType type);
// cuda:0 if any GPU, else mps, else cpu; DDP_DEVICE=<device> overrides (and is checked).
Device default_device();

struct DeviceProperties {
  Device device;
  std::string name;           // "NVIDIA H100 80GB HBM3", or the CPU model name
  uint64_t total_memory = 0;  // bytes
  uint64_t free_memory = 0;   // bytes, at the time of the call
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessors = 0;  // SMs on CUDA, logical cores on the CPU
};
DeviceProperties device_properties(const Device& device);

}  // namespace ddp
