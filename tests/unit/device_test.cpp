#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace ddp {
namespace {

TEST(Device, ParsesEveryForm) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cpu:0"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::parse(" CUDA:12 "), Device::cuda(12));
  EXPECT_EQ(Device::parse("mps"), Device::mps());
}

TEST(Device, PrintsLikePyTorch) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_EQ(Device::mps().str(), "mps");
  EXPECT_EQ(Device::parse(Device::cuda(7).str()), Device::cuda(7));
}

TEST(Device, RejectsBadTextNamingIt) {
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "mps:1", "cpu:-1", "", "cuda:1:2"}) {
    try {
      Device::parse(bad);
      ADD_FAILURE() << "parsed '" << bad << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("cuda:N"), std::string::npos) << e.what();
    }
  }
}

TEST(Device, ParsesAndPrintsVirtualCpuDevices) {
  EXPECT_EQ(Device::parse("cpu:3"), (Device{DeviceType::cpu, 3}));
  EXPECT_EQ((Device{DeviceType::cpu, 3}).str(), "cpu:3");
  EXPECT_EQ(Device::parse((Device{DeviceType::cpu, 2}).str()), (Device{DeviceType::cpu, 2}));
  EXPECT_NE((Device{DeviceType::cpu, 1}), Device::cpu());
}

// Note [virtual cpu devices]: sets the variable for one test and restores it.
class VirtualCpuDevices {
 public:
  explicit VirtualCpuDevices(const char* n) { setenv("DDP_VIRTUAL_CPU_DEVICES", n, 1); }
  ~VirtualCpuDevices() { unsetenv("DDP_VIRTUAL_CPU_DEVICES"); }
};

TEST(Device, VirtualCpuDevicesAreDistinctAndDoNotMix) {
  const Device cpu1{DeviceType::cpu, 1};
  EXPECT_FALSE(is_available(cpu1));
  try {
    empty({2}, {.device = cpu1});
    FAIL() << "no error for cpu:1 without virtual devices";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_VIRTUAL_CPU_DEVICES"), std::string::npos) << e.what();
  }
  VirtualCpuDevices three("3");
  EXPECT_EQ(device_count(DeviceType::cpu), 3);
  EXPECT_TRUE(is_available(cpu1));
  const auto devices = available_devices();
  EXPECT_EQ(devices.back(), (Device{DeviceType::cpu, 2}));
  Tensor a = full({3}, 2.0, {.device = cpu1});
  Tensor b = full({3}, 1.0);
  EXPECT_EQ(a.device(), cpu1);
  EXPECT_NE(a.str().find("device='cpu:1'"), std::string::npos) << a.str();
  try {
    add(a, b);
    FAIL() << "cpu:1 and cpu mixed";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("Expected all tensors to be on the same device, but "
                                         "found at least two devices, cpu:1 and cpu!"),
              std::string::npos)
        << e.what();
  }
  Tensor moved = a.to(Device::cpu());
  EXPECT_EQ(moved.device(), Device::cpu());
  EXPECT_NE(moved.data_ptr(), a.data_ptr());
  EXPECT_EQ(add(moved, b).to_vector<float>(), (std::vector<float>{3, 3, 3}));
  EXPECT_EQ(current_stream(cpu1).device(), cpu1);
}

TEST(Device, BadVirtualCpuDeviceCountNamesTheVariable) {
  VirtualCpuDevices zero("0");
  try {
    device_count(DeviceType::cpu);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_VIRTUAL_CPU_DEVICES=0"), std::string::npos)
        << e.what();
  }
}

TEST(Device, CpuIsAlwaysAvailableAndListedLast) {
  EXPECT_EQ(device_count(DeviceType::cpu), 1);
  const auto devices = available_devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices.back(), Device::cpu());
  EXPECT_EQ(static_cast<int>(devices.size()),
            1 + device_count(DeviceType::cuda) + device_count(DeviceType::mps));
}

TEST(Device, UnavailableCudaDeviceNamesItAndListsAvailable) {
  const Device missing = Device::cuda(device_count(DeviceType::cuda));
  EXPECT_FALSE(is_available(missing));
  try {
    check_available(missing);
    FAIL() << "no error";
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(missing.str() + " is not available"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Available devices:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  }
  EXPECT_THROW(empty({2}, {.device = missing}), DeviceError);
}

TEST(Device, MpsWithoutMetalSaysSo) {
  ASSERT_EQ(device_count(DeviceType::mps), 0);
  try {
    empty({2}, {.device = Device::mps()});
    FAIL() << "no error";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("no Metal support"), std::string::npos) << e.what();
  }
}

TEST(Device, NoGpuMeansUnavailableWithAReason) {
  if (device_count(DeviceType::cuda) > 0) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_FALSE(unavailable_reason(DeviceType::cuda).empty());
  EXPECT_EQ(default_device(), Device::cpu());
}

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~EnvGuard() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Device, DdpDeviceOverridesDefault) {
  {
    EnvGuard g("DDP_DEVICE", "cpu");
    EXPECT_EQ(default_device(), Device::cpu());
  }
  {
    EnvGuard g("DDP_DEVICE", "cuda:99");
    try {
      default_device();
      FAIL() << "no error";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("DDP_DEVICE=cuda:99"), std::string::npos) << e.what();
    }
  }
  for (const char* bad : {"tpu", "gpu", "cuda:", "cpu:-1"}) {
    EnvGuard g("DDP_DEVICE", bad);
    try {
      default_device();
      ADD_FAILURE() << "no error for DDP_DEVICE=" << bad;
    } catch (const ValueError& e) {  // names the variable, not only the text
      EXPECT_NE(std::string(e.what()).find(std::string("DDP_DEVICE=") + bad + ": invalid device"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Device, CpuPropertiesAreReal) {
  const DeviceProperties p = device_properties(Device::cpu());
  EXPECT_FALSE(p.name.empty());
  EXPECT_GT(p.total_memory, uint64_t{1} << 28);
  EXPECT_LE(p.free_memory, p.total_memory);
  EXPECT_GE(p.multiprocessors, 1);
}

}  // namespace
}  // namespace ddp
