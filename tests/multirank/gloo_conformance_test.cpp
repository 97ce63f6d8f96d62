// The gloo backend in real processes, world sizes 2, 3 and 4: every collective,
// op, dtype and count against the closed-form values of conformance.h, async use,
// and the fault behaviour (a killed rank fails the peers promptly, a stopped rank
// gives a CommTimeoutError, mismatched collectives are caught with
// DDP_DEBUG=detail). Rank 0 hosts the TcpStore server the ranks rendezvous on.
//
// Why not an instantiation of Conformance (conformance_test.cpp): its fixture is
// private to that file, and gloo cannot name the rank that failed (its errors
// name a socket), which the shared fault tests require. The values, the harness
// and make_backend("gloo", ...) are the shared ones.
#include "collectives/backends.h"
#include "collectives/store/tcp_store.h"
#include "runtime/env.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr DType kReducible[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
// Several of gloo's 1 MiB segments per rank, and no multiple of anything.
constexpr int64_t kLarge = 1'000'003;
const CommOptions kComm{.timeout = 30s};
const CommOptions kFaultComm{.timeout = 2s};

bool valid(ReduceOp op, DType dtype) {
  return op != ReduceOp::avg || is_floating(dtype);
}

std::vector<int64_t> counts_with(int64_t large) {
  return {0, 1, 7, 1023, large};
}

std::string what(const Communicator& comm, std::string_view op, DType dtype, int64_t count) {
  return fmt::format("rank {} of {}: {} of {} {}", comm.rank(), comm.size(), op, count,
                     dtype_name(dtype));
}

// One rank's gloo group: rank 0 also serves the store (destroyed after the communicator).
struct GlooRank {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Communicator> comm;
};

GlooRank connect_gloo(int rank, int size, CommOptions comm) {
  const int port = std::stoi(env::get("MASTER_PORT").value_or("0"));
  GlooRank g;
  if (rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.port = port;
    g.server = std::make_unique<TcpStoreServer>(server_options);
  }
  TcpStoreOptions store_options;
  store_options.host = "127.0.0.1";
  store_options.port = port;
  store_options.timeout = 30s;
  auto store = std::make_shared<TcpStore>(store_options);
  g.comm = make_gloo_communicator(
      store, {.rank = rank, .size = size, .hostname = "127.0.0.1", .comm = comm});
  return g;
}

class GlooConformance : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }

  // Runs body on every rank (a fresh group each) and expects every rank to succeed.
  void run_on_ranks(const std::function<void(Communicator&)>& body) {
    const auto results = spawn_ranks(world(),
                                     [&](int rank, int size) {
                                       GlooRank g = connect_gloo(rank, size, kComm);
                                       body(*g.comm);
                                       return 0;
                                     },
                                     {.timeout = 240s});
    for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  }
};

TEST_P(GlooConformance, AllReduce) {
  run_on_ranks([](Communicator& comm) {
    require(comm.backend() == "gloo", "backend() is " + comm.backend());
    for (DType dtype : kReducible) {
      for (ReduceOp op : kOps) {
        if (!valid(op, dtype)) continue;
        for (int64_t count : counts_with(kLarge)) {
          Tensor t = make_input(dtype, count, comm.rank());
          comm.all_reduce(t, op)->wait();
          expect_values(
              t, [&](int64_t i) { return reduced_value(op, comm.size(), i); },
              what(comm, fmt::format("all_reduce({})", reduce_op_name(op)), dtype, count),
              tolerance(op, dtype));
        }
      }
    }
  });
}

TEST_P(GlooConformance, BroadcastFromEveryRoot) {
  run_on_ranks([](Communicator& comm) {
    for (int root = 0; root < comm.size(); ++root) {
      for (DType dtype : kAllDTypes) {
        for (int64_t count : counts_with(root == 0 ? kLarge : 1025)) {
          Tensor t = make_input(dtype, count, comm.rank());
          comm.broadcast(t, root)->wait();
          expect_values(
              t, [&](int64_t i) { return input_value(dtype, root, i); },
              what(comm, fmt::format("broadcast(root {})", root), dtype, count));
        }
      }
    }
  });
}

