#include "runtime/device.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/mps/mps.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <thread>

namespace ddp {
namespace {

constexpr const char* kForms = "cpu, cpu:N, cuda, cuda:N (N = 0, 1, ...), mps";

std::string trim_lower(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string list_available() {
  std::string out;
  for (const Device& d : available_devices()) out += (out.empty() ? "" : ", ") + d.str();
  return out;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos && pos + 2 <= line.size()) return line.substr(pos + 2);
    }
  }
  return "cpu";
}

}  // namespace

Device Device::parse(std::string_view text) {
  const std::string s = trim_lower(text);
  const auto colon = s.find(':');
  const std::string type = s.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    const std::string idx = s.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), index);
    DDP_CHECK(
        !idx.empty() && ec == std::errc() && ptr == idx.data() + idx.size() && index >= 0,
        "invalid device '{}': the index '{}' is not a non-negative integer; expected one of {}",
        text, idx, kForms);
  }
  if (type == "cpu") return {DeviceType::cpu, index};  // Note [virtual cpu devices]
  if (type == "mps") {
    DDP_CHECK(index == 0, "invalid device '{}': mps has only index 0; expected one of {}", text,
              kForms);
    return Device::mps();
  }
  if (type == "cuda") return Device::cuda(index);
  throw ValueError(fmt::format("invalid device '{}'; expected one of {}", text, kForms));
}

std::string_view device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::cpu:
      return "cpu";
    case DeviceType::cuda:
      return "cuda";
    case DeviceType::mps:
      return "mps";
  }
  return "?";
}

std::string Device::str() const {
  if (type == DeviceType::cuda || (type == DeviceType::cpu && index != 0)) {
    return fmt::format("{}:{}", device_type_name(type), index);
  }
  return std::string(device_type_name(type));
}

std::ostream& operator<<(std::ostream& os, const Device& d) {
  return os << d.str();
}

namespace {
// Note [virtual cpu devices]. Read on every call so that a test can change it.
int virtual_cpu_devices() {
  const auto n = env::get_int(env::kVirtualCpuDevices);
  if (!n) return 1;
  DDP_CHECK(*n >= 1 && *n <= 1024,
            "{}={} must be a number of CPU devices from 1 to 1024 (1, the default, is the "
            "ordinary single CPU device)",
            env::kVirtualCpuDevices, *n);
  return static_cast<int>(*n);
}
}  // namespace

int device_count(DeviceType type) {
  switch (type) {
    case DeviceType::cpu:
      return virtual_cpu_devices();
    case DeviceType::cuda:
      return cuda_api::device_count();
    case DeviceType::mps:
      return mps::device_count();
  }
  return 0;
}

std::string unavailable_reason(DeviceType type) {
  if (device_count(type) > 0) return "";
  switch (type) {
    case DeviceType::cuda:
      return cuda_api::unavailable_reason();
    case DeviceType::mps:
      return mps::unavailable_reason();
    case DeviceType::cpu:
      break;
  }
  return "";
}

std::vector<Device> available_devices() {
  std::vector<Device> out;
  for (int i = 0; i < device_count(DeviceType::cuda); ++i) out.push_back(Device::cuda(i));
  if (device_count(DeviceType::mps) > 0) out.push_back(Device::mps());
  const int cpus = device_count(DeviceType::cpu);  // reads the environment: once
  for (int i = 0; i < cpus; ++i) out.push_back({DeviceType::cpu, i});
  return out;
}

bool is_available(const Device& d) {
  return d.index >= 0 && d.index < device_count(d.type);
}

void check_available(const Device& d) {
  if (is_available(d)) return;
  const int count = device_count(d.type);
  std::string why;
  if (count == 0) {
    why = unavailable_reason(d.type);
  } else if (d.is_cpu()) {
    why = fmt::format(
        "this process has {} cpu device{}; set {}=N for N virtual cpu devices "
        "(Note [virtual cpu devices])",
        count, count == 1 ? "" : "s", env::kVirtualCpuDevices);
  } else {
    why = fmt::format("this machine has {} {} device{} ({}:0..{}:{})", count,
                      device_type_name(d.type), count == 1 ? "" : "s", device_type_name(d.type),
                      device_type_name(d.type), count - 1);
  }
  throw DeviceError(fmt::format("device {} is not available: {}. Available devices: {}", d.str(),
                                why, list_available()));
}

Device default_device() {
  if (auto text = env::get(env::kDevice)) {
    // Both errors name the variable: "invalid device 'gpu'" alone does not say where
    // the text came from.
    Device d;
    try {
      d = Device::parse(*text);
    } catch (const ValueError& e) {
      throw ValueError(fmt::format("{}={}: {}", env::kDevice, *text, e.what()));
    }
    try {
      check_available(d);
    } catch (const DeviceError& e) {
      throw DeviceError(fmt::format("{}={}: {}", env::kDevice, *text, e.what()));
    }
    return d;
  }
  if (device_count(DeviceType::cuda) > 0) return Device::cuda(0);
  if (device_count(DeviceType::mps) > 0) return Device::mps();
  return Device::cpu();
}

DeviceProperties device_properties(const Device& d) {
  check_available(d);
  DeviceProperties p;
  p.device = d;
  if (d.is_cuda()) {
    const auto props = cuda_api::properties(d.index);
    p.name = props.name;
    p.total_memory = props.total_memory;
    p.compute_capability_major = props.major;
    p.compute_capability_minor = props.minor;
    p.multiprocessors = props.multiprocessors;
    uint64_t free_bytes = 0, total = 0;
    cuda_api::mem_get_info(d.index, &free_bytes, &total);
    p.free_memory = free_bytes;
    return p;
  }
  p.name = cpu_model_name();
  const long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  p.total_memory = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  p.free_memory = static_cast<uint64_t>(avail) * static_cast<uint64_t>(page);
  p.multiprocessors = static_cast<int>(std::thread::hardware_concurrency());
  return p;
}

}  // namespace ddp
