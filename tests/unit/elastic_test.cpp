// The ranks' side of Note [elastic membership] (collectives/elastic.h) in one
// process: the membership keys, the prefix store, and regroup() against a real
// store -- giving up when ddprun reports nothing or leaves the rank out, and a
// membership of one forming its communicator. The processes: tests/e2e/train_elastic.sh.
#include "collectives/elastic.h"

#include "collectives/communicator.h"
#include "collectives/store/tcp_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace ddp {
namespace {

using namespace std::chrono_literals;

TEST(ElasticMembership, ListsRoundTripAndBadOnesAreNamed) {
  EXPECT_EQ(elastic::format_members({0, 1, 3}), "0,1,3");
  EXPECT_EQ(elastic::parse_members("0,1,3"), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(elastic::parse_members("7"), (std::vector<int>{7}));
  EXPECT_EQ(elastic::members_key(2), "elastic/2/members");
  EXPECT_EQ(elastic::arrived_key(2, 5), "elastic/2/arrived/5");
  for (const char* bad : {"0,,1", "a", "1,-2", "3,", ""}) {
    try {
      elastic::parse_members(bad);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("expected launch ranks such as 0,1,3"),
                std::string::npos)
          << e.what();
    }
  }
}

// Note [group stop]: the value ddprun writes, and what is not one.
TEST(ElasticMembership, AStopRoundTripsAndBadOnesAreNone) {
  const std::string text =
      elastic::format_stop({.epoch = 3, .exit_code = 137, .why = "2 ranks would be left"});
  EXPECT_EQ(text, "3 137 2 ranks would be left");
  const auto stop = elastic::parse_stop(text);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->epoch, 3);
  EXPECT_EQ(stop->exit_code, 137);
  EXPECT_EQ(stop->why, "2 ranks would be left");
  for (const char* bad : {"", "3", "x 1 why", "0 1 why", "-2 1 why"})
    EXPECT_FALSE(elastic::parse_stop(bad).has_value()) << bad;
}

// Two nodes of two ranks: launch ranks 0,1 on node 0 and 2,3 on node 1; a
// replacement (appended) runs on the node of the rank it replaces.
TEST(ElasticMembership, LocalNumbersCountTheMembersOnTheRanksNode) {
  using P = std::pair<int, int>;
  EXPECT_EQ(elastic::local_place({0, 1, 3}, 3, 2), P(0, 1));
  EXPECT_EQ(elastic::local_place({0, 1, 3}, 1, 2), P(1, 2));
  EXPECT_EQ(elastic::local_place({0, 1, 3, 2}, 2, 2), P(1, 2));
  EXPECT_EQ(elastic::local_place({0, 3}, 0, 2), P(0, 1));
  EXPECT_EQ(elastic::local_place({0, 2, 3}, 3, 4), P(2, 3));  // one node: the rank itself
}

class Regroup : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_shared<TcpStoreServer>(TcpStoreServerOptions{});
    store_ = std::make_shared<TcpStore>(TcpStoreOptions{
        .host = "127.0.0.1", .port = server_->port(), .secret = "", .timeout = 5000ms});
    pg_.store = store_;
    pg_.backend = "shm";
    pg_.shm_run_id = fmt::format("elastic-unit-{}", getpid());
    pg_.launch_rank = 1;
    pg_.launch_local_world_size = 3;
    pg_.env.rank = pg_.env.local_rank = 1;
    pg_.env.world_size = pg_.env.local_world_size = 3;
  }
  std::string regroup_error(std::chrono::milliseconds timeout) {
    try {
      regroup(pg_, 10, timeout, "the peer died");
    } catch (const CommError& e) {
      return e.what();
    }
    return "<no error>";
  }
  std::shared_ptr<TcpStoreServer> server_;
  std::shared_ptr<TcpStore> store_;
  ProcessGroup pg_;
};

