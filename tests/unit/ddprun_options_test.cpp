// ddprun's pure parts: option parsing, the rank count, the rank environment
// and the program lookup. The processes themselves: tests/e2e/ddprun_*.sh.
#include "launcher/node_address.h"
#include "launcher/options.h"
#include "launcher/output.h"
#include "launcher/program_path.h"
#include "launcher/rank_env.h"
#include "runtime/error.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace ddp::launcher {
namespace {

ParseResult parse(std::vector<const char*> args) {
  args.insert(args.begin(), "ddprun");
  return parse_ddprun_args(static_cast<int>(args.size()), args.data());
}

std::string parse_error(std::vector<const char*> args) {
  try {
    parse(std::move(args));
  } catch (const ValueError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(DdprunOptions, DefaultsMatchTorchrun) {
  const LaunchOptions o = parse({"train"}).options;
  EXPECT_EQ(o.nproc_per_node, "1");
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_DOUBLE_EQ(o.grace_period_s, 10);
  EXPECT_DOUBLE_EQ(o.rdzv_timeout_s, 300);
  EXPECT_TRUE(o.prefix);
  EXPECT_EQ(o.program, "train");
  EXPECT_TRUE(o.program_args.empty());
}

// Note [elastic membership]: --on-failure and --min-ranks, and what they refuse.
TEST(DdprunOptions, OnFailureAndMinRanks) {
  EXPECT_EQ(parse({"train"}).options.on_failure, "restart");
  const LaunchOptions o =
      parse({"-n", "4", "--on-failure", "continue", "--min-ranks", "2", "train"}).options;
  EXPECT_EQ(o.on_failure, "continue");
  EXPECT_EQ(o.min_ranks, 2);
  EXPECT_EQ(parse({"--on-failure=stop", "train"}).options.on_failure, "stop");
  EXPECT_NE(parse_error({"--on-failure", "retry", "train"})
                .find("--on-failure retry: expected restart (the whole group, up to --max-restarts "
                      "times), continue (the ranks left go on) or stop"),
            std::string::npos);
  EXPECT_NE(parse_error({"--on-failure", "stop", "--max-restarts", "2", "train"})
                .find("--on-failure stop ends the job at the first failure, but --max-restarts 2"),
            std::string::npos);
  EXPECT_NE(parse_error({"--min-ranks", "2", "train"})
                .find("--min-ranks 2 applies to --on-failure continue"),
            std::string::npos);
  EXPECT_NE(parse_error({"-n", "2", "--on-failure", "continue", "--min-ranks", "3", "train"})
                .find("--min-ranks 3 is more than the 2 ranks started"),
            std::string::npos);
  // Under continue, --max-restarts counts replacement ranks.
  EXPECT_EQ(parse({"-n", "2", "--on-failure", "continue", "--max-restarts", "2", "train"})
                .options.max_restarts,
            2);
  // One rank cannot go on without itself: restart is what it needs.
  EXPECT_NE(parse_error({"--on-failure", "continue", "--max-restarts", "1", "train"})
                .find("--on-failure continue with one rank (-n 1): no rank would be left"),
            std::string::npos);
  // Across nodes (Note [nodes lost]): --min-ranks counts every node's ranks.
  const LaunchOptions nodes = parse({"--nnodes", "2", "-n", "2", "--on-failure", "continue",
                                     "--min-ranks", "3", "--node-timeout", "4.5", "train"})
                                  .options;
  EXPECT_EQ(nodes.min_ranks, 3);
  EXPECT_EQ(nodes.node_timeout_s, 4.5);
  EXPECT_EQ(parse({"train"}).options.node_timeout_s, 15);
  EXPECT_NE(parse_error({"--nnodes", "2", "-n", "2", "--on-failure", "continue", "--min-ranks", "5",
                         "train"})
                .find("--min-ranks 5 is more than the 4 ranks started (--nproc-per-node x "
                      "--nnodes)"),
            std::string::npos);
  EXPECT_NE(parse_error({"--node-timeout", "0", "train"})
                .find("--node-timeout 0: must be at least 1 second"),
            std::string::npos);
  // Where it would do nothing, --node-timeout is refused rather than ignored.
  EXPECT_NE(parse_error({"-n", "2", "--on-failure", "continue", "--node-timeout", "5", "train"})
                .find("--node-timeout 5 takes a node out of the group, which needs --nnodes > 1"),
            std::string::npos);
  // Across nodes it counts in every mode (Note [a node gone]): a node without a
  // heartbeat fails the attempt without --on-failure continue.
  EXPECT_EQ(parse({"--nnodes", "2", "--node-rank", "0", "--node-timeout", "3", "train"})
                .options.node_timeout_s,
            3);
}

TEST(DdprunOptions, EverySpelling) {
  const LaunchOptions o = parse({"-n4",
                                 "--nnodes=2",
                                 "--node_rank",
                                 "1",
                                 "--master-addr",
                                 "10.0.0.1",
                                 "--master_port=1234",
                                 "--backend",
                                 "gloo",
                                 "--max-restarts",
                                 "3",
                                 "--log-dir",
                                 "logs",
                                 "--tee",
                                 "--quiet",
                                 "--grace-period",
                                 "2.5",
                                 "--rdzv_timeout",
                                 "7",
                                 "--no-prefix",
                                 "train",
                                 "--epochs",
                                 "3"})
                              .options;
  EXPECT_EQ(o.nproc_per_node, "4");
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_EQ(o.log_dir, "logs");
  EXPECT_TRUE(o.tee);
  EXPECT_TRUE(o.quiet);
  EXPECT_DOUBLE_EQ(o.grace_period_s, 2.5);
  EXPECT_DOUBLE_EQ(o.rdzv_timeout_s, 7);
  EXPECT_FALSE(o.prefix);
  EXPECT_EQ(o.program, "train");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--epochs", "3"}));
}

TEST(DdprunOptions, OptionsEndAtProgramOrDoubleDash) {
  LaunchOptions o = parse({"--nproc_per_node", "gpu", "prog", "-n", "2", "--help"}).options;
  EXPECT_EQ(o.nproc_per_node, "gpu");
  EXPECT_EQ(o.program, "prog");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"-n", "2", "--help"}));
  o = parse({"--standalone", "--", "--weird-name", "x"}).options;
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.program, "--weird-name");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"x"}));
}