TEST_P(GlooConformance, AllGather) {
  run_on_ranks([](Communicator& comm) {
    for (DType dtype : kAllDTypes) {
      for (int64_t n : counts_with(kLarge / comm.size())) {
        Tensor in = make_input(dtype, n, comm.rank());
        Tensor out = zeros({n * comm.size()}, {.dtype = dtype});
        comm.all_gather(in, out)->wait();
        expect_values(
            out, [&](int64_t j) { return input_value(dtype, static_cast<int>(j / n), j % n); },
            what(comm, "all_gather", dtype, n));
      }
    }
  });
}

TEST_P(GlooConformance, ReduceScatter) {
  run_on_ranks([](Communicator& comm) {
    for (DType dtype : kReducible) {
      for (ReduceOp op : kOps) {
        if (!valid(op, dtype)) continue;
        for (int64_t n : counts_with(kLarge / comm.size())) {
          Tensor in = make_input(dtype, n * comm.size(), comm.rank());
          Tensor out = zeros({n}, {.dtype = dtype});
          comm.reduce_scatter(in, out, op)->wait();
          const int64_t base = comm.rank() * n;
          expect_values(
              out, [&](int64_t i) { return reduced_value(op, comm.size(), base + i); },
              what(comm, fmt::format("reduce_scatter({})", reduce_op_name(op)), dtype, n),
              tolerance(op, dtype));
          expect_values(
              in, [&](int64_t i) { return input_value(dtype, comm.rank(), i); },
              what(comm, "reduce_scatter leaves its input alone", dtype, n));
        }
      }
    }
  });
}

TEST_P(GlooConformance, ReduceToEveryRoot) {
  run_on_ranks([](Communicator& comm) {
    for (int root = 0; root < comm.size(); ++root) {
      for (DType dtype : kReducible) {
        for (ReduceOp op : kOps) {
          if (!valid(op, dtype)) continue;
          const bool large = root == comm.size() - 1 && op == ReduceOp::sum;
          for (int64_t count : counts_with(large ? kLarge : 1025)) {
            Tensor t = make_input(dtype, count, comm.rank());
            comm.reduce(t, root, op)->wait();
            if (comm.rank() != root) continue;  // other ranks' tensors are unspecified
            expect_values(
                t, [&](int64_t i) { return reduced_value(op, comm.size(), i); },
                what(comm, fmt::format("reduce({}, root {})", reduce_op_name(op), root), dtype,
                     count),
                tolerance(op, dtype));
          }
        }
      }
    }
  });
}

// Every rank leaves a mark before the barrier and finds every other rank's after it.
TEST_P(GlooConformance, BarrierOrdersSideEffects) {
  char pattern[] = "/tmp/ddp-gloo-barrier-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::filesystem::path dir = pattern;
  run_on_ranks([&](Communicator& comm) {
    for (int round = 0; round < 10; ++round) {
      if (round == 0) std::this_thread::sleep_for(comm.rank() * 50ms);  // skew the arrivals
      std::FILE* mark = std::fopen((dir / fmt::format("{}-{}", round, comm.rank())).c_str(), "w");
      require(mark != nullptr, "cannot create a mark file");
      std::fclose(mark);
      comm.barrier()->wait();
      for (int q = 0; q < comm.size(); ++q) {
        require(
            std::filesystem::exists(dir / fmt::format("{}-{}", round, q)),
            fmt::format("rank {} passed barrier {} before rank {} arrived", comm.rank(), round, q));
      }
    }
  });
  std::filesystem::remove_all(dir);
}

