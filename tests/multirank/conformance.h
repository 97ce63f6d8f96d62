// Support of the backend conformance suite (conformance_test.cpp): the backend
// factory keyed by name and the closed-form inputs whose reductions are known.
#pragma once

#include "collectives/communicator.h"

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace ddp::test {

// One instantiation of the suite: a backend and the world size it runs with.
struct BackendCase {
  std::string backend;
  int world = 1;
};
std::string case_name(const BackendCase& c);  // "shm_4": a gtest parameter name
void PrintTo(const BackendCase& c, std::ostream* os);

// Note [backend factory]: the suite builds its communicators by name, inside
// each rank spawned by spawn_ranks (rank and size passed in; RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT and DDPRUN_RUN_ID in the environment). Adding a
// backend is adding a case to make_backend() and an INSTANTIATE_TEST_SUITE_P:
//   gloo: (built) a TcpStore on 127.0.0.1:MASTER_PORT, whose server rank 0 hosts
//         and the returned communicator owns; gloo_conformance_test.cpp has its
//         own suite (gloo's errors cannot name the failed rank).
//   mpi:  ranks come from mpirun, not from fork(): the suite then needs a
//         launcher that runs the body in this process under mpirun (see
//         run_on_ranks in conformance_test.cpp) and make_mpi_communicator(comm).
std::shared_ptr<Communicator> make_backend(const std::string& name, int rank, int size,
                                           CommOptions comm);

// Note [closed-form inputs]: rank r holds, at element i, with k = i % 7 + 1,
//   r + 1 times k, negated at odd i (u8: not negated).
// Every value and every sum, max, min and mean over up to 8 ranks is an integer
// or a half-integer below 256, exact in bf16 and f16, so results are compared
// exactly (avg within a rounding of the 1/size multiply).
double input_value(DType dtype, int rank, int64_t i);
// The reduction over ranks 0..size-1 of input_value(dtype, r, i).
double reduced_value(ReduceOp op, int size, int64_t i);
// The relative tolerance for `op` on `dtype`: 0 except avg.
double tolerance(ReduceOp op, DType dtype);

// The closed forms repeat every kPeriod elements (i % 7 and i % 2).
inline constexpr int64_t kPeriod = 14;

// A 1-d tensor of `count` elements whose element i is value(i).
Tensor make_tensor(DType dtype, int64_t count, const std::function<double(int64_t)>& value);
// The same for a value(i) that repeats every kPeriod elements: computed for the
// first kPeriod, then copied (fast for millions of elements).
Tensor make_periodic(DType dtype, int64_t count, const std::function<double(int64_t)>& value);
// Rank `rank`'s closed-form input of `count` elements.
Tensor make_input(DType dtype, int64_t count, int rank);
// The reduction by `op` over `size` ranks of elements base .. base + count - 1.
Tensor make_reduced(DType dtype, ReduceOp op, int size, int64_t count, int64_t base = 0);

// Throws std::runtime_error "<what>: element i is X, expected Y (N of M elements
// differ)" unless every element i of t equals want(i) within rel_tol.
void expect_values(const Tensor& t, const std::function<double(int64_t)>& want,
                   const std::string& what, double rel_tol = 0.0);
// The same against the elements of `want` (same dtype and count); bitwise-equal
// tensors pass without an element-wise comparison.
void expect_values(const Tensor& t, const Tensor& want, const std::string& what,
                   double rel_tol = 0.0);

// Throws std::runtime_error(message) unless cond (a rank's "assertion").
void require(bool cond, const std::string& message);

}  // namespace ddp::test