// Note [two stores]: the agents' store is never on MASTER_PORT.
TEST(DdprunOptions, RdzvEndpointIsTheAgentsStoreAndNotMasterPort) {
  LaunchOptions o = parse({"--nnodes", "2", "--rdzv-endpoint=node0:29400", "train"}).options;
  EXPECT_EQ(o.master_addr, "node0");  // node 0's address, unless --master-addr says otherwise
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(rdzv_store_host(o), "node0");
  EXPECT_EQ(rdzv_store_port(o), 29400);
  o = parse({"--nnodes", "2", "--rdzv-endpoint=rdzv:29400", "--master-addr", "node0", "train"})
          .options;
  EXPECT_EQ(o.master_addr, "node0");
  EXPECT_EQ(rdzv_store_host(o), "rdzv");
  o = parse({"--nnodes", "2", "--master-addr", "node0", "--master-port", "1234", "train"}).options;
  EXPECT_EQ(rdzv_store_host(o), "node0");
  EXPECT_EQ(rdzv_store_port(o), 1235);  // default: --master-port + 1
  EXPECT_TRUE(o.rdzv_bind.empty());     // the address node0 resolves to, not 0.0.0.0
  o = parse({"--nnodes", "2", "--rdzv-port", "7000", "--rdzv-bind", "0.0.0.0", "train"}).options;
  EXPECT_EQ(rdzv_store_port(o), 7000);
  EXPECT_EQ(o.rdzv_bind, "0.0.0.0");
  EXPECT_NE(parse_error({"--nnodes", "2", "--master-port", "65535", "train"}).find("1..65535"),
            std::string::npos);
}

