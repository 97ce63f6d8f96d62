// init_process_group without a launcher (world size 1): the device binding of the
// communicator (Note [communicator devices]) and option checks.
#include "collectives/bootstrap.h"
#include "collectives/communicator_base.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace ddp {
namespace {

using namespace std::chrono_literals;

ProcessGroupOptions on(const std::string& device) {
  ProcessGroupOptions o;
  o.device = device;
  return o;
}

TEST(Bootstrap, AloneTheCommunicatorIsLocalAndBoundToTheRanksDevice) {
  setenv("DDP_VIRTUAL_CPU_DEVICES", "3", 1);
  ProcessGroup pg = init_process_group(on("cpu:2"));
  EXPECT_EQ(pg.comm->backend(), "local");
  EXPECT_EQ(pg.device, (Device{DeviceType::cpu, 2}));
  EXPECT_EQ(pg.comm->device(), pg.device);
  // Without an index, "cpu" is this rank's own: cpu:(LOCAL_RANK mod 3) = cpu:0 alone.
  EXPECT_EQ(init_process_group(on("cpu")).comm->device(), Device::cpu());
  unsetenv("DDP_VIRTUAL_CPU_DEVICES");
}

TEST(Bootstrap, ANonPositiveTimeoutIsRejected) {
  try {
    ProcessGroupOptions o;
    o.timeout = 0ms;
    init_process_group(o);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("timeout is 0 ms; it must be positive"), std::string::npos)
        << e.what();
  }
}

// Note [timeout bound]: 1e10 s overflowed s * 1000 ms and the nanosecond deadlines
// (an endless wait in TcpStore::connect_locked, or a timeout at once).
TEST(Bootstrap, ATimeoutPastTheBoundIsRejected) {
  setenv("DDP_TIMEOUT_S", "10000000000", 1);
  std::string message;
  try {
    init_process_group(ProcessGroupOptions{});
  } catch (const ValueError& e) {
    message = e.what();
  }
  unsetenv("DDP_TIMEOUT_S");
  EXPECT_NE(message.find("DDP_TIMEOUT_S=10000000000: expected a whole number of seconds from 1 "
                         "to 1000000000"),
            std::string::npos)
      << message;
  try {
    ProcessGroupOptions o;
    o.timeout = std::chrono::milliseconds::max();
    init_process_group(o);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 1000000000000 ms"), std::string::npos)
        << e.what();
  }
  setenv("DDP_TIMEOUT_S", "1000000000", 1);  // the bound itself is accepted
  EXPECT_EQ(init_process_group(ProcessGroupOptions{}).comm->backend(), "local");
  unsetenv("DDP_TIMEOUT_S");
}

TEST(Bootstrap, AnUnavailableVirtualDeviceNamesTheVariable) {
  try {
    init_process_group(on("cpu:1"));
    FAIL() << "no error";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_VIRTUAL_CPU_DEVICES"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp

// Note [two stores]: under ddprun the store is DDPRUN_STORE_ADDR, not MASTER_PORT
// (which a PyTorch rank 0 holds); without it, MASTER_ADDR:MASTER_PORT as before.
// A world without a rank would have trained alone, as if world size 1.
TEST(Bootstrap, AWorldSizeWithoutARankIsRefused) {
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) unsetenv(v);
  setenv("WORLD_SIZE", "2", 1);
  std::string message;
  try {
    ddp::read_launch_env();
  } catch (const ddp::ValueError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("WORLD_SIZE=2 is set but RANK is not"), std::string::npos) << message;
  setenv("WORLD_SIZE", "1", 1);
  EXPECT_EQ(ddp::read_launch_env().world_size, 1);
  unsetenv("WORLD_SIZE");
}

// An int64 past INT_MAX wrapped (WORLD_SIZE=4294967298 was world size 2).
TEST(Bootstrap, ARankVariablePastIntMaxIsRefused) {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) unsetenv(v);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "4294967298", 1);
  std::string message;
  try {
    ddp::read_launch_env();
  } catch (const ddp::ValueError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("WORLD_SIZE=4294967298: expected a whole number from 0 to 2147483647"),
            std::string::npos)
      << message;
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
}

// DDP_DEBUG as TORCH_DISTRIBUTED_DEBUG: any case; a misspelling is named.
TEST(Bootstrap, DdpDebugTakesTorchsValuesInAnyCaseAndNamesOthers) {
  setenv("DDP_DEBUG", "DETAIL", 1);
  EXPECT_TRUE(ddp::debug_detail());
  setenv("DDP_DEBUG", "info", 1);
  EXPECT_FALSE(ddp::debug_detail());
  setenv("DDP_DEBUG", "on", 1);
  try {
    ddp::debug_detail();
    ADD_FAILURE() << "DDP_DEBUG=on accepted";
  } catch (const ddp::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_DEBUG=on: expected off, info or detail"),
              std::string::npos)
        << e.what();
  }
  unsetenv("DDP_DEBUG");
  EXPECT_FALSE(ddp::debug_detail());
}

TEST(Bootstrap, TheStoreIsDdprunStoreAddrElseMaster) {
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  unsetenv("DDPRUN_STORE_ADDR");
  ddp::LaunchEnv e = ddp::read_launch_env();
  EXPECT_EQ(e.store_host, "10.0.0.1");
  EXPECT_EQ(e.store_port, 29500);
  setenv("DDPRUN_STORE_ADDR", "127.0.0.1:41000", 1);
  e = ddp::read_launch_env();
  EXPECT_EQ(e.store_host, "127.0.0.1");
  EXPECT_EQ(e.store_port, 41000);
  EXPECT_EQ(e.master_port, 29500);
  setenv("DDPRUN_STORE_ADDR", "[::1]:41000", 1);
  EXPECT_EQ(ddp::read_launch_env().store_host, "::1");
  setenv("DDPRUN_STORE_ADDR", "127.0.0.1:0", 1);
  try {
    ddp::read_launch_env();
    ADD_FAILURE() << "port 0 was accepted";
  } catch (const ddp::ValueError& err) {
    EXPECT_NE(std::string(err.what()).find("DDPRUN_STORE_ADDR=127.0.0.1:0"), std::string::npos);
  }
  for (const char* v : {"MASTER_ADDR", "MASTER_PORT", "DDPRUN_STORE_ADDR"}) unsetenv(v);
}
