// launcher/rendezvous.h: Note [exit barrier] -- node 0's ddprun keeps the agents'
// store up until the other agents have read the end there. Two agents in one
// process on 127.0.0.1; the whole launch: e2e.netns_ddprun_2x1, e2e.ddprun_nnodes.
#include "collectives/store/store.h"
#include "collectives/store/tcp_store.h"
#include "launcher/rendezvous.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <random>
#include <stdexcept>

namespace ddp::launcher {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A free port below the kernel's ephemeral range (32768 by default), as
// tests/e2e/lib_ports.sh draws one: a port from bind(0) could be handed to another
// test's connection before node 0's store listens on it.
int free_port() {
  std::mt19937 draw(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    TcpStoreServerOptions probe;
    probe.port = std::uniform_int_distribution<int>(10000, 32000)(draw);
    try {
      TcpStoreServer server(probe);
      return probe.port;
    } catch (const StoreError&) {
      // taken: draw again
    }
  }
  throw std::runtime_error("no free port in 10000-32000 after 200 draws");
}

RendezvousOptions agent(int node_rank, int port, bool elastic) {
  RendezvousOptions o;
  o.port = port;
  o.nnodes = 2;
  o.node_rank = node_rank;
  o.timeout = 20s;
  o.secret = "rendezvous-exit-test";
  o.elastic = elastic;
  return o;
}

TEST(RendezvousExitBarrier, NodeZeroKeepsItsStoreUntilTheOtherAgentHasReadTheEnd) {
  for (const bool elastic : {false, true}) {
    SCOPED_TRACE(elastic ? "--on-failure continue" : "--on-failure restart");
    const int port = free_port();
    Rendezvous node0(agent(0, port, elastic));
    Rendezvous node1(agent(1, port, elastic));
    auto joined = std::async(std::launch::async, [&] { node1.begin_attempt(0); });
    node0.begin_attempt(0);
    joined.get();

    // Node 1 finished first and read the end before node 0 had; node 0 then sees
    // every node done.
    node1.publish_done();
    ASSERT_FALSE(node1.all_done());
    node0.publish_done();
    ASSERT_TRUE(node0.all_done());
    const auto start = Clock::now();
    auto left = std::async(std::launch::async, [&] { node0.wait_for_others_to_leave(10s); });
    EXPECT_EQ(left.wait_for(300ms), std::future_status::timeout)
        << "node 0 closed its store before node 1 had read the end there";
    // Node 1's next reads: no failure, every node done -- not "lost the store".
    const auto failure = node1.remote_failure();
    EXPECT_FALSE(failure.has_value()) << failure->what;
    EXPECT_TRUE(node1.all_done());
    node1.end_attempt();  // its connection closes: node/1/closed
    ASSERT_EQ(left.wait_for(5s), std::future_status::ready)
        << "node 0 did not see node 1 leave (waited for its 10 s timeout)";
    EXPECT_LT(Clock::now() - start, 5s);
    node0.end_attempt();
  }
}

}  // namespace
}  // namespace ddp::launcher
