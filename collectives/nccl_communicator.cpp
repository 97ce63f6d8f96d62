// The nccl backend: CUDA tensors on one device per rank.
//
// Note [nccl streams]: NCCL runs on a stream of its own. Each collective records
// an event on the caller's current stream and makes the NCCL stream wait for it
// (so the tensor is ready), launches the NCCL call, and records a completion
// event. Work::wait() blocks the host until that event (polling, with the
// timeout, and checking ncclCommGetAsyncError) and then makes the caller's
// current stream wait on it, so later work on that stream sees the result.
// Until their completion event has passed, the communicator keeps the tensors of
// each collective alive, so memory the caller drops early is not reused under
// NCCL's feet.
//
// Note [nccl failures]: a collective that times out or reports an asynchronous
// error aborts the communicator (ncclCommAbort), as PyTorch's watchdog does: the
// NCCL kernels of a stopped peer would otherwise never finish. Every later
// collective fails at once. ncclCommInitRank itself blocks until all ranks
// joined; the rendezvous of the unique id has the store's timeout.
#include "collectives/backends.h"
#include "collectives/communicator_base.h"
#include "collectives/nccl_library.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/stream.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

namespace ddp {
namespace {

void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) {
    throw Error(fmt::format("{} failed: {} (ncclResult_t {})", call,
                            nccl::library().get_error_string(result), static_cast<int>(result)));
  }
}

#define NCCL_CHECK(call) check_nccl((call), #call)

// Makes `device` current for the scope (NCCL and CUDA calls act on the current device).
class DeviceScope {
 public:
  explicit DeviceScope(int device) : previous_(cuda_api::current_device()) {
    if (device != previous_) cuda_api::set_device(device);
  }
  ~DeviceScope() {
    try {
      cuda_api::set_device(previous_);
    } catch (...) {
      // Restoring a device that was current a moment ago does not fail in practice.
    }
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_;
};

// Owns an ncclComm_t: destroyed with the last owner, or aborted (Note [nccl failures]).
class NcclHandle {
 public:
  NcclHandle(int size, const ncclUniqueId& id, int rank) {
    NCCL_CHECK(nccl::library().comm_init_rank(&comm_, size, id, rank));
  }
  ~NcclHandle() {
    if (!aborted_) nccl::library().comm_destroy(comm_);
  }
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;

  ncclComm_t get() const { return comm_; }
  bool aborted() const { return aborted_; }
  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.exchange(true)) nccl::library().comm_abort(comm_);
  }
  ncclResult_t async_error() {
    std::lock_guard<std::mutex> lock(mutex_);
    ncclResult_t result = ncclSuccess;
    if (!aborted_ && nccl::library().comm_get_async_error(comm_, &result) != ncclSuccess) {
      result = ncclSystemError;
    }
    return result;
  }

 private:
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
};

enum class Outcome { done, error, timeout };