TEST_F(Regroup, PrefixStoreKeysLiveBehindThePrefix) {
  PrefixStore scoped(store_, "elastic/4/");
  scoped.set("k", std::string("v"));
  EXPECT_EQ(store_->get_string("elastic/4/k"), "v");
  EXPECT_TRUE(scoped.check({"k"}));
  EXPECT_FALSE(store_->check({"k"}));
  EXPECT_EQ(scoped.add("n", 3), 3);
  EXPECT_EQ(store_->add("elastic/4/n", 1), 4);
}

TEST_F(Regroup, WithoutANewMembershipTheRankGivesUpNamingTheCause) {
  const std::string e = regroup_error(100ms);
  EXPECT_NE(e.find("rank 1 (launch rank 1) cannot regroup after its collective failed (the peer "
                   "died): ddprun reported no rank gone in 0.1 s"),
            std::string::npos)
      << e;
}

TEST_F(Regroup, AMembershipWithoutThisRankIsNamed) {
  store_->set(elastic::members_key(1), std::string("0,2"));
  store_->set(elastic::kEpochKey, std::string("1"));
  const std::string e = regroup_error(1000ms);
  EXPECT_NE(e.find("membership 1 (0,2) leaves this rank out"), std::string::npos) << e;
}

TEST_F(Regroup, AMemberThatNeverArrivesIsNamed) {
  store_->set(elastic::members_key(1), std::string("1,2"));
  store_->set(elastic::kEpochKey, std::string("1"));
  const std::string e = regroup_error(200ms);
  EXPECT_NE(e.find("membership 1 (1,2): not every member arrived in 0.2 s"), std::string::npos)
      << e;
  EXPECT_EQ(store_->get_string(elastic::arrived_key(1, 1)), "10");  // it announced itself
}

// A second death while the first regroup waits: the rank moves to the newer
// membership, forms its communicator there, and copies from the most advanced.
TEST_F(Regroup, ANewerMembershipWinsAndTheCommunicatorIsFormed) {
  store_->set(elastic::members_key(1), std::string("1,2"));
  store_->set(elastic::kEpochKey, std::string("1"));
  store_->set(elastic::members_key(2), std::string("1"));
  store_->set(elastic::kEpochKey, std::string("2"));
  const ddp::Regroup g = regroup(pg_, 12, 2000ms, "the peer died");
  EXPECT_EQ(g.epoch, 2);
  EXPECT_EQ(g.members, (std::vector<int>{1}));
  EXPECT_EQ(g.values, (std::vector<int64_t>{12}));
  EXPECT_EQ(g.source, 0);
  EXPECT_EQ(g.old_world_size, 3);
  ASSERT_NE(pg_.comm, nullptr);
  EXPECT_EQ(pg_.comm->size(), 1);
  EXPECT_EQ(pg_.env.rank, 0);
  EXPECT_EQ(pg_.env.world_size, 1);
  EXPECT_EQ(pg_.env.local_rank, 0);
  EXPECT_EQ(pg_.env.local_world_size, 1);
  EXPECT_EQ(pg_.membership, 2);
  Tensor t = from_vector<float>({2.0f}, {1});
  pg_.comm->all_reduce(t, ReduceOp::sum)->wait();
  EXPECT_EQ(t.to_vector<float>()[0], 2.0f);
  EXPECT_EQ(g.stop, "");  // no stop in the store: the group goes on
}

// Note [group stop]: the membership ddprun marked as the last says so, and an
// older stop does not mark a later membership.
TEST_F(Regroup, TheStopMembershipSaysWhy) {
  store_->set(elastic::kStopKey, std::string("1 137 rank 0 died; fewer than --min-ranks 2"));
  store_->set(elastic::members_key(1), std::string("1"));
  store_->set(elastic::kEpochKey, std::string("1"));
  const ddp::Regroup g = regroup(pg_, 5, 2000ms, "the peer died");
  EXPECT_EQ(g.epoch, 1);
  EXPECT_EQ(g.stop, "rank 0 died; fewer than --min-ranks 2");
  pg_.comm.reset();
  store_->set(elastic::members_key(2), std::string("1"));
  store_->set(elastic::kEpochKey, std::string("2"));
  EXPECT_EQ(regroup(pg_, 5, 2000ms, "the peer died").stop, "");
}

}  // namespace
}  // namespace ddp