// Rank 0 binds MASTER_PORT on every interface of node 0: the same port clashes
// whatever the hosts (Note [master port follows the rendezvous port]).
TEST(DdprunOptions, TheAgentsStoreNeverSharesMasterPort) {
  const std::string clash =
      parse_error({"--nnodes", "2", "--rdzv-endpoint", "rdzv:7000", "--master-addr", "node0",
                   "--master-port", "7000", "train"});
  EXPECT_NE(clash.find("--rdzv-port (or --rdzv-endpoint's port) 7000 and --master-port 7000 are "
                       "the same port"),
            std::string::npos)
      << clash;
  EXPECT_NE(
      parse_error({"--nnodes", "2", "--rdzv-port", "29500", "--master-port", "29500", "train"})
          .find("--master-port 29500"),
      std::string::npos);
  // --master-port not given: MASTER_PORT moves out of the way.
  LaunchOptions o = parse({"--nnodes", "2", "--rdzv-endpoint", "head:29500", "train"}).options;
  EXPECT_EQ(rdzv_store_port(o), 29500);
  EXPECT_EQ(o.master_port, 29501);
  o = parse({"--nnodes", "2", "--rdzv-port", "7000", "train"}).options;
  EXPECT_EQ(o.master_port, 29500);  // no clash: the default stays
}

// Note [node 0 lost]: --rdzv-backup HOST:PORT, and what it refuses.
TEST(DdprunOptions, RdzvBackupNeedsNodesAndContinueAndAnotherEndpoint) {
  const std::vector<const char*> base = {"--nnodes", "2", "--on-failure", "continue"};
  auto with = [&](std::vector<const char*> more) {
    std::vector<const char*> args = base;
    args.insert(args.end(), more.begin(), more.end());
    args.push_back("train");
    return args;
  };
  LaunchOptions o = parse(with({"--rdzv-backup", "node1:29600"})).options;
  EXPECT_EQ(o.rdzv_backup_host, "node1");
  EXPECT_EQ(o.rdzv_backup_port, 29600);
  o = parse(with({"--rdzv-backup", "[fd00::2]:29600"})).options;
  EXPECT_EQ(o.rdzv_backup_host, "fd00::2");
  EXPECT_NE(parse_error({"--nnodes", "2", "--rdzv-backup", "node1:29600", "train"})
                .find("--rdzv-backup keeps the group going when node 0 is lost, which needs "
                      "--nnodes > 1 and --on-failure continue (given: --nnodes 2, --on-failure "
                      "restart)"),
            std::string::npos);
  EXPECT_NE(parse_error({"--on-failure", "continue", "--rdzv-backup", "node1:29600", "train"})
                .find("(given: --nnodes 1, --on-failure continue)"),
            std::string::npos);
  EXPECT_NE(parse_error(with({"--rdzv-backup", "node1"}))
                .find("--rdzv-backup 'node1': expected HOST:PORT"),
            std::string::npos);
  EXPECT_NE(parse_error(with({"--rdzv-backup", "node1:0"}))
                .find("--rdzv-backup port 0: must be a TCP port in 1..65535"),
            std::string::npos);
  // The agents' store is on --master-addr:--master-port + 1 by default.
  EXPECT_NE(parse_error(with({"--master-addr", "head", "--rdzv-backup", "head:29501"}))
                .find("--rdzv-backup head:29501 is the agents' store itself"),
            std::string::npos);
  EXPECT_NE(parse_error(with({"--rdzv-backup", "localhost:29501"}))  // 127.0.0.1 by default
                .find("--rdzv-backup localhost:29501 is the agents' store itself"),
            std::string::npos);
  EXPECT_NE(parse_error(with({"--rdzv-backup", "0.0.0.0:29600"}))
                .find("--rdzv-backup 0.0.0.0: every node and rank connects to HOST, so it must "
                      "be node 1's address, not a wildcard"),
            std::string::npos);
}

