#include "collectives/communicator_base.h"

#include "collectives/flight/flight_recorder.h"
#include "collectives/host_staging.h"
#include "collectives/reduce_kernels.h"
#include "collectives/trace_collectives.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/env.h"
#include "runtime/ops/ops.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>

namespace ddp {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::reduce:
      return "reduce";
    case CollectiveKind::barrier:
      return "barrier";
  }
  return "?";
}

std::string Collective::describe() const {
  std::string args;
  switch (kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter:
      args = fmt::format("({})", reduce_op_name(op));
      break;
    case CollectiveKind::reduce:
      args = fmt::format("({}, root {})", reduce_op_name(op), root);
      break;
    case CollectiveKind::broadcast:
      args = fmt::format("(root {})", root);
      break;
    default:
      break;
  }
  if (kind == CollectiveKind::barrier || !input.defined()) {
    return fmt::format("{}{} #{}", collective_name(kind), args, sequence);
  }
  return fmt::format("{}{} #{} of {} {}", collective_name(kind), args, sequence, count(),
                     dtype_name(dtype()));
}

namespace {

std::atomic<int> g_comm_ids{0};

// A static string for the backend's name, which CollectiveInfo keeps as a view.
std::string_view static_backend_name(const std::string& name) {
  for (std::string_view known : {"local", "shm", "gloo", "mpi", "nccl"}) {
    if (name == known) return known;
  }
  return "other";
}

}  // namespace

void check_comm_options(const CommOptions& options, std::string_view backend) {
  DDP_CHECK(options.timeout.count() >= 1,
            "{}: CommOptions.timeout is {} ms; give every collective at least 1 ms "
            "(the default is 300 s, DDP_TIMEOUT_S's)",
            backend, options.timeout.count());
}

CommunicatorBase::CommunicatorBase(int rank, int size, CommOptions options)
    : rank_(rank), size_(size), options_(options), comm_id_(g_comm_ids++) {
  check_comm_options(options_, "communicator");
  DDP_CHECK(size >= 1 && rank >= 0 && rank < size,
            "communicator: rank {} and world size {} are inconsistent (need 0 <= rank < size)",
            rank, size);
  flight::ensure_recorder(rank, size, options_.timeout);  // Note [flight recorder]
  attach_trace_observer();                                // Note [timeline collectives]
}

bool CommunicatorBase::accepts(const Device& d) const {
  return d == options_.device || (options_.device.is_cuda() && d == Device::cpu());
}

void CommunicatorBase::check_tensor(const char* op, const Tensor& t, bool allow_u8) const {
  DDP_CHECK(t.defined(), "{}: undefined tensor", op);
  DDP_CHECK_T(DeviceError, accepts(t.device()),
              "{}: rank {}'s {} communicator is bound to {} and does not take a tensor on {}; "
              "create the tensor on comm.device() ({}) or move it there with .to(), and give "
              "every rank its own device when it creates the process group (Note "
              "[communicator devices])",
              op, rank_, backend(), options_.device.str(), t.device().str(), options_.device.str());
  DDP_CHECK(
      t.dtype() != DType::u8 || allow_u8,
      "{}: dtype u8 can be broadcast or gathered but not reduced; valid: f32, bf16, f16, i32, "
      "i64",
      op);
}

CollectiveInfo CommunicatorBase::info_of(const Collective& c) const {
  return {.comm_id = comm_id_,
          .rank = rank_,
          .world_size = size_,
          .backend = static_backend_name(backend()),
          .kind = c.kind,
          .op = c.op,
          .root = c.root,
          .sequence = c.sequence,
          .count = c.count(),
          .dtype = c.dtype(),
          .bytes = c.count() * static_cast<int64_t>(element_size(c.dtype())),
          .label = c.label};
}

std::shared_ptr<Work> CommunicatorBase::start(Collective c) {
  c.sequence = next_sequence_++;
  c.label = current_collective_label();
  if (collective_observers_present()) notify_collective(info_of(c), CollectiveState::enqueued);
  return submit(std::move(c));
}

