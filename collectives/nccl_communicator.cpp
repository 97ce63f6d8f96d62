// The nccl backend: CUDA tensors on one device per rank.
//
// Note [nccl streams]: NCCL runs on a stream of its own. Each collective records
// an event on the caller's current stream and makes the NCCL stream wait for it
// (so the tensors are ready), records a start event, launches the NCCL call and
// records an end event (the two time Work::duration()). Work::wait() does not
// block the host: it makes the caller's current stream wait on the end event, so
// later work on that stream sees the result (PyTorch's WorkNCCL::wait).
// Work::synchronize() blocks the host until the end event. The tensors are
// recorded on the NCCL stream (Tensor::record_stream), so memory the caller
// frees before NCCL is done is not handed to other work until NCCL's stream has
// passed this point; the watchdog also keeps them alive until the end event.
//
// Note [nccl watchdog]: one thread per communicator (NcclWatchdog holds its
// decisions) polls the end events of the collectives in flight, checks
// ncclCommGetAsyncError and each collective's deadline (CommOptions::timeout from
// its launch). On a failure it logs it at once (the main thread may be busy
// elsewhere), records it as the communicator's first error and aborts the
// communicator (ncclCommAbort), as PyTorch's watchdog does: the kernels of a
// collective whose peer stopped would otherwise never finish, and the abort ends
// them. The recorded error is thrown by the next wait(), synchronize() or
// collective. With DDP_NCCL_ASYNC_ERROR_HANDLING=1 it ends the process after
// logging instead (for programs that may never call into ddp again). Every NCCL
// call on the communicator holds its lock (NCCL allows one thread at a time), so
// the abort never frees it under a launch; a launch that blocks inside NCCL delays
// the abort until it returns. ncclCommInitRank itself blocks until all ranks
// joined; the rendezvous before it (the GPU check and the unique id) has the
// store's timeout.
//
// Note [nccl events]: the moments of Note [collective events] on nccl. enqueued
// is CommunicatorBase's. started and completed are the GPU's: the watchdog
// (NcclWatchdog::Backend::started/tell) sees the collective's start event pass,
// then its end event, in stream order, and tells each with the event's time
// mapped to the host's steady clock (Note [gpu clock] in runtime/trace/gpu.h), so
// they arrive a few milliseconds late but carry the moment the GPU reached them.
// A collective found finished before it was seen starting is told both at once.
// failed is told for every collective in flight when the communicator fails (at
// the host's time), and for a launch that NCCL refused. wait_begin/wait_end
// surround Work::synchronize() (and wait() with a timeout, or a barrier's), the
// only waits that block the host; timed_out when such a wait gives up. wait()
// without a timeout only orders the caller's stream and blocks nothing: it is
// not told. A collective enqueued with no observer costs nothing of this: no
// description is copied, no GPU clock made, no start event queried, no wait
// looked at. The watchdog tells the moments holding no lock of its own (Note
// [watchdog notices] in nccl_watchdog.cpp) and maps their times without
// blocking (Note [gpu clock]).
//
// Note [nccl regroup]: under ddprun --on-failure continue the nccl backend
// regroups as shm and gloo do (Note [elastic membership] in collectives/elastic.h),
// with these differences. A peer that leaves the communicator -- it died, or it
// saw a newer membership at its step boundary first -- does not fail the others'
// collectives (its kernels are gone, theirs wait), so each communicator carries
// an abandon check: while collectives are in flight, the watchdog looks at
// ddprun's membership every 100 ms (holding no lock) and, once there is a newer
// one, fails them and aborts the communicator (ncclCommAbort), and the rank
// regroups at once rather than at the collective timeout. The state copy after a
// regroup synchronize()s its collectives (wait() on nccl neither blocks nor
// throws). And a regroup's communicator lives in a
// fresh store namespace (elastic/<E>/), so its unique id is that namespace's
// instance 0 whatever the process made before: a replacement's first
// communicator and a survivor's third meet there. ncclCommShrink (NCCL 2.27+)
// would spare the survivors the new bootstrap; it is not used: a replacement
// must join through ncclCommInitRank anyway. What stays: ncclCommInitRank blocks
// until every member called it, and the others wait for the new rank 0's unique
// id up to the store's timeout, so a member that dies while the new
// communicator forms leaves the others there until ddprun's hang detector ends
// the job. The watchdog's store read shares the rank's store connection: a store
// that hangs holds the watchdog up to the store's timeout. A communicator made
// after a regroup with instance -1 would take different keys on a replacement
// (none is made today: DDP, ZeRO and the state copy use the group's).
#include "collectives/backends.h"
#include "collectives/communicator_base.h"
#include "collectives/nccl_library.h"
#include "collectives/nccl_placement.h"
#include "collectives/nccl_watchdog.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/logging.h"
#include "runtime/stream.h"
#include "runtime/trace/gpu.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace ddp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// How often the watchdog looks at collectives in flight, and at an idle communicator.
constexpr auto kPollInterval = 5ms;
constexpr auto kIdleInterval = 100ms;

