#include "tests/multirank/conformance.h"

#include "collectives/backends.h"
#include "collectives/store/tcp_store.h"
#include "runtime/env.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace ddp::test {
namespace {

void store(void* data, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      return;
    case DType::bf16:
      static_cast<BFloat16*>(data)[i] = {float_to_bf16(static_cast<float>(v))};
      return;
    case DType::f16:
      static_cast<Half*>(data)[i] = {float_to_f16(static_cast<float>(v))};
      return;
    case DType::i32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
      return;
    case DType::i64:
      static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v);
      return;
    case DType::u8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      return;
  }
}

double load(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(data)[i];
    case DType::bf16:
      return bf16_to_float(static_cast<const BFloat16*>(data)[i].bits);
    case DType::f16:
      return f16_to_float(static_cast<const Half*>(data)[i].bits);
    case DType::i32:
      return static_cast<const int32_t*>(data)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::u8:
      return static_cast<const uint8_t*>(data)[i];
  }
  return NAN;
}

// Rank 0 hosts the TcpStore server on MASTER_PORT. The server must outlive the
// group: the returned pointer owns both and releases the communicator first.
std::shared_ptr<Communicator> make_gloo(int rank, int size, CommOptions comm) {
  const auto port = env::get("MASTER_PORT");
  require(port.has_value(), "gloo: MASTER_PORT is not set (spawn_ranks sets it)");
  std::shared_ptr<TcpStoreServer> server;
  if (rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.port = std::stoi(*port);
    server = std::make_shared<TcpStoreServer>(server_options);
  }
  TcpStoreOptions store_options;
  store_options.host = "127.0.0.1";
  store_options.port = std::stoi(*port);
  store_options.timeout = std::chrono::milliseconds(30000);
  std::shared_ptr<Communicator> gloo =
      make_gloo_communicator(std::make_shared<TcpStore>(store_options), {.rank = rank,
                                                                         .size = size,
                                                                         .hostname = "127.0.0.1",
                                                                         .comm = comm,
                                                                         .store_prefix = "",
                                                                         .abandon = {}});
  Communicator* raw = gloo.get();
  return std::shared_ptr<Communicator>(raw, [gloo, server](Communicator*) mutable {
    gloo.reset();
    server.reset();
  });
}

}  // namespace

std::string case_name(const BackendCase& c) {
  return fmt::format("{}_{}", c.backend, c.world);
}

void PrintTo(const BackendCase& c, std::ostream* os) {
  *os << c.backend << " with world size " << c.world;
}

std::shared_ptr<Communicator> make_backend(const std::string& name, int rank, int size,
                                           CommOptions comm) {
  if (name == "local") {
    require(size == 1, fmt::format("the local backend has world size 1, not {}", size));
    return make_local_communicator(comm);
  }
  if (name == "shm") {
    const auto run_id = env::get(env::kRunId);
    require(run_id.has_value(), "shm: DDPRUN_RUN_ID is not set (spawn_ranks sets it)");
    return make_shm_communicator(
        {.rank = rank, .size = size, .run_id = *run_id, .comm = comm, .abandon = {}});
  }
  if (name == "gloo") return make_gloo(rank, size, comm);
  // Note [backend factory]: mpi goes here.
  throw std::runtime_error(fmt::format(
      "make_backend: no backend '{}' in the conformance suite; known: local, shm, gloo", name));
}

double input_value(DType dtype, int rank, int64_t i) {
  const double k = static_cast<double>(i % 7 + 1);
  const double sign = (dtype == DType::u8 || i % 2 == 0) ? 1.0 : -1.0;
  return sign * (rank + 1) * k;
}

double reduced_value(ReduceOp op, int size, int64_t i) {
  const double k = static_cast<double>(i % 7 + 1);
  const bool positive = i % 2 == 0;
  const double sum = (positive ? 1.0 : -1.0) * size * (size + 1) / 2.0 * k;
  switch (op) {
    case ReduceOp::sum:
      return sum;
    case ReduceOp::avg:
      return sum / size;
    case ReduceOp::max:
      return positive ? size * k : -k;
    case ReduceOp::min:
      return positive ? k : -size * k;
  }
  return NAN;
}

double tolerance(ReduceOp op, DType dtype) {
  if (op != ReduceOp::avg) return 0.0;
  switch (dtype) {
    case DType::bf16:
      return 1.0 / 256;
    case DType::f16:
      return 1.0 / 2048;
    default:
      return 1e-6;
  }
}

Tensor make_tensor(DType dtype, int64_t count, const std::function<double(int64_t)>& value) {
  Tensor t = empty({count}, {.dtype = dtype});
  void* data = t.data_ptr();
  for (int64_t i = 0; i < count; ++i) store(data, dtype, i, value(i));
  return t;
}

Tensor make_periodic(DType dtype, int64_t count, const std::function<double(int64_t)>& value) {
  Tensor t = make_tensor(dtype, std::min(count, kPeriod), value);
  if (count <= kPeriod) return t;
  Tensor full = empty({count}, {.dtype = dtype});
  auto* data = static_cast<std::byte*>(full.data_ptr());
  const size_t total = full.nbytes();
  size_t filled = t.nbytes();
  std::memcpy(data, t.data_ptr(), filled);
  while (filled < total) {
    const size_t len = std::min(filled, total - filled);  // a whole number of periods
    std::memcpy(data + filled, data, len);
    filled += len;
  }
  return full;
}

Tensor make_input(DType dtype, int64_t count, int rank) {
  return make_periodic(dtype, count, [&](int64_t i) { return input_value(dtype, rank, i); });
}

Tensor make_reduced(DType dtype, ReduceOp op, int size, int64_t count, int64_t base) {
  return make_periodic(dtype, count, [&](int64_t i) { return reduced_value(op, size, base + i); });
}

void expect_values(const Tensor& t, const std::function<double(int64_t)>& want,
                   const std::string& what, double rel_tol) {
  const void* data = t.data_ptr();
  const int64_t n = t.numel();
  int64_t bad = 0;
  int64_t first = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double got = load(data, t.dtype(), i);
    const double expected = want(i);
    const bool same =
        rel_tol == 0.0 ? got == expected : std::abs(got - expected) <= rel_tol * std::abs(expected);
    if (same) continue;
    if (bad++ == 0) first = i;
  }
  if (bad == 0) return;
  throw std::runtime_error(
      fmt::format("{}: element {} is {}, expected {} ({} of {} elements differ)", what, first,
                  load(data, t.dtype(), first), want(first), bad, n));
}

void expect_values(const Tensor& t, const Tensor& want, const std::string& what, double rel_tol) {
  require(t.dtype() == want.dtype() && t.numel() == want.numel(),
          fmt::format("{}: got {} elements of {}, expected {} of {}", what, t.numel(),
                      dtype_name(t.dtype()), want.numel(), dtype_name(want.dtype())));
  if (t.nbytes() == 0 || std::memcmp(t.data_ptr(), want.data_ptr(), t.nbytes()) == 0) return;
  const void* expected = want.data_ptr();
  expect_values(
      t, [&](int64_t i) { return load(expected, want.dtype(), i); }, what, rel_tol);
}

void require(bool cond, const std::string& message) {
  if (!cond) throw std::runtime_error(message);
}

}  // namespace ddp::test