std::shared_ptr<Work> CommunicatorBase::all_reduce(Tensor& tensor, ReduceOp op) {
  check_tensor("all_reduce", tensor, false);
  comm::check_reducible(tensor.dtype(), op);
  return start({CollectiveKind::all_reduce, op, 0, 0, tensor, tensor, {}, {}});
}

std::shared_ptr<Work> CommunicatorBase::broadcast(Tensor& tensor, int root) {
  return start_broadcast(tensor, root, /*root_only=*/false);
}

std::shared_ptr<Work> CommunicatorBase::broadcast(const Tensor& tensor, int root) {
  return start_broadcast(tensor, root, /*root_only=*/true);
}

// Note [broadcast overloads] in collectives/communicator.h: a const tensor is
// only sent, so off the root it is refused before it takes a sequence number.
std::shared_ptr<Work> CommunicatorBase::start_broadcast(const Tensor& tensor, int root,
                                                        bool root_only) {
  check_tensor("broadcast", tensor, true);
  DDP_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank (world size {})", root,
            size_);
  DDP_CHECK(!root_only || rank_ == root,
            "broadcast: rank {} passed a const tensor or a temporary, but only the root (rank {}) "
            "sends; rank {} receives the root's data, which would be lost. Pass a non-const "
            "Tensor variable that receives it and use that, e.g. `Tensor t = x.to(comm.device()); "
            "comm.broadcast(t, {});`",
            rank_, root, rank_, root);
  return start({CollectiveKind::broadcast, ReduceOp::sum, root, 0, tensor, tensor, {}, {}});
}

std::shared_ptr<Work> CommunicatorBase::all_gather(const Tensor& input, Tensor& output) {
  check_tensor("all_gather", input, true);
  check_tensor("all_gather", output, true);
  check_same_device({&input, &output});
  DDP_CHECK(
      output.dtype() == input.dtype() && output.numel() == input.numel() * size_,
      "all_gather: output must hold world size ({}) x {} elements of {}, got {} elements of {}",
      size_, input.numel(), dtype_name(input.dtype()), output.numel(), dtype_name(output.dtype()));
  return start({CollectiveKind::all_gather, ReduceOp::sum, 0, 0, input, output, {}, {}});
}

std::shared_ptr<Work> CommunicatorBase::reduce_scatter(const Tensor& input, Tensor& output,
                                                       ReduceOp op) {
  check_tensor("reduce_scatter", input, false);
  check_tensor("reduce_scatter", output, false);
  check_same_device({&input, &output});
  comm::check_reducible(input.dtype(), op);
  DDP_CHECK(output.dtype() == input.dtype() && input.numel() == output.numel() * size_,
            "reduce_scatter: input must hold world size ({}) x {} elements of {}, got {} elements "
            "of {}",
            size_, output.numel(), dtype_name(output.dtype()), input.numel(),
            dtype_name(input.dtype()));
  return start({CollectiveKind::reduce_scatter, op, 0, 0, input, output, {}, {}});
}

std::shared_ptr<Work> CommunicatorBase::reduce(Tensor& tensor, int root, ReduceOp op) {
  check_tensor("reduce", tensor, false);
  comm::check_reducible(tensor.dtype(), op);
  DDP_CHECK(root >= 0 && root < size_, "reduce: root {} is not a rank (world size {})", root,
            size_);
  return start({CollectiveKind::reduce, op, root, 0, tensor, tensor, {}, {}});
}

std::shared_ptr<Work> CommunicatorBase::barrier() {
  return start({CollectiveKind::barrier, ReduceOp::sum, 0, 0, Tensor(), Tensor(), {}, {}});
}

// DDP_DEBUG, as TORCH_DISTRIBUTED_DEBUG: OFF, INFO or DETAIL, any case (INFO
// compares nothing more here). Another value is a ValueError: a misspelt DETAIL
// must not turn the checks off silently.
bool debug_detail() {
  std::string v = env::get(env::kDebug).value_or("off");
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  DDP_CHECK(v == "off" || v == "info" || v == "detail" || v.empty(),
            "{}={}: expected off, info or detail (as TORCH_DISTRIBUTED_DEBUG; detail compares "
            "every collective across ranks)",
            env::kDebug, env::get(env::kDebug).value_or(""));
  return v == "detail";
}