void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) {
    throw Error(fmt::format("{} failed: {} (ncclResult_t {})", call,
                            nccl::library().get_error_string(result), static_cast<int>(result)));
  }
}

#define NCCL_CHECK(call) check_nccl((call), #call)

// Owns an ncclComm_t: destroyed with the last owner, or aborted (Note [nccl watchdog]).
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

  // Runs `launch(comm)` holding the communicator; throws once it was aborted.
  template <typename F>
  void use(F&& launch) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) throw Error("the communicator was aborted after an earlier failure");
    launch(comm_);
  }
  // False when a launch holds the communicator right now (the watchdog retries).
  bool try_abort() {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (!aborted_) {
      aborted_ = true;
      nccl::library().comm_abort(comm_);
    }
    return true;
  }
  // NCCL's asynchronous error in words; "" when none (or when a launch holds it now).
  std::string async_error() {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || aborted_) return "";
    ncclResult_t result = ncclSuccess;
    const ncclResult_t call = nccl::library().comm_get_async_error(comm_, &result);
    if (call != ncclSuccess) result = call;
    if (result == ncclSuccess || result == ncclInProgress) return "";
    return fmt::format("{} (ncclResult_t {})", nccl::library().get_error_string(result),
                       static_cast<int>(result));
  }

 private:
  ncclComm_t comm_ = nullptr;
  std::mutex mutex_;
  bool aborted_ = false;  // guarded by mutex_
};

// The start and end of one collective on the NCCL stream, with timing.
struct CollectiveEvents {
  explicit CollectiveEvents(const Device& device) : start(device, true), end(device, true) {}
  Event start, end;
};

// What the watchdog keeps alive until a collective finished (Note [nccl streams]).
struct Tensors {
  Tensor input, output;
};

// What the watchdog tells its moments with (Note [nccl events]): the Entry's subject.
struct Moments {
  std::shared_ptr<CollectiveEvents> events;
  std::shared_ptr<const CollectiveInfo> info;  // null: nobody listened when it was enqueued
  int64_t launched_ns = 0;                     // host time before its start event was recorded
};

const Moments& moments_of(const std::shared_ptr<const void>& subject) {
  return *static_cast<const Moments*>(subject.get());
}

// The GPU clock of a communicator's moments, made on the first collective that
// has listeners (Note [nccl events]); shared with the watchdog's backend.
struct ClockSlot {
  std::atomic<trace::GpuClock*> clock{nullptr};
  std::once_flag made;
};

// Note [nccl events]: a moment the watchdog found, at the GPU's time. Never
// blocks (Note [gpu clock]).
void tell(const ClockSlot& slot, const NcclWatchdog::Notice& n) {
  if (!collective_observers_present()) return;
  const Moments& m = moments_of(n.subject);
  if (m.info == nullptr) return;
  int64_t time = steady_now_ns();
  trace::GpuClock* clock = slot.clock.load(std::memory_order_acquire);
  if (clock != nullptr && n.moment != CollectiveState::failed) {
    const Event& event = n.moment == CollectiveState::started ? m.events->start : m.events->end;
    try {
      time = clock->host_ns(event, m.launched_ns);
    } catch (const std::exception&) {
      // A CUDA error: the host's time of the finding, late by a poll.
    }
  }
  notify_collective(*m.info, n.moment, time);
}