TEST(DdprunOptions, RdzvEndpointIPv6HostLosesItsBrackets) {
  LaunchOptions o = parse({"--nnodes", "2", "--rdzv-endpoint", "[::1]:29400", "train"}).options;
  EXPECT_EQ(rdzv_store_host(o), "::1");
  EXPECT_EQ(o.master_addr, "::1");
  EXPECT_EQ(rdzv_store_port(o), 29400);
  o = parse({"--nnodes", "2", "--rdzv-endpoint", "[fe80::1%eth0]:7", "train"}).options;
  EXPECT_EQ(rdzv_store_host(o), "fe80::1%eth0");
}

// Note [node 0's address]
TEST(DdprunNodeAddress, LoopbackIsRefusedOnlyForANameThatResolvesToIt) {
  EXPECT_TRUE(is_loopback_address("127.0.1.1"));
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_TRUE(is_loopback_address("::ffff:127.0.1.1"));
  EXPECT_FALSE(is_loopback_address("10.0.0.7"));
  EXPECT_FALSE(is_loopback_address("128.0.0.1"));
  EXPECT_FALSE(is_loopback_address("fe80::1"));
  EXPECT_TRUE(names_loopback_on_purpose("127.0.0.1"));
  EXPECT_TRUE(names_loopback_on_purpose("::1"));
  EXPECT_TRUE(names_loopback_on_purpose("localhost"));
  EXPECT_FALSE(names_loopback_on_purpose("node0"));
  std::string error;
  const auto local = resolve_host("127.0.0.1", error);
  ASSERT_EQ(local.size(), 1u) << error;
  EXPECT_EQ(local.front(), "127.0.0.1");
  EXPECT_TRUE(resolve_host("no-such-host.invalid", error).empty());
  EXPECT_FALSE(error.empty());
}

TEST(DdprunOptions, StoppedTimeoutAndSecretFile) {
  EXPECT_DOUBLE_EQ(parse({"train"}).options.stopped_timeout_s, 30);
  const LaunchOptions o =
      parse({"--stopped-timeout", "0", "--store-secret-file", "/s", "train"}).options;
  EXPECT_DOUBLE_EQ(o.stopped_timeout_s, 0);
  EXPECT_EQ(o.store_secret_file, "/s");
  EXPECT_NE(parse_error({"--stopped-timeout", "-1", "train"}).find(">= 0"), std::string::npos);
}

// Values past what the agent can hold are refused, not wrapped: a huge grace
// period once became a negative one (SIGKILL at once), a huge --nnodes a
// bad_alloc, and nnodes x nproc overflowed the count of ranks.
TEST(DdprunOptions, HugeValuesAreRefusedNotWrapped) {
  EXPECT_NE(parse_error({"--grace-period", "1e300", "train"}).find("at most 1e+09 seconds"),
            std::string::npos);
  EXPECT_NE(parse_error({"--stopped-timeout", "1e10", "train"}).find("at most 1e+09 seconds"),
            std::string::npos);
  EXPECT_NE(parse_error({"-n", "99999999999", "train"}).find("'99999999999': out of range"),
            std::string::npos);
  EXPECT_NE(parse_error({"--nnodes", "2000000000", "train"}).find("must be in 1..65536"),
            std::string::npos);
  EXPECT_NE(parse_error({"--nnodes", "1024", "-n", "8192", "train"})
                .find("--nnodes 1024 x --nproc-per-node 8192 = 8388608 ranks: at most 4194304"),
            std::string::npos);
}