// Several collectives in flight before the first wait, waited in reverse order.
TEST_P(GlooConformance, AsyncCollectivesInFlight) {
  run_on_ranks([](Communicator& comm) {
    const int r = comm.rank();
    const int last = comm.size() - 1;
    const int64_t first = comm.next_sequence();
    Tensor a = make_input(DType::f32, 1023, r);
    Tensor b = make_input(DType::bf16, 300'001, r);
    Tensor in = make_input(DType::i32, 7, r);
    Tensor out = zeros({7 * comm.size()}, {.dtype = DType::i32});
    Tensor c = make_input(DType::i64, 1, r);
    std::vector<std::shared_ptr<Work>> works = {
        comm.all_reduce(a, ReduceOp::sum), comm.all_reduce(b, ReduceOp::max),
        comm.all_gather(in, out), comm.broadcast(c, last), comm.barrier()};
    for (size_t k = 0; k < works.size(); ++k) {
      require(works[k]->sequence() == first + static_cast<int64_t>(k),
              fmt::format("work {} has sequence {}", k, works[k]->sequence()));
    }
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    for (const auto& w : works) require(w->done(), "a waited work is not done()");
    const int size = comm.size();
    expect_values(
        a, [&](int64_t i) { return reduced_value(ReduceOp::sum, size, i); }, "async a");
    expect_values(
        b, [&](int64_t i) { return reduced_value(ReduceOp::max, size, i); }, "async b");
    expect_values(
        out, [&](int64_t j) { return input_value(DType::i32, static_cast<int>(j / 7), j % 7); },
        "async all_gather");
    expect_values(
        c, [&](int64_t) { return input_value(DType::i64, last, 0); }, "async broadcast");
  });
}

// ---- faults: a prompt, typed error, never a hang ------------------------------------------

struct Failure {
  bool timed_out = false;  // a CommTimeoutError
  double seconds = 0.0;    // from the call to the throw
  std::string text;
};

// Runs the collective, which must throw a CommError of the gloo backend naming the sequence.
Failure expect_comm_error(const std::function<void()>& collective) {
  const auto start = Clock::now();
  try {
    collective();
  } catch (const CommError& e) {
    Failure f{dynamic_cast<const CommTimeoutError*>(&e) != nullptr,
              std::chrono::duration<double>(Clock::now() - start).count(), e.what()};
    require(f.text.find("on the gloo backend") != std::string::npos && e.sequence() >= 0,
            "the error does not name the backend and sequence: " + f.text);
    return f;
  }
  throw std::runtime_error("the collective succeeded although a rank was faulty");
}

const double kFaultLimit = std::chrono::duration<double>(kFaultComm.timeout).count();

TEST_P(GlooConformance, KilledRankFailsThePeers) {
  const auto results = spawn_ranks(world(), [&](int rank, int size) {
    GlooRank g = connect_gloo(rank, size, kFaultComm);
    Tensor t = make_input(DType::f32, 1023, rank);
    g.comm->all_reduce(t)->wait();  // the group works before the fault
    if (rank == 1) inject_fault(Fault::kill);
    const Failure f = expect_comm_error([&] { g.comm->all_reduce(t)->wait(); });
    require(!f.timed_out && f.seconds < kFaultLimit / 2,
            fmt::format("expected a prompt CommError, got after {:.2f} s: {}", f.seconds, f.text));
    // Broken after the first failure: the next collective fails at once.
    const auto start = Clock::now();
    expect_comm_error([&] { g.comm->barrier()->wait(); });
    require(Clock::now() - start < 100ms, "a broken communicator did not fail at once");
    return 0;
  });
  EXPECT_EQ(results[1].signal, SIGKILL) << results[1].describe();
  for (const RankResult& r : results) {
    if (r.rank != 1) {
      EXPECT_TRUE(r.ok()) << r.describe();
    }
  }
}

// Note [gloo timeout spread]: the ranks waiting on the stopped one time out; gloo
// then closes their connections, so a rank that waited on one of them may see
// "connection closed" (a CommError) at the same moment instead of its own timeout.
TEST_P(GlooConformance, StoppedRankTimesOut) {
  constexpr int kTimedOut = 0, kClosed = 10;  // exit codes of the ranks that were not stopped
  SpawnOptions spawn;
  for (int r = 0; r < world(); ++r) {
    if (r != 1) spawn.wait_for.push_back(r);  // then SIGKILL the stopped rank 1
  }
  const auto results = spawn_ranks(
      world(),
      [&](int rank, int size) {
        GlooRank g = connect_gloo(rank, size, kFaultComm);
        if (rank == 1) inject_fault(Fault::stop);
        Tensor t = make_input(DType::f32, 1023, rank);
        // gloo gives up before Work::wait does (Note [gloo deadline]): its error arrives.
        const Failure f = expect_comm_error([&] { g.comm->all_reduce(t)->wait(); });
        require(f.seconds > kFaultLimit * 0.8 && f.seconds < kFaultLimit * 3,
                fmt::format("expected the failure after about {:.1f} s, got it after {:.2f} s: {}",
                            kFaultLimit, f.seconds, f.text));
        return f.timed_out ? kTimedOut : kClosed;
      },
      spawn);
  EXPECT_TRUE(results[1].killed_by_harness) << results[1].describe();
  int timed_out = 0;
  for (const RankResult& r : results) {
    if (r.rank == 1) continue;
    EXPECT_TRUE(r.signal == 0 && (r.exit_code == kTimedOut || r.exit_code == kClosed))
        << r.describe();
    timed_out += r.exit_code == kTimedOut ? 1 : 0;
  }
  EXPECT_GE(timed_out, 1) << "no rank reported a CommTimeoutError";
  if (world() == 2) {
    EXPECT_EQ(results[0].exit_code, kTimedOut) << results[0].describe();
  }
}

// Rank 1 broadcasts while the others all-reduce: DDP_DEBUG=detail fails every rank.
TEST_P(GlooConformance, MismatchFailsWithDebugDetail) {
  const auto results = spawn_ranks(
      world(),
      [&](int rank, int size) {
        GlooRank g = connect_gloo(rank, size, kFaultComm);
        Tensor t = make_input(DType::f32, 7, rank);
        try {
          (rank == 1 ? g.comm->broadcast(t, 0) : g.comm->all_reduce(t))->wait();
        } catch (const CommError& e) {
          require(std::string(e.what()).find("collective mismatch") != std::string::npos,
                  std::string("expected 'collective mismatch', got: ") + e.what());
          return 0;
        }
        throw std::runtime_error("mismatched collectives succeeded");
      },
      {.env = {{"DDP_DEBUG", "detail"}}});
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooConformance, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return fmt::format("gloo_{}", info.param); });