// wait_begin/wait_end around a wait that blocks the host, and timed_out once;
// nothing for a null `info`.
class WaitMoments {
 public:
  explicit WaitMoments(const CollectiveInfo* info) : info_(info) {
    if (info_ != nullptr) notify_collective(*info_, CollectiveState::wait_begin);
  }
  ~WaitMoments() {
    if (info_ != nullptr) notify_collective(*info_, CollectiveState::wait_end);
  }
  WaitMoments(const WaitMoments&) = delete;
  WaitMoments& operator=(const WaitMoments&) = delete;
  void timed_out() {
    if (info_ == nullptr || told_timeout_) return;
    told_timeout_ = true;
    notify_collective(*info_, CollectiveState::timed_out);
  }

 private:
  const CollectiveInfo* info_;
  bool told_timeout_ = false;
};

class NcclWork : public Work {
 public:
  // `info` is null when nobody listened (Note [nccl events]): the sequence comes apart.
  NcclWork(std::shared_ptr<NcclWatchdog> watchdog, std::shared_ptr<CollectiveEvents> events,
           std::shared_ptr<const CollectiveInfo> info, int64_t sequence, Device device,
           bool host_barrier)
      : watchdog_(std::move(watchdog)),
        events_(std::move(events)),
        info_(std::move(info)),
        device_(device),
        sequence_(sequence),
        host_barrier_(host_barrier) {}