TEST(DdprunOptions, TraceDirectory) {
  EXPECT_EQ(parse({"train"}).options.trace_dir, "");
  EXPECT_EQ(parse({"--trace", "out/t", "train"}).options.trace_dir, "out/t");
  EXPECT_EQ(parse({"--trace=t2", "train"}).options.trace_dir, "t2");
  EXPECT_NE(parse_error({"--trace=", "train"}).find("expected a directory"), std::string::npos);
  EXPECT_NE(std::string(kDdprunUsage).find("trace-merge DIR"), std::string::npos);
}

TEST(DdprunOptions, BackendMpiNamesMpirun) {
  const std::string e = parse_error({"-n", "2", "--backend", "mpi", "train"});
  EXPECT_NE(e.find("mpirun -n N PROGRAM"), std::string::npos) << e;
}

TEST(DdprunOptions, HelpAndVersion) {
  EXPECT_EQ(parse({"-h"}).action, ParseAction::help);
  EXPECT_EQ(parse({"-n", "2", "--help", "train"}).action, ParseAction::help);
  EXPECT_EQ(parse({"--version"}).action, ParseAction::version);
}

TEST(DdprunOptions, UsageDocumentsEveryFlag) {
  for (const char* flag : {"--nproc-per-node",
                           "--nnodes",
                           "--node-rank",
                           "--master-addr",
                           "--master-port",
                           "--rdzv-endpoint",
                           "--standalone",
                           "--backend",
                           "--max-restarts",
                           "--log-dir",
                           "--tee",
                           "--quiet",
                           "--grace-period",
                           "--rdzv-timeout",
                           "--no-prefix",
                           "--version",
                           "--help",
                           "--rdzv-port",
                           "--rdzv-bind",
                           "--store-secret-file",
                           "--stopped-timeout",
                           "--trace",
                           "--module",
                           "--no-python"}) {
    EXPECT_NE(std::string(kDdprunUsage).find(flag), std::string::npos) << flag;
  }
}

TEST(DdprunOptions, ErrorsSayWhatIsValid) {
  EXPECT_EQ(parse_error({"--bogus", "train"}), "unknown option '--bogus'");
  EXPECT_NE(parse_error({"--rdzv_backend", "c10d", "train"}).find("torchrun option"),
            std::string::npos);
  EXPECT_EQ(parse_error({"--nnodes"}), "--nnodes needs a value");
  EXPECT_EQ(parse_error({"-n", "four", "train"}),
            "--nproc-per-node 'four': expected a whole number");
  EXPECT_NE(parse_error({"-n", "0", "train"}).find("at least 1"), std::string::npos);
  EXPECT_NE(parse_error({"--nnodes", "2", "--node-rank", "2", "train"}).find("0..1"),
            std::string::npos);
  EXPECT_NE(parse_error({"--master-port", "70000", "train"}).find("1..65535"), std::string::npos);
  EXPECT_NE(parse_error({"--grace-period", "soon", "train"}).find("seconds"), std::string::npos);
  EXPECT_NE(parse_error({"--backend", "tcp", "train"}).find("auto, local, shm, gloo, nccl"),
            std::string::npos);
  EXPECT_NE(parse_error({"--tee", "train"}).find("--log-dir"), std::string::npos);
  EXPECT_NE(parse_error({"--standalone", "--nnodes", "2", "train"}).find("one node"),
            std::string::npos);
  EXPECT_EQ(parse_error({"--quiet=yes", "train"}), "--quiet takes no value");
  EXPECT_NE(parse_error({"-n", "2"}).find("missing PROGRAM"), std::string::npos);
}