const GlooOptions kLoneRank{.rank = 0, .size = 1, .hostname = "127.0.0.1", .comm = {}};

// World size 1 needs no store: the collectives are the identity.
TEST(GlooCommunicator, WorldSizeOneWithoutAStore) {
  auto comm = make_gloo_communicator(nullptr, kLoneRank);
  EXPECT_EQ(comm->backend(), "gloo");
  Tensor t = make_input(DType::bf16, 1000, 0);
  comm->all_reduce(t, ReduceOp::avg)->wait();
  expect_values(
      t, [](int64_t i) { return input_value(DType::bf16, 0, i); }, "avg over 1 rank");
  Tensor out = zeros({1000}, {.dtype = DType::bf16});
  comm->all_gather(t, out)->wait();
  expect_values(
      out, [](int64_t i) { return input_value(DType::bf16, 0, i); }, "all_gather");
  comm->barrier()->wait();
}

TEST(GlooCommunicator, WorldSizeTwoNeedsAStore) {
  EXPECT_THROW(make_gloo_communicator(
                   nullptr, GlooOptions{.rank = 0, .size = 2, .hostname = "", .comm = {}}),
               ValueError);
}

TEST(GlooCommunicator, RejectsU8ReductionsAndIntegerAvg) {
  auto comm = make_gloo_communicator(nullptr, kLoneRank);
  Tensor u8 = zeros({4}, {.dtype = DType::u8});
  EXPECT_THROW(comm->all_reduce(u8), ValueError);
  Tensor i32 = zeros({4}, {.dtype = DType::i32});
  EXPECT_THROW(comm->all_reduce(i32, ReduceOp::avg), ValueError);
}

TEST(GlooCommunicator, UnresolvableHostnameIsACommErrorNamingIt) {
  try {
    make_gloo_communicator(nullptr,
                           {.rank = 0, .size = 1, .hostname = "no-such-host.invalid", .comm = {}});
    FAIL() << "connected on an unresolvable hostname";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::test