// Waits for `event` while watching the communicator; `error` says what went wrong.
Outcome poll(const Event& event, NcclHandle& comm, std::chrono::milliseconds timeout,
             std::string* error) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int polls = 0;; ++polls) {
    if (event.query()) return Outcome::done;
    if (comm.aborted()) {
      *error = "the communicator was aborted after an earlier failure";
      return Outcome::error;
    }
    if (const ncclResult_t result = comm.async_error(); result != ncclSuccess) {
      *error = fmt::format("NCCL reported an asynchronous error: {}",
                           nccl::library().get_error_string(result));
      return Outcome::error;
    }
    if (std::chrono::steady_clock::now() > deadline) return Outcome::timeout;
    if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclHandle> comm, std::shared_ptr<Event> done, const Collective& c,
           int rank, std::chrono::milliseconds default_timeout)
      : comm_(std::move(comm)),
        done_(std::move(done)),
        device_(c.input.defined() ? c.input.device() : done_->device()),
        description_(c.describe()),
        sequence_(c.sequence),
        count_(c.count()),
        rank_(rank),
        default_timeout_(default_timeout) {}

  void wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    if (timeout.count() <= 0) timeout = default_timeout_;
    std::string why;
    const Outcome outcome = poll(*done_, *comm_, timeout, &why);
    if (outcome == Outcome::done) {
      done_->block(current_stream(device_));
      return;
    }
    comm_->abort();
    error_ = outcome == Outcome::timeout ? timeout_error(timeout) : failure(why);
    failed_ = true;
    std::rethrow_exception(error_);
  }
  bool done() const override { return failed_ || done_->query(); }
  int64_t sequence() const override { return sequence_; }

 private:
  std::exception_ptr timeout_error(std::chrono::milliseconds timeout) const {
    return std::make_exception_ptr(CommTimeoutError(
        fmt::format("rank {}: {} timed out after {:.1f} s on the nccl backend: its kernels did not "
                    "finish, so a rank stopped, died or issued a different collective. The "
                    "communicator was aborted (ncclCommAbort). DDP_DEBUG=detail compares "
                    "collectives across ranks; NCCL_DEBUG=INFO shows NCCL's view",
                    rank_, description_, static_cast<double>(timeout.count()) / 1000.0),
        rank_, description_, sequence_, count_));
  }
  std::exception_ptr failure(const std::string& why) const {
    return std::make_exception_ptr(
        CommError(fmt::format("rank {}: {} failed on the nccl backend: {}. The communicator was "
                              "aborted (ncclCommAbort); NCCL_DEBUG=INFO tells more",
                              rank_, description_, why),
                  rank_, description_, sequence_, count_));
  }

  std::shared_ptr<NcclHandle> comm_;
  std::shared_ptr<Event> done_;
  Device device_;
  std::string description_;
  int64_t sequence_;
  int64_t count_;
  int rank_;
  std::chrono::milliseconds default_timeout_;
  std::mutex mutex_;  // one waiter at a time; guards error_
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  DDP_ASSERT(false, "nccl: no NCCL type for dtype {}", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  DDP_ASSERT(false, "nccl: unknown ReduceOp");
}

// The n-th NCCL communicator made in this process takes its id from "nccl/uid"
// (n = 0) or "nccl/uid/<n>"; every rank must create them in the same order.
std::atomic<int> g_nccl_instances{0};

ncclUniqueId exchange_unique_id(Store* store, const NcclOptions& options) {
  const int instance = g_nccl_instances++;
  const std::string key = instance == 0 ? "nccl/uid" : fmt::format("nccl/uid/{}", instance);
  ncclUniqueId id{};
  if (options.rank == 0) {
    NCCL_CHECK(nccl::library().get_unique_id(&id));
    if (store != nullptr) store->set(key, Bytes(id.internal, id.internal + NCCL_UNIQUE_ID_BYTES));
    return id;
  }
  DDP_CHECK(store != nullptr, "nccl: world size {} needs a store for the unique id", options.size);
  const Bytes value = store->get(key);
  DDP_CHECK(value.size() == NCCL_UNIQUE_ID_BYTES,
            "nccl: store key '{}' holds {} bytes, expected an ncclUniqueId of {}; is another job "
            "using the same store?",
            key, value.size(), NCCL_UNIQUE_ID_BYTES);
  std::memcpy(id.internal, value.data(), value.size());
  return id;
}

class NcclCommunicator : public CommunicatorBase {
 public:
  NcclCommunicator(std::shared_ptr<Store> store, const NcclOptions& options)
      : CommunicatorBase(options.rank, options.size, options.comm),
        device_(Device::cuda(options.device)) {
    check_available(device_);
    DeviceScope scope(options.device);
    const ncclUniqueId id = exchange_unique_id(store.get(), options);
    comm_ = std::make_shared<NcclHandle>(options.size, id, options.rank);
    stream_ = Stream::create(device_);
    barrier_scratch_ = zeros({1}, {.dtype = DType::f32, .device = device_});
  }
  ~NcclCommunicator() override;
  std::string backend() const override { return "nccl"; }

