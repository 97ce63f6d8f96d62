#include "collectives/data_parallel/data_parallel.h"

#include "collectives/data_parallel/replicate.h"
#include "collectives/data_parallel/scatter_gather.h"
#include "runtime/logging.h"

#include <algorithm>
#include <chrono>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string join_devices(const std::vector<Device>& devices) {
  std::vector<std::string> names;
  for (const Device& d : devices) names.push_back(d.str());
  return fmt::format("{}", fmt::join(names, ", "));
}

std::vector<Device> checked_devices(std::vector<Device> devices) {
  if (devices.empty()) {
    const int n = device_count(DeviceType::cuda);
    DDP_CHECK_T(DeviceError, n > 0,
                "DataParallel: no devices given and no CUDA device is available ({}); pass "
                "devices, e.g. cpu,cpu for CPU replicas",
                unavailable_reason(DeviceType::cuda));
    for (int i = 0; i < n; ++i) devices.push_back(Device::cuda(i));
  }
  check_data_parallel_devices(devices);
  if (!devices.front().is_cpu()) {
    for (size_t i = 0; i < devices.size(); ++i) {
      const auto copies = std::count(devices.begin(), devices.end(), devices[i]);
      if (copies > 1 && std::find(devices.begin(), devices.end(), devices[i]) ==
                            devices.begin() + static_cast<std::ptrdiff_t>(i)) {
        DDP_LOG_WARN(
            "DataParallel: {} is listed {} times in devices ({}); its replicas share one GPU, "
            "which is only useful for testing DataParallel on a one-GPU machine",
            devices[i].str(), copies, join_devices(devices));
      }
    }
  }
  return devices;
}

}  // namespace

void check_data_parallel_devices(const std::vector<Device>& devices) {
  DDP_CHECK(!devices.empty(), "DataParallel: the device list is empty");
  for (const Device& d : devices) {
    DDP_CHECK(d.type == devices.front().type,
              "DataParallel: devices must all be of one type (all CUDA, or cpu repeated), got "
              "{}",
              join_devices(devices));
  }
  for (const Device& d : devices) check_available(d);
}

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> devices,
                           std::optional<Device> output_device)
    : module_(std::move(module)), devices_(checked_devices(std::move(devices))) {
  DDP_CHECK(module_ != nullptr, "DataParallel: module is null");
  output_device_ = output_device.value_or(devices_.front());
  check_available(output_device_);
  for (const Device& d : devices_) streams_.push_back(Stream::create(d));
  threads_ = std::make_unique<data_parallel::ReplicaThreads>(devices_.size());
}

DataParallel::~DataParallel() = default;

void DataParallel::check_module_device() const {
  const Device& primary = devices_.front();
  for (const auto& [name, t] : module_->state_dict()) {
    DDP_CHECK(t.device() == primary,
              "module must have its parameters and buffers on device {} (device_ids[0]) but "
              "found one of them on device: {}",
              primary.str(), t.device().str());
  }
}

Tensor DataParallel::forward(const Tensor& x) {
  check_module_device();
  stats_ = {};
  auto start = Clock::now();
  const std::vector<Tensor> chunks = data_parallel::scatter(x, devices_);
  stats_.scatter_ms = ms_since(start);
  stats_.replicas = chunks.size();
  const std::vector<Device> used(devices_.begin(),
                                 devices_.begin() + static_cast<std::ptrdiff_t>(chunks.size()));
  start = Clock::now();
  // One replica: the module itself, as PyTorch does (nothing to reduce).
  const std::vector<std::shared_ptr<nn::Module>> replicas =
      used.size() == 1 ? std::vector<std::shared_ptr<nn::Module>>{module_}
                       : data_parallel::replicate(*module_, used);
  stats_.replicate_ms = ms_since(start);
  start = Clock::now();
  const std::vector<Tensor> outputs =
      data_parallel::parallel_apply(replicas, chunks, streams_, *threads_);
  stats_.apply_ms = ms_since(start);
  start = Clock::now();
  Tensor out = data_parallel::gather(outputs, output_device_);
  stats_.gather_ms = ms_since(start);
  return out;
}

std::vector<Device> parse_device_list(std::string_view text) {
  std::vector<Device> devices;
  size_t begin = 0;
  for (;;) {
    const size_t comma = text.find(',', begin);
    const std::string_view item =
        text.substr(begin, comma == std::string_view::npos ? text.size() - begin : comma - begin);
    DDP_CHECK(item.find_first_not_of(" \t") != std::string_view::npos,
              "device list '{}': empty entry; expected devices separated by commas, like cpu,cpu "
              "or cuda:0,cuda:1",
              text);
    devices.push_back(Device::parse(item));
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return devices;
}

}  // namespace ddp
