// The mpi backend under mpirun (its ranks come from the launcher, not from fork,
// so this is a program rather than a gtest suite; it lives in a folder of its own
// so that the multirank glob does not compile it into ddp_multirank_tests).
//
//   mpirun -np 3 mpi_conformance             every collective, op, dtype and count
//                                            against conformance.h's closed forms;
//                                            prints "N passed, M failed" on rank 0
//                                            and exits non-zero when a check failed
//   mpirun -np 3 mpi_conformance --stop-rank-1
//                                            rank 1 stops itself (SIGSTOP); the
//                                            others must get a CommTimeoutError
//                                            within the 2 s timeout; rank 0 prints
//                                            "stopped rank: PASS" or "... FAIL" and
//                                            ends the job with MPI_Abort, which also
//                                            kills the stopped rank.
#include "collectives/backends.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/mpi/sum_results.h"

#include <mpi.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr DType kReducible[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
// Under a sanitizer (CI's second phase) smaller: ddp's mpi backend hands a tensor to
// MPI whole (no chunks of its own), and the -O3 build runs the full count.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int64_t kLarge = 400'009;
#else
constexpr int64_t kLarge = 1'000'003;
#endif

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

struct Tally {
  int passed = 0;
  int failed = 0;
  // Runs one named check; a throw is a failure, printed with the rank.
  void check(const std::string& name, int rank, const std::function<void()>& body) {
    try {
      body();
      ++passed;
    } catch (const std::exception& e) {
      ++failed;
      std::fprintf(stderr, "[rank %d] FAILED %s: %s\n", rank, name.c_str(), e.what());
    }
  }
};

void all_reduce(Communicator& comm) {
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
}

void broadcast(Communicator& comm) {
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
}

void all_gather(Communicator& comm) {
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
}

void reduce_scatter(Communicator& comm) {
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
      }
    }
  }
}

void reduce(Communicator& comm) {
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
}

// Several collectives in flight before the first wait, waited in reverse order.
void async_in_flight(Communicator& comm) {
  const int r = comm.rank();
  const int last = comm.size() - 1;
  Tensor a = make_input(DType::f32, 1023, r);
  Tensor b = make_input(DType::bf16, 300'001, r);
  Tensor in = make_input(DType::i32, 7, r);
  Tensor out = zeros({7 * comm.size()}, {.dtype = DType::i32});
  Tensor c = make_input(DType::i64, 1, r);
  std::vector<std::shared_ptr<Work>> works = {
      comm.all_reduce(a, ReduceOp::sum), comm.all_reduce(b, ReduceOp::max),
      comm.all_gather(in, out), comm.broadcast(c, last), comm.barrier()};
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
      c, [&](int64_t) { return input_value(DType::i64, last, 0); }, "async bcast");
}

// With DDP_DEBUG=detail, rank 1 broadcasting while the others all-reduce fails every rank.
void mismatch_with_debug_detail(int rank) {
  setenv("DDP_DEBUG", "detail", 1);
  auto comm = make_mpi_communicator({.timeout = 10s});
  unsetenv("DDP_DEBUG");
  Tensor t = make_input(DType::f32, 7, rank);
  try {
    (rank == 1 ? comm->broadcast(t, 0) : comm->all_reduce(t))->wait();
  } catch (const CommError& e) {
    require(std::string(e.what()).find("collective mismatch") != std::string::npos,
            std::string("expected 'collective mismatch', got: ") + e.what());
    return;
  }
  throw std::runtime_error("mismatched collectives succeeded");
}

int run_conformance() {
  auto comm = make_mpi_communicator({.timeout = 60s});
  const int rank = comm->rank();
  Tally tally;
  tally.check("backend name", rank, [&] { require(comm->backend() == "mpi", comm->backend()); });
  tally.check("all_reduce", rank, [&] { all_reduce(*comm); });
  tally.check("broadcast", rank, [&] { broadcast(*comm); });
  tally.check("all_gather", rank, [&] { all_gather(*comm); });
  tally.check("reduce_scatter", rank, [&] { reduce_scatter(*comm); });
  tally.check("reduce", rank, [&] { reduce(*comm); });
  tally.check("async in flight", rank, [&] { async_in_flight(*comm); });
  tally.check("barrier", rank, [&] { comm->barrier()->wait(); });
  if (comm->size() >= 2) {
    tally.check("mismatch with DDP_DEBUG=detail", rank, [&] { mismatch_with_debug_detail(rank); });
  }
  return sum_results(*comm, rank, "mpi conformance", tally.passed, tally.failed);
}

// Rank 1 stops; every other rank must see a CommTimeoutError after about the timeout.
int run_stopped_rank() {
  const CommOptions options{.timeout = 2s};
  auto comm = make_mpi_communicator(options);
  const int rank = comm->rank();
  Tensor t = make_input(DType::f32, 1023, rank);
  comm->all_reduce(t)->wait();  // the group works before the fault
  if (rank == 1) raise(SIGSTOP);
  const auto start = Clock::now();
  std::string verdict = "FAIL: the all_reduce succeeded although rank 1 was stopped";
  try {
    comm->all_reduce(t)->wait();  // the backend gives up first, naming the MPI call
  } catch (const CommTimeoutError& e) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    const bool in_time = waited > 1.6 && waited < 6.0 &&
                         std::string(e.what()).find("MPI_Iallreduce") != std::string::npos;
    verdict = fmt::format("{}: CommTimeoutError after {:.2f} s: {}", in_time ? "PASS" : "FAIL",
                          waited, e.what());
  } catch (const std::exception& e) {
    verdict = fmt::format("FAIL: expected a CommTimeoutError, got: {}", e.what());
  }
  std::printf("[rank %d] stopped rank: %s\n", rank, verdict.c_str());
  std::fflush(stdout);
  if (rank == 0) {
    std::this_thread::sleep_for(500ms);  // let the other ranks print theirs
    // The job cannot end normally with a stopped rank and a pending request: abort
    // it (this also kills rank 1). The exit code is not the verdict; the text is.
    MPI_Abort(MPI_COMM_WORLD, verdict.starts_with("PASS") ? 0 : 1);
  }
  std::this_thread::sleep_for(60s);  // rank 0's MPI_Abort ends this process
  return 1;
}

}  // namespace
}  // namespace ddp::test

int main(int argc, char** argv) {
  const bool stop = argc > 1 && std::string(argv[1]) == "--stop-rank-1";
  try {
    return stop ? ddp::test::run_stopped_rank() : ddp::test::run_conformance();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_conformance: %s\n", e.what());
    return 1;
  }
}