// ---- ThreadedCommunicator ---------------------------------------------------------------

ThreadedCommunicator::ThreadedCommunicator(int rank, int size, CommOptions options)
    : CommunicatorBase(rank, size, options) {
  debug_ = debug_detail();
}

ThreadedCommunicator::~ThreadedCommunicator() {
  stop_thread();
}

void ThreadedCommunicator::start_thread() {
  thread_ = std::thread([this] {
    // A thread starts on GPU 0: without this, every rank's staging copies would
    // make a context there (the "all ranks on GPU 0" complaint). A failure (an
    // exclusive-process GPU, no memory for a context) breaks the communicator:
    // every collective fails with it instead of the process terminating.
    try {
      if (device().is_cuda()) cuda_api::set_device(device().index);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(queue_->mutex);
      queue_->broken = std::make_exception_ptr(
          CommError(fmt::format("rank {}: the {} communication thread cannot use {}: {}", rank(),
                                backend(), device().str(), e.what()),
                    rank(), "start", -1, 0));
    }
    loop();
  });
}

void ThreadedCommunicator::stop_thread() {
  Queue& q = *queue_;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    q.stopping = true;
  }
  q.cv.notify_all();
  if (thread_.joinable()) thread_.join();
  // A waiter may still be running a collective inline (Note [waiter runs it]).
  std::unique_lock<std::mutex> lock(q.mutex);
  q.cv.wait(lock, [&q] { return !q.running; });
}

std::shared_ptr<Work> ThreadedCommunicator::submit(Collective c) {
  comm::stage(c, rank());  // Note [host staging]
  auto work = std::make_shared<ThreadWork>(info_of(c), c.describe(), options().timeout);
  // The waiter touches `this` only after claiming the queue, and stop_thread()
  // (first in every backend's destructor) waits for such a claim to end.
  std::weak_ptr<Queue> weak = queue_;
  work->set_helper([this, weak](const ThreadWork& w, bool run_here) {
    auto q = weak.lock();
    if (q == nullptr) return;
    if (run_here) {
      run_queued_until(*q, w);
    } else {
      q->cv.notify_all();  // queued under CallerRuns: the thread has not been told
    }
  });
  Queue& q = *queue_;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    if (q.broken) {
      notify_collective(work->info(), CollectiveState::failed);
      work->fail(q.broken);
      return work;
    }
    q.tasks.push_back({std::move(c), work});
  }
  if (!caller_runs()) q.cv.notify_all();  // Note [caller runs it]
  return work;
}

void ThreadedCommunicator::run_queued_until(Queue& q, const ThreadWork& work) {
  for (;;) {
    Task task;
    {
      std::lock_guard<std::mutex> lock(q.mutex);
      if (work.done() || q.running || q.stopping || q.broken || q.tasks.empty()) return;
      task = std::move(q.tasks.front());
      q.tasks.pop_front();
      q.running = true;
    }
    execute(q, task);
  }
}

void ThreadedCommunicator::loop() {
  Queue& q = *queue_;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(q.mutex);
      q.cv.wait(lock, [&q] { return q.stopping || (!q.tasks.empty() && !q.running); });
      if (q.tasks.empty()) return;
      task = std::move(q.tasks.front());
      q.tasks.pop_front();
      if (q.stopping || q.broken) {
        notify_collective(task.work->info(), CollectiveState::failed);
        task.work->fail(q.broken ? q.broken
                                 : std::make_exception_ptr(CommError(
                                       fmt::format("rank {}: {} cancelled: the communicator was "
                                                   "destroyed",
                                                   rank(), task.collective.describe()),
                                       rank(), task.work->description(), task.collective.sequence,
                                       task.collective.count())));
        continue;
      }
      q.running = true;
    }
    execute(q, task);
  }
}