TEST(DdprunOptions, ResolveNproc) {
  EXPECT_EQ(resolve_nproc("3", 0), 3);
  EXPECT_EQ(resolve_nproc("gpu", 8), 8);
  EXPECT_EQ(resolve_nproc("auto", 2), 2);
  EXPECT_EQ(resolve_nproc("auto", 0), 1);
  try {
    resolve_nproc("gpu", 0, "no CUDA driver");
    FAIL() << "gpu without GPUs must throw";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU is visible: no CUDA driver"), std::string::npos);
  }
  // The driver check's hint is train's flag, not ddprun's: left out, -n N named.
  try {
    resolve_nproc("gpu", 0,
                  "no NVIDIA driver. Install the driver; without a GPU, use --device cpu");
    FAIL() << "gpu without GPUs must throw";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Install the driver; pass a number of ranks (-n 4"), std::string::npos)
        << what;
    EXPECT_EQ(what.find("--device cpu"), std::string::npos) << what;
  }
}

TEST(DdprunOptions, ThreadsPerRank) {
  EXPECT_EQ(threads_per_rank(16, 4), 4);
  EXPECT_EQ(threads_per_rank(2, 4), 1);
  EXPECT_EQ(threads_per_rank(7, 2), 3);
  EXPECT_EQ(threads_per_rank(1, 1), 1);
}

bool has(const std::vector<std::string>& env, const std::string& entry) {
  return std::find(env.begin(), env.end(), entry) != env.end();
}

TEST(DdprunRankEnv, ContractReplacesInheritedThreadsOnlyWhenUnset) {
  const std::vector<std::string> base = {"PATH=/bin", "RANK=9", "OMP_NUM_THREADS=7"};
  const auto env = rank_environment(base, {.rank = 5,
                                           .local_rank = 1,
                                           .world_size = 8,
                                           .local_world_size = 4,
                                           .group_rank = 1,
                                           .group_world_size = 2,
                                           .master_addr = "10.0.0.1",
                                           .master_port = 1234,
                                           .store_addr = "10.0.0.1:1235",
                                           .restart_count = 2,
                                           .max_restarts = 3,
                                           .on_failure = "continue",
                                           .hang_timeout_s = "90",
                                           .run_id = "abc",
                                           .store_secret = "s3",
                                           .backend = "gloo",
                                           .threads = 3,
                                           .trace_dir = "/runs/trace"});
  for (const char* e : {"PATH=/bin",
                        "DDPRUN_ON_FAILURE=continue",
                        "DDPRUN_HANG_TIMEOUT_S=90",
                        "RANK=5",
                        "LOCAL_RANK=1",
                        "WORLD_SIZE=8",
                        "LOCAL_WORLD_SIZE=4",
                        "GROUP_RANK=1",
                        "MASTER_ADDR=10.0.0.1",
                        "MASTER_PORT=1234",
                        "DDPRUN_RESTART_COUNT=2",
                        "DDPRUN_RUN_ID=abc",
                        "DDPRUN_STORE=agent",
                        "DDP_STORE_SECRET=s3",
                        "DDP_BACKEND=gloo",
                        "DDP_TRACE=/runs/trace",
                        "OMP_NUM_THREADS=7",
                        "OPENBLAS_NUM_THREADS=3",
                        "DDPRUN_STORE_ADDR=10.0.0.1:1235",
                        "GROUP_WORLD_SIZE=2",
                        "ROLE_NAME=default",
                        "ROLE_RANK=5",
                        "ROLE_WORLD_SIZE=8",
                        "TORCHELASTIC_RESTART_COUNT=2",
                        "TORCHELASTIC_MAX_RESTARTS=3",
                        "TORCHELASTIC_RUN_ID=abc",
                        "TORCHELASTIC_USE_AGENT_STORE=False"}) {
    EXPECT_TRUE(has(env, e)) << e;
  }
  EXPECT_FALSE(has(env, "RANK=9"));
  EXPECT_EQ(std::count_if(env.begin(), env.end(),
                          [](const std::string& e) { return e.starts_with("OMP_NUM_THREADS="); }),
            1);
}

class DdprunProgramLookup : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("ddprun_lookup_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_ / "self");
    std::filesystem::create_directories(dir_ / "path");
    make_file(dir_ / "self" / "train", 0755);
    make_file(dir_ / "path" / "train", 0755);
    make_file(dir_ / "path" / "tool", 0755);
    make_file(dir_ / "path" / "data", 0644);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static void make_file(const std::filesystem::path& p, mode_t mode) {
    std::ofstream(p) << "#!/bin/sh\n";
    ::chmod(p.c_str(), mode);
  }
  std::filesystem::path dir_;
};

TEST_F(DdprunProgramLookup, NextToDdprunThenPath) {
  const std::string self = (dir_ / "self").string(),
                    path = "/nonexistent:" + (dir_ / "path").string();
  EXPECT_EQ(find_program("train", self, path).path, self + "/train");
  EXPECT_EQ(find_program("tool", self, path).path, (dir_ / "path" / "tool").string());
  const auto missing = find_program("nosuch", self, path);
  EXPECT_TRUE(missing.path.empty());
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_NE(missing.error.find("not found"), std::string::npos);
  EXPECT_EQ(find_program("data", self, path).exit_code, 127);  // not executable: skipped on PATH
}

// torchrun runs a .py with Python; so does ddprun (python3 -u SCRIPT, from PATH).
TEST_F(DdprunProgramLookup, PythonScriptsRunUnderPython3) {
  make_file(dir_ / "path" / "python3", 0755);
  make_file(dir_ / "train.py", 0644);  // a script need not be executable
  const std::string script = (dir_ / "train.py").string();
  const auto lookup = find_program(script, "", (dir_ / "path").string());
  EXPECT_EQ(lookup.path, (dir_ / "path" / "python3").string());
  EXPECT_EQ(lookup.interpreter_args, (std::vector<std::string>{"-u", script}));
  const auto no_python = find_program(script, "", "/nonexistent");
  EXPECT_EQ(no_python.exit_code, 127);
  EXPECT_NE(no_python.error.find("python3 is not on PATH"), std::string::npos) << no_python.error;
  EXPECT_TRUE(find_program("nosuch.py", "", (dir_ / "path").string()).path.empty());
  EXPECT_NE(find_program("nosuch", "", "").error.find("cmake --build build --target nosuch"),
            std::string::npos);
}

// torchrun's -m (python3 -u -m MODULE) and --no-python (a .py executed itself).
TEST_F(DdprunProgramLookup, ModulesAndNoPythonAsTorchrun) {
  make_file(dir_ / "path" / "python3", 0755);
  const std::string path = (dir_ / "path").string();
  const auto module = find_program("pkg.train", "", path, ProgramKind::module);
  EXPECT_EQ(module.path, (dir_ / "path" / "python3").string());
  EXPECT_EQ(module.interpreter_args, (std::vector<std::string>{"-u", "-m", "pkg.train"}));
  const auto file = find_program("pkg/train.py", "", path, ProgramKind::module);
  EXPECT_EQ(file.exit_code, 2);
  EXPECT_NE(file.error.find("-m pkg/train.py: expected a module name (pkg.train), not a file"),
            std::string::npos)
      << file.error;
  EXPECT_EQ(find_program("pkg.train", "", "/nonexistent", ProgramKind::module).exit_code, 127);
  make_file(dir_ / "run.py", 0755);
  const std::string script = (dir_ / "run.py").string();
  const auto itself = find_program(script, "", path, ProgramKind::no_python);
  EXPECT_EQ(itself.path, script);
  EXPECT_TRUE(itself.interpreter_args.empty());
  EXPECT_NE(find_program("tut.py", "", path, ProgramKind::no_python)
                .error.find("--no-python runs 'tut.py' itself"),
            std::string::npos);
  // torchrun's PYTHON_EXEC: the interpreter of scripts and modules.
  make_file(dir_ / "path" / "python3.11", 0755);
  EXPECT_EQ(find_program(script, "", path, ProgramKind::as_found, "python3.11").path,
            (dir_ / "path" / "python3.11").string());
  const std::string absolute = (dir_ / "path" / "python3.11").string();
  EXPECT_EQ(find_program("pkg.m", "", "", ProgramKind::module, absolute).path, absolute);
  EXPECT_NE(find_program(script, "", path, ProgramKind::as_found, "/no/python")
                .error.find("PYTHON_EXEC=/no/python is not an executable"),
            std::string::npos);
}

TEST(DdprunOptions, TorchrunSpellingsOfModuleTeeAndNnodes) {
  LaunchOptions o = parse({"-n", "2", "-m", "pkg.train", "--lr", "1"}).options;
  EXPECT_TRUE(o.module);
  EXPECT_EQ(o.program, "pkg.train");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--lr", "1"}));
  EXPECT_TRUE(parse({"--module", "pkg.train"}).options.module);
  EXPECT_TRUE(parse({"--no_python", "run.py"}).options.no_python);
  EXPECT_NE(
      parse_error({"-m", "--no-python", "pkg.train"}).find("-m/--module and --no-python together"),
      std::string::npos);
  o = parse({"--log-dir", "logs", "--tee", "3", "train", "3"}).options;
  EXPECT_TRUE(o.tee);
  EXPECT_EQ(o.program, "train");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"3"}));
  EXPECT_FALSE(parse({"--log-dir", "logs", "--tee=0", "train"}).options.tee);
  EXPECT_TRUE(parse({"--log-dir", "logs", "--tee", "train"}).options.tee);
  EXPECT_NE(parse_error({"--log-dir", "logs", "--tee", "1", "train"})
                .find("--tee 1: ddprun's --tee copies both stdout and stderr"),
            std::string::npos);
  EXPECT_NE(parse_error({"--log-dir", "logs", "--tee", "0:3,1:1", "train"}).find("per-rank maps"),
            std::string::npos);
  EXPECT_EQ(parse({"--nnodes=2:2", "--store-secret-file", "/dev/null", "train"}).options.nnodes, 2);
  EXPECT_NE(parse_error({"--nnodes=1:2", "train"})
                .find("--nnodes 1:2: torchrun's elastic MIN:MAX range is not ddprun's"),
            std::string::npos);
  EXPECT_EQ(parse_error({"--nnodes=1:x", "train"}), "--nnodes 'x': expected a whole number");
  // torchrun's --rdzv-endpoint HOST:0: free ports, on one node only.
  EXPECT_TRUE(parse({"--rdzv-endpoint", "localhost:0", "train"}).options.standalone);
  EXPECT_NE(parse_error({"--rdzv-endpoint", "localhost:0", "--nnodes", "2", "train"})
                .find("--rdzv-endpoint localhost:0: a free port cannot be found by the other "
                      "nodes of --nnodes 2"),
            std::string::npos);
  EXPECT_NE(parse_error({"--rdzv-endpoint", "localhost:0", "--master-port", "29600", "train"})
                .find("picks free ports, and --master-port 29600 names one"),
            std::string::npos);
}

// The line ddprun's failure summary quotes first (launcher/output.h).
TEST(DdprunSummary, ErrorLinesAreRecognized) {
  EXPECT_TRUE(reads_as_error("train: error: device cuda:3 is not available"));
  EXPECT_TRUE(reads_as_error("terminate called after ... what():  boom"));
  EXPECT_TRUE(reads_as_error("Traceback (most recent call last):"));
  EXPECT_TRUE(reads_as_error("RuntimeError: CUDA out of memory"));
  EXPECT_FALSE(reads_as_error("usage: train [options]"));
  EXPECT_FALSE(reads_as_error("  --epochs N   epochs to train"));
}

TEST_F(DdprunProgramLookup, PathsAreTakenAsIs) {
  const std::string tool = (dir_ / "path" / "tool").string();
  EXPECT_EQ(find_program(tool, "", "").path, tool);
  EXPECT_EQ(find_program((dir_ / "path" / "data").string(), "", "").exit_code, 126);
  EXPECT_EQ(find_program((dir_ / "nosuch").string(), "", "").exit_code, 127);
}

}  // namespace
}  // namespace ddp::launcher
