// The mpi backend: MPI_COMM_WORLD (duplicated) under mpirun/srun. Collectives
// run on the communication thread of ThreadedCommunicator as nonblocking MPI
// calls polled with MPI_Test, so a stopped rank gives a CommTimeoutError rather
// than a hang.
//
// Note [mpi lifetime]: the first make_mpi_communicator() initialises MPI with
// MPI_Init_thread(MPI_THREAD_MULTIPLE) unless the program already did, and then
// registers an atexit handler that calls MPI_Finalize. A program that initialised
// MPI itself also finalises it. Communicators destroyed after MPI_Finalize (for
// instance held in a static) skip their MPI_Comm_free.
//
// Note [mpi abandoned requests]: MPI cannot cancel a collective. When one times
// out, its request stays pending and MPI may still write into its buffers, so
// the communicator keeps those tensors alive for the rest of the process (and
// never frees its MPI communicator), and the exit handler skips MPI_Finalize,
// which would wait for the stopped rank. The job is broken by then: the program
// reports the CommTimeoutError and exits, and the launcher ends the other ranks.
//
// Note [mpi 16-bit floats]: MPI has no bf16/f16 here. Those tensors travel as
// MPI_UINT16_T with user-defined MPI_Ops that combine pairs in f32 through
// comm::reduce_buffers. avg is MPI_SUM then a scale by 1 / world size.
//
// CUDA tensors are staged through pinned host tensors by ThreadedCommunicator
// (Note [host staging] in collectives/host_staging.h), as for shm and gloo.
#include "collectives/backends.h"
#include "collectives/communicator_base.h"
#include "collectives/reduce_kernels.h"
#include "runtime/ops/ops.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <thread>
#include <vector>

namespace ddp {
namespace {

class MpiError : public Error {
  using Error::Error;
};

// Throws MpiError naming the call and MPI's text for the error code.
void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  throw MpiError(
      fmt::format("{} failed: {} (MPI error {})", call, std::string(text, length), code));
}

#define MPI_CHECK(call) check_mpi((call), #call)

// Set once a collective was abandoned (Note [mpi abandoned requests]).
std::atomic<bool> g_abandoned{false};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !g_abandoned.load()) MPI_Finalize();
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// The reductions of MPI_UINT16_T-typed bf16/f16 buffers (Note [mpi 16-bit floats]).
template <DType D, ReduceOp O>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {inout, in};
  comm::reduce_buffers(inout, srcs, 2, *len, D, O, 1.0);
}

struct HalfOps {
  MPI_Op ops[2][3];  // [bf16, f16][sum, max, min]
};
HalfOps g_half_ops;

template <DType D>
void create_half_ops(MPI_Op* ops) {
  MPI_CHECK(MPI_Op_create(&half_op<D, ReduceOp::sum>, 1, &ops[0]));
  MPI_CHECK(MPI_Op_create(&half_op<D, ReduceOp::max>, 1, &ops[1]));
  MPI_CHECK(MPI_Op_create(&half_op<D, ReduceOp::min>, 1, &ops[2]));
}

void init_mpi() {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  DDP_CHECK(!mpi_finalized(), "mpi: MPI was already finalised in this process");
  if (!initialized) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    std::atexit(finalize_at_exit);
  }
  int provided = 0;
  MPI_CHECK(MPI_Query_thread(&provided));
  DDP_CHECK(provided == MPI_THREAD_MULTIPLE,
            "mpi: the MPI library provides thread level {}, but the mpi backend calls MPI from its "
            "communication thread and needs MPI_THREAD_MULTIPLE ({}). Initialise MPI with "
            "MPI_Init_thread(MPI_THREAD_MULTIPLE) or let ddp initialise it",
            provided, MPI_THREAD_MULTIPLE);
  create_half_ops<DType::bf16>(g_half_ops.ops[0]);
  create_half_ops<DType::f16>(g_half_ops.ops[1]);
}

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, init_mpi);
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
  }
  DDP_ASSERT(false, "mpi: no MPI type for dtype {}", dtype_name(dtype));
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  const int which = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;  // avg: sum
  if (dtype == DType::bf16) return g_half_ops.ops[0][which];
  if (dtype == DType::f16) return g_half_ops.ops[1][which];
  const MPI_Op builtin[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
  return builtin[which];
}

const char* mpi_call_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "MPI_Iallreduce";
    case CollectiveKind::broadcast:
      return "MPI_Ibcast";
    case CollectiveKind::all_gather:
      return "MPI_Iallgather";
    case CollectiveKind::reduce_scatter:
      return "MPI_Ireduce_scatter_block";
    case CollectiveKind::reduce:
      return "MPI_Ireduce";
    case CollectiveKind::barrier:
      return "MPI_Ibarrier";
  }
  return "?";
}