namespace {

bool is_timeout(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CommTimeoutError&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

// Runs one claimed task (q.running is set) and releases the claim.
void ThreadedCommunicator::execute(Queue& q, Task& task) {
  try {
    if (debug_ && size() > 1) check_fingerprints(task.collective);
    task.work->start();
    notify_collective(task.work->info(), CollectiveState::started);
    comm::before_run(task.collective);
    run(task.collective);
    comm::after_run(task.collective, staging_stream(task.collective));
    notify_collective(task.work->info(), CollectiveState::completed);
    task.work->finish();
  } catch (...) {
    std::exception_ptr error = std::current_exception();
    {
      std::lock_guard<std::mutex> lock(q.mutex);
      q.broken = error;
    }
    // A backend's own timeout (fail_timeout) is told as Work::wait's is, so the flight
    // recorder marks the record timed_out and dumps with "timed out" as the reason.
    if (is_timeout(error)) notify_collective(task.work->info(), CollectiveState::timed_out);
    notify_collective(task.work->info(), CollectiveState::failed);
    task.work->fail(error);
  }
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    q.running = false;
  }
  q.cv.notify_all();
}

// One stream for the copies back of staged collectives; only the thread that
// holds the queue's claim (q.running) gets here.
const Stream& ThreadedCommunicator::staging_stream(const Collective& c) {
  if (c.staging) {
    const Device& device = c.staging->device_output.device();
    if (staging_stream_.device() != device) staging_stream_ = Stream::create(device);
  }
  return staging_stream_;
}

void ThreadedCommunicator::fail(const Collective& c, const std::string& message) const {
  throw CommError(fmt::format("rank {}: {} failed on the {} backend: {}", rank(), c.describe(),
                              backend(), message),
                  rank(), c.describe(), c.sequence, c.count());
}

void ThreadedCommunicator::fail_timeout(const Collective& c, const std::string& message) const {
  throw CommTimeoutError(
      fmt::format("rank {}: {} timed out after {:.1f} s on the {} backend: {}", rank(),
                  c.describe(), static_cast<double>(options().timeout.count()) / 1000.0, backend(),
                  message),
      rank(), c.describe(), c.sequence, c.count());
}

// Note [collective fingerprints]: with DDP_DEBUG=detail every collective is
// preceded by an all_gather of (kind, op, root, dtype, count) over the same
// backend, and any difference fails every rank with both sides named.
void ThreadedCommunicator::check_fingerprints(const Collective& c) {
  const std::array<int64_t, 5> mine = {static_cast<int64_t>(c.kind), static_cast<int64_t>(c.op),
                                       c.root, static_cast<int64_t>(c.dtype()), c.count()};
  Tensor in = from_vector<int64_t>(std::vector<int64_t>(mine.begin(), mine.end()), {5});
  Tensor out = zeros({5 * size()}, {.dtype = DType::i64});
  run({CollectiveKind::all_gather, ReduceOp::sum, 0, c.sequence, in, out, {}, {}});
  const auto all = out.to_vector<int64_t>();
  for (int r = 0; r < size(); ++r) {
    Collective theirs;
    theirs.kind = static_cast<CollectiveKind>(all[static_cast<size_t>(5 * r)]);
    theirs.op = static_cast<ReduceOp>(all[static_cast<size_t>(5 * r + 1)]);
    theirs.root = static_cast<int>(all[static_cast<size_t>(5 * r + 2)]);
    theirs.sequence = c.sequence;
    const bool same = std::equal(mine.begin(), mine.end(), all.begin() + 5 * r);
    if (!same) {
      fail(c, fmt::format("collective mismatch: rank {} issued {} while rank {} issued {} of {} {} "
                          "(DDP_DEBUG=detail)",
                          rank(), c.describe(), r, theirs.describe(),
                          all[static_cast<size_t>(5 * r + 4)],
                          dtype_name(static_cast<DType>(all[static_cast<size_t>(5 * r + 3)]))));
    }
  }
}

}  // namespace ddp