  // Note [nccl streams]: orders the caller's current stream after the collective.
  // Given a timeout, it also blocks the host, as PyTorch's wait(timeout) does; so
  // does a barrier's, which users (and PyTorch) expect to hold the host.
  void wait(std::chrono::milliseconds timeout) override {
    if (timeout.count() > 0 || host_barrier_) {
      synchronize(timeout);
      return;
    }
    switch (watchdog_->state(sequence_)) {
      case NcclWatchdog::State::failed:
        std::rethrow_exception(watchdog_->error());
      case NcclWatchdog::State::finished:
        return;
      case NcclWatchdog::State::in_flight:
        events_->end.block(current_stream(device_));
        return;
    }
  }
  void synchronize(std::chrono::milliseconds timeout) override;
  bool done() const override {
    if (watchdog_->state(sequence_) != NcclWatchdog::State::in_flight) return true;
    try {
      return events_->end.query();
    } catch (const std::exception&) {
      return true;  // a CUDA error: the watchdog records it for wait()
    }
  }
  int64_t sequence() const override { return sequence_; }
  std::optional<std::chrono::nanoseconds> duration() const override {
    if (!done() || watchdog_->state(sequence_) == NcclWatchdog::State::failed) return std::nullopt;
    try {
      const double ms = events_->start.elapsed_ms(events_->end);
      return std::chrono::nanoseconds(static_cast<int64_t>(ms * 1e6));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

 private:
  std::shared_ptr<NcclWatchdog> watchdog_;
  std::shared_ptr<CollectiveEvents> events_;
  std::shared_ptr<const CollectiveInfo> info_;  // Note [nccl events]; null: nobody listened
  Device device_;
  int64_t sequence_;
  bool host_barrier_;
};

// Polls rather than cudaEventSynchronize, so that a failure the watchdog records
// (which may leave the kernels running) ends the wait too.
void NcclWork::synchronize(std::chrono::milliseconds timeout) {
  const bool bounded = timeout.count() > 0;
  const Clock::time_point deadline = bounded ? Clock::now() + timeout : Clock::time_point::max();
  // Note [nccl events]: done() (a lock and a cudaEventQuery) only when someone listens.
  const bool told = info_ != nullptr && collective_observers_present() && !done();
  WaitMoments moments(told ? info_.get() : nullptr);
  for (int polls = 0;; ++polls) {
    const NcclWatchdog::State state = watchdog_->state(sequence_);
    if (state == NcclWatchdog::State::failed) std::rethrow_exception(watchdog_->error());
    if (state == NcclWatchdog::State::finished || events_->end.query()) break;
    if (bounded && Clock::now() >= deadline) {
      moments.timed_out();
      if (auto message = watchdog_->time_out(sequence_, timeout)) DDP_LOG_ERROR("{}", *message);
      continue;  // the next round sees the failure, or that it finished meanwhile
    }
    if (polls > 100) std::this_thread::sleep_for(polls > 1000 ? 1ms : 50us);
  }
  events_->end.synchronize();  // returns at once; counts the wait (cuda_api::host_sync_count)
  // The end event also passes when an abort ended the kernels: the error decides.
  if (watchdog_->state(sequence_) == NcclWatchdog::State::failed) {
    std::rethrow_exception(watchdog_->error());
  }
}

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

// Note [nccl avg at one rank]
// At world size 1, the machine's NCCL 2.28 on an H100 (2026-11-26) left the last
// count % 16 elements of an out-of-place reduce_scatter with ncclAvg unwritten
// (its one-rank path for a pre-multiplied sum; sum and in-place all_reduce were
// right): ZeRO-2's gradient shard lost the last layer's bias, 10 of 203,530
// elements, and each 13,107-element round its last 3. Found by bench/gpu's
// zero2_nccl_w1, pinned by NcclCommunicator.ReduceScatterIsTheIdentityForEveryOpAndDtype
// and ZeroGpu.*. Averaging over one rank divides by 1, so avg goes as ncclSum
// there: the same values, through NCCL's plain copy. Other world sizes keep
// ncclAvg (not checked: one GPU; a multi-GPU run of those tests would say).
ncclRedOp_t nccl_op(ReduceOp op, int world_size) {
  if (op == ReduceOp::avg && world_size == 1) return ncclSum;
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

// The n-th NCCL communicator made in this process uses the store keys of instance
// n; every rank must create them in the same order.
std::atomic<int> g_nccl_instances{0};

// The unique id from "nccl/uid" (instance 0) or "nccl/uid/<n>": rank 0 sets it.
ncclUniqueId exchange_unique_id(Store* store, const NcclOptions& options, int instance) {
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

// Note [communicator devices]: an nccl communicator is bound to its GPU.
CommOptions bound_to(const NcclOptions& options) {
  CommOptions comm = options.comm;
  comm.device = Device::cuda(options.device);
  return comm;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// Every rank publishes its GPU under "nccl/<n>/gpu/<rank>" and reads the others';
// two ranks on one GPU fail on every rank, before NCCL would (nccl_placement.h).
void check_gpus(Store& store, const NcclOptions& options, int instance) {
  const RankGpu mine{.rank = options.rank,
                     .host = host_name(),
                     .device = options.device,
                     .name = cuda_api::properties(options.device).name,
                     .pci_bus_id = cuda_api::pci_bus_id(options.device)};
  check_one_gpu_per_rank(store, fmt::format("nccl/{}/gpu/", instance), mine, options.size);
}

class NcclCommunicator : public CommunicatorBase {
 public:
  NcclCommunicator(std::shared_ptr<Store> store, const NcclOptions& options);
  ~NcclCommunicator() override;
  std::string backend() const override { return "nccl"; }
  bool accepts(const Device& device) const override { return device == device_; }

 protected:
  std::shared_ptr<Work> submit(Collective c) override;

 private:
  std::shared_ptr<Work> enqueue(const Collective& c);
  void launch(const Collective& c, ncclComm_t comm);
  NcclWatchdog::Backend watchdog_backend() const;
  void watch();  // the watchdog thread (Note [nccl watchdog])
  void wake_watchdog();
  void make_clock();  // Note [nccl events]

  Device device_;
  std::shared_ptr<NcclHandle> comm_;
  Stream stream_;
  Tensor barrier_scratch_;
  std::shared_ptr<NcclWatchdog> watchdog_;  // shared with the Works, which may outlive this
  std::shared_ptr<ClockSlot> clock_ = std::make_shared<ClockSlot>();  // Note [nccl events]
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;  // guarded by watch_mutex_
  bool woken_ = false;     // guarded by watch_mutex_: a collective started
  std::thread watcher_;
};

NcclCommunicator::NcclCommunicator(std::shared_ptr<Store> store, const NcclOptions& options)
    : CommunicatorBase(options.rank, options.size, bound_to(options)),
      device_(Device::cuda(options.device)) {
  check_available(device_);
  const bool tear_down = nccl_tear_down_on_error();  // a bad value fails before any rendezvous
  cuda_api::DeviceGuard guard(options.device);       // NCCL acts on the current device
  const int instance = options.instance >= 0 ? options.instance : g_nccl_instances++;
  if (options.size > 1 && store != nullptr) check_gpus(*store, options, instance);
  const ncclUniqueId id = exchange_unique_id(store.get(), options, instance);
  comm_ = std::make_shared<NcclHandle>(options.size, id, options.rank);
  stream_ = Stream::create(device_);
  barrier_scratch_ = zeros({1}, {.dtype = DType::f32, .device = device_});
  NcclWatchdog::Backend backend = watchdog_backend();
  if (options.abandon) {  // Note [nccl regroup]
    backend.abandoned = [abandon = options.abandon]() -> std::string {
      if (!abandon()) return "";
      return "the group's membership changed (ddprun --on-failure continue: a rank left or "
             "joins), so its members leave this communicator; regrouping";
    };
  }
  if (tear_down) {
    backend.tear_down = [](const std::string& message) {
      DDP_LOG_ERROR("{}. DDP_NCCL_ASYNC_ERROR_HANDLING=1: ending the process", message);
      logger().flush();
      std::abort();
    };
  }
  watchdog_ = std::make_shared<NcclWatchdog>(rank(), std::move(backend));
  watcher_ = std::thread([this] { watch(); });
}

// Stops the watchdog once nothing is in flight; a collective still running either
// finishes or fails at its deadline (and is aborted), so this ends within the timeout.
NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

NcclWatchdog::Backend NcclCommunicator::watchdog_backend() const {
  std::shared_ptr<NcclHandle> comm = comm_;
  std::shared_ptr<const ClockSlot> clock = clock_;
  return {
      .now = [] { return Clock::now(); },
      .finished =
          [](const NcclWatchdog::Entry& e) { return moments_of(e.subject).events->end.query(); },
      .async_error = [comm] { return comm->async_error(); },
      .abort = [comm] { return comm->try_abort(); },
      .tear_down = nullptr,
      // Note [nccl events]: the start events are looked at only while someone listens.
      .started =
          [](const NcclWatchdog::Entry& e) {
            const Moments& m = moments_of(e.subject);
            return m.info != nullptr && collective_observers_present() && m.events->start.query();
          },
      .tell = [clock](const NcclWatchdog::Notice& n) { tell(*clock, n); },
  };
}

// The device's GPU clock for the moments of Note [nccl events], made once (its
// first anchor waits for an idle stream of its own) on the caller's thread,
// before the first listened collective records its start event: the clock's
// first anchor precedes every event it maps (Note [gpu clock]).
void NcclCommunicator::make_clock() {
  std::call_once(clock_->made, [this] {
    try {
      clock_->clock.store(&trace::gpu_clock(device_), std::memory_order_release);
    } catch (const std::exception& e) {
      DDP_LOG_WARN("nccl: no GPU clock for {} ({}): collective moments get host times",
                   device_.str(), e.what());
    }
  });
}

void NcclCommunicator::watch() {
  try {
    cuda_api::set_device(device_.index);  // for the CUDA calls of freeing the tensors it releases
  } catch (const std::exception& e) {
    DDP_LOG_ERROR("nccl watchdog: cannot make {} current: {}", device_.str(), e.what());
  }
  std::unique_lock<std::mutex> lock(watch_mutex_);
  for (;;) {
    lock.unlock();
    try {
      if (std::optional<std::string> message = watchdog_->tick()) DDP_LOG_ERROR("{}", *message);
    } catch (const std::exception& e) {
      DDP_LOG_ERROR("nccl watchdog: {}", e.what());  // never let the thread die
    }
    const bool idle = watchdog_->idle();
    lock.lock();
    if (stopping_ && idle) return;
    // Stopping with collectives in flight: poll them at kPollInterval, not in a spin.
    watch_cv_.wait_for(lock, idle ? kIdleInterval : kPollInterval,
                       [this] { return woken_ || (stopping_ && watchdog_->idle()); });
    woken_ = false;
  }
}

void NcclCommunicator::wake_watchdog() {
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    woken_ = true;
  }
  watch_cv_.notify_all();
}

// A failure here (NCCL refused the launch, a CUDA error) breaks the communicator
// like one the watchdog finds: every later collective fails with the first error.
std::shared_ptr<Work> NcclCommunicator::submit(Collective c) {
  try {
    return enqueue(c);
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    try {
      std::rethrow_exception(error);
    } catch (const CommError&) {
      // Already has its context (the first error, or an aborted communicator).
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(CommError(
          fmt::format("rank {}: {} failed on the nccl backend: {}", rank(), c.describe(), e.what()),
          rank(), c.describe(), c.sequence, c.count()));
    }
    if (std::optional<std::string> message = watchdog_->fail(error)) DDP_LOG_ERROR("{}", *message);
    // Never handed to the watchdog: told here (Note [nccl events]).
    if (collective_observers_present()) notify_collective(info_of(c), CollectiveState::failed);
    return completed_work(c.sequence, watchdog_->error());
  }
}

std::shared_ptr<Work> NcclCommunicator::enqueue(const Collective& c) {
  if (std::exception_ptr first = watchdog_->error()) std::rethrow_exception(first);
  cuda_api::DeviceGuard guard(device_.index);
  Event ready(device_, false);
  ready.record(current_stream(device_));
  ready.block(stream_);
  // Note [nccl events]: the description, the clock and the start events' queries
  // only for a collective that someone listens to.
  const bool listened = collective_observers_present();
  if (listened) make_clock();
  std::shared_ptr<const CollectiveInfo> info =
      listened ? std::make_shared<const CollectiveInfo>(info_of(c)) : nullptr;
  auto moments = std::make_shared<Moments>(
      Moments{std::make_shared<CollectiveEvents>(device_), info, steady_now_ns()});
  // launched_ns is read before the start event's record: it passes after it (Note [gpu clock]).
  moments->events->start.record(stream_);
  comm_->use([&](ncclComm_t comm) { launch(c, comm); });
  moments->events->end.record(stream_);
  // Note [nccl streams]: freed memory is not reused before NCCL's stream passed here.
  if (c.input.defined()) c.input.record_stream(stream_);
  if (c.output.defined() && c.output.data_ptr() != c.input.data_ptr()) {
    c.output.record_stream(stream_);
  }
  std::shared_ptr<CollectiveEvents> events = moments->events;
  watchdog_->start({.sequence = c.sequence,
                    .description = c.describe(),
                    .count = c.count(),
                    .timeout = options().timeout,
                    .keep_alive = std::make_shared<Tensors>(Tensors{c.input, c.output}),
                    .subject = std::move(moments)});
  wake_watchdog();
  return std::make_shared<NcclWork>(watchdog_, std::move(events), std::move(info), c.sequence,
                                    device_, c.kind == CollectiveKind::barrier);
}

void NcclCommunicator::launch(const Collective& c, ncclComm_t comm) {
  const nccl::Library& nccl = nccl::library();
  auto stream = static_cast<cudaStream_t>(stream_.handle());
  if (c.kind == CollectiveKind::barrier) {
    void* x = barrier_scratch_.data_ptr();
    NCCL_CHECK(nccl.all_reduce(x, x, 1, ncclFloat32, ncclSum, comm, stream));
    return;
  }
  if (c.count() == 0) return;  // every rank has the same count: nothing to move
  void* in = c.input.data_ptr();
  void* out = c.output.data_ptr();
  const auto n = static_cast<size_t>(c.count());
  const ncclDataType_t type = nccl_type(c.dtype());
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      NCCL_CHECK(nccl.all_reduce(in, in, n, type, nccl_op(c.op, size()), comm, stream));
      break;
    case CollectiveKind::broadcast:
      NCCL_CHECK(nccl.broadcast(in, in, n, type, c.root, comm, stream));
      break;
    case CollectiveKind::all_gather:
      NCCL_CHECK(nccl.all_gather(in, out, n, type, comm, stream));
      break;
    case CollectiveKind::reduce_scatter:
      NCCL_CHECK(nccl.reduce_scatter(in, out, static_cast<size_t>(c.output.numel()), type,
                                     nccl_op(c.op, size()), comm, stream));
      break;
    case CollectiveKind::reduce:
      NCCL_CHECK(nccl.reduce(in, in, n, type, nccl_op(c.op, size()), c.root, comm, stream));
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