class MpiCommunicator : public ThreadedCommunicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, CommOptions options)
      : ThreadedCommunicator(rank, size, options), comm_(comm) {
    start_thread();
  }
  ~MpiCommunicator() override;
  std::string backend() const override { return "mpi"; }

 protected:
  void run(const Collective& c) override;

 private:
  void run_host(const Collective& c);
  MPI_Request start(const Collective& c);
  void wait_request(const Collective& c, MPI_Request& request);
  void scale_for_avg(const Tensor& t) const;

  MPI_Comm comm_;
  std::vector<Tensor> abandoned_;  // Note [mpi abandoned requests]
};

MpiCommunicator::~MpiCommunicator() {
  stop_thread();
  if (!abandoned_.empty()) {
    new std::vector<Tensor>(std::move(abandoned_));  // leaked on purpose: MPI may still write
    return;
  }
  if (!mpi_finalized()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::run(const Collective& c) {
  try {
    run_host(c);
  } catch (const MpiError& e) {
    fail(c, e.what());
  }
}

void MpiCommunicator::run_host(const Collective& c) {
  MPI_Request request = start(c);
  wait_request(c, request);
  if (c.op != ReduceOp::avg) return;
  if (c.kind == CollectiveKind::all_reduce) scale_for_avg(c.input);
  if (c.kind == CollectiveKind::reduce_scatter) scale_for_avg(c.output);
  if (c.kind == CollectiveKind::reduce && rank() == c.root) scale_for_avg(c.input);
}

MPI_Request MpiCommunicator::start(const Collective& c) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (c.kind == CollectiveKind::barrier) {
    MPI_CHECK(MPI_Ibarrier(comm_, &r));
    return r;
  }
  const int64_t count = c.kind == CollectiveKind::reduce_scatter ? c.output.numel() : c.count();
  DDP_CHECK(count <= INT_MAX,
            "mpi: {} has {} elements, more than MPI's int count allows ({}); "
            "split the tensor",
            c.describe(), count, INT_MAX);
  const int n = static_cast<int>(count);
  void* data = c.input.data_ptr();
  const MPI_Datatype type = mpi_type(c.dtype());
  const MPI_Op op = mpi_op(c.dtype(), c.op);
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, n, type, op, comm_, &r));
      break;
    case CollectiveKind::broadcast:
      MPI_CHECK(MPI_Ibcast(data, n, type, c.root, comm_, &r));
      break;
    case CollectiveKind::all_gather:
      MPI_CHECK(MPI_Iallgather(data, n, type, c.output.data_ptr(), n, type, comm_, &r));
      break;
    case CollectiveKind::reduce_scatter:
      MPI_CHECK(MPI_Ireduce_scatter_block(data, c.output.data_ptr(), n, type, op, comm_, &r));
      break;
    case CollectiveKind::reduce:
      MPI_CHECK(MPI_Ireduce(rank() == c.root ? MPI_IN_PLACE : data, data, n, type, op, c.root,
                            comm_, &r));
      break;
    case CollectiveKind::barrier:
      break;
  }
  return r;
}

// Polls until the request completes or the timeout passes. MPI makes progress
// inside MPI_Test, so it spins; after a while it yields the core between tests
// (ranks often outnumber cores on a workstation).
void MpiCommunicator::wait_request(const Collective& c, MPI_Request& request) {
  constexpr int kSpinsBeforeYield = 2000;
  // Give up 10% (at most 200 ms) before the timeout, so the caller sees this error
  // (naming the MPI call) rather than Work::wait's bare one.
  const auto margin =
      std::min<std::chrono::milliseconds>(options().timeout / 10, std::chrono::milliseconds(200));
  const auto deadline = std::chrono::steady_clock::now() + options().timeout - margin;
  for (int spins = 0;; ++spins) {
    int done = 0;
    MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (spins % 64 == 0 && std::chrono::steady_clock::now() > deadline) {
      abandoned_.push_back(c.input);
      abandoned_.push_back(c.output);
      g_abandoned = true;
      fail_timeout(c, fmt::format("{} did not complete: a rank stopped, is stuck or issued a "
                                  "different collective (MPI does not say which); "
                                  "DDP_DEBUG=detail compares collectives across ranks",
                                  mpi_call_name(c.kind)));
    }
    if (spins > kSpinsBeforeYield) std::this_thread::yield();
  }
}

void MpiCommunicator::scale_for_avg(const Tensor& t) const {
  void* data = t.data_ptr();
  const void* srcs[1] = {data};
  comm::reduce_buffers(data, srcs, 1, t.numel(), t.dtype(), ReduceOp::avg, 1.0 / size());
}

}  // namespace

bool mpi_built() {
  return true;
}

std::shared_ptr<Communicator> make_mpi_communicator(CommOptions options) {
  check_comm_options(options, "mpi backend");
  ensure_mpi();
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  return std::make_shared<MpiCommunicator>(comm, rank, size, options);
}

}  // namespace ddp