 protected:
  bool supports_device(const Device& device) const override { return device == device_; }
  std::shared_ptr<Work> submit(Collective c) override;

 private:
  std::shared_ptr<Work> enqueue(const Collective& c);
  void launch(const Collective& c);

  struct InFlight {
    std::shared_ptr<Event> done;
    Tensor input, output;
  };
  Device device_;
  std::shared_ptr<NcclHandle> comm_;
  Stream stream_;
  Tensor barrier_scratch_;
  std::deque<InFlight> in_flight_;  // Note [nccl streams]
};

// Waits (with the timeout) for collectives still running, so their tensors can go.
NcclCommunicator::~NcclCommunicator() {
  std::string why;
  for (const InFlight& f : in_flight_) {
    if (poll(*f.done, *comm_, options().timeout, &why) != Outcome::done) {
      comm_->abort();
      break;
    }
  }
}

std::shared_ptr<Work> NcclCommunicator::submit(Collective c) {
  try {
    return enqueue(c);
  } catch (const CommError&) {
    return completed_work(c.sequence, std::current_exception());
  } catch (const std::exception& e) {
    return completed_work(c.sequence, std::make_exception_ptr(CommError(
                                          fmt::format("rank {}: {} failed on the nccl backend: {}",
                                                      rank(), c.describe(), e.what()),
                                          rank(), c.describe(), c.sequence, c.count())));
  }
}

std::shared_ptr<Work> NcclCommunicator::enqueue(const Collective& c) {
  DDP_CHECK(!comm_->aborted(), "the communicator was aborted after an earlier failure");
  while (!in_flight_.empty() && in_flight_.front().done->query()) in_flight_.pop_front();
  DeviceScope scope(device_.index);
  Event ready(device_, false);
  ready.record(current_stream(device_));
  ready.block(stream_);
  launch(c);
  auto done = std::make_shared<Event>(device_, false);
  done->record(stream_);
  in_flight_.push_back({done, c.input, c.output});
  return std::make_shared<NcclWork>(comm_, std::move(done), c, rank(), options().timeout);
}

void NcclCommunicator::launch(const Collective& c) {
  auto stream = static_cast<cudaStream_t>(stream_.handle());
  ncclComm_t comm = comm_->get();
  if (c.kind == CollectiveKind::barrier) {
    void* x = barrier_scratch_.data_ptr();
    NCCL_CHECK(nccl::library().all_reduce(x, x, 1, ncclFloat32, ncclSum, comm, stream));
    return;
  }
  if (c.count() == 0) return;  // every rank has the same count: nothing to move
  void* in = c.input.data_ptr();
  void* out = c.output.data_ptr();
  const auto n = static_cast<size_t>(c.count());
  const ncclDataType_t type = nccl_type(c.dtype());
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      NCCL_CHECK(nccl::library().all_reduce(in, in, n, type, nccl_op(c.op), comm, stream));
      break;
    case CollectiveKind::broadcast:
      NCCL_CHECK(nccl::library().broadcast(in, in, n, type, c.root, comm, stream));
      break;
    case CollectiveKind::all_gather:
      NCCL_CHECK(nccl::library().all_gather(in, out, n, type, comm, stream));
      break;
    case CollectiveKind::reduce_scatter:
      NCCL_CHECK(nccl::library().reduce_scatter(in, out, static_cast<size_t>(c.output.numel()),
                                                type, nccl_op(c.op), comm, stream));
      break;
    case CollectiveKind::reduce:
      NCCL_CHECK(nccl::library().reduce(in, in, n, type, nccl_op(c.op), c.root, comm, stream));
      break;
    case CollectiveKind::barrier:
      break;
  }
}

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store,
                                                     const NcclOptions& options) {
  return std::make_shared<NcclCommunicator>(std::move(store), options);
}

}  // namespace ddp
