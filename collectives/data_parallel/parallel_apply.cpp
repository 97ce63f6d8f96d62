#include "collectives/data_parallel/parallel_apply.h"

#include "runtime/autograd/autocast.h"
#include "runtime/autograd/autograd.h"
#include "runtime/cuda/cuda_api.h"

#include <optional>

namespace ddp::data_parallel {
namespace {

// Rethrows `error` as the same ddp exception type with `prefix` before its message.
[[noreturn]] void rethrow_with_prefix(const std::exception_ptr& error, const std::string& prefix) {
  try {
    std::rethrow_exception(error);
  } catch (const ValueError& e) {
    throw ValueError(prefix + e.what());
  } catch (const DeviceError& e) {
    throw DeviceError(prefix + e.what());
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(prefix + e.what());
  } catch (const CudaError& e) {
    throw CudaError(prefix + e.what());
  } catch (const InternalError& e) {
    throw InternalError(prefix + e.what());
  } catch (const Error& e) {
    throw Error(prefix + e.what());
  }
  // Anything else (std::bad_alloc, ...) propagates unchanged from the rethrow above.
}

// Runs `job` with `device` current if it is a GPU. Without it a worker thread, which
// never chose a device, would run CUDA calls on GPU 0 (creating a context there) and
// the stream handle nullptr would mean GPU 0's default stream (Note [device guard]
// in runtime/cuda/cuda_api.h).
void run_on(const Device& device, const std::function<void()>& job) {
  std::optional<cuda_api::DeviceGuard> guard;
  if (device.is_cuda()) guard.emplace(device.index);
  job();
}

}  // namespace

ReplicaThreads::ReplicaThreads(size_t count) : errors_(count) {
  DDP_CHECK(count >= 1, "ReplicaThreads: need at least one job slot");
  for (size_t i = 1; i < count; ++i) threads_.emplace_back([this, i] { worker_loop(i); });
}

ReplicaThreads::~ReplicaThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ReplicaThreads::worker_loop(size_t index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void()>* job = nullptr;
    Device device;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      // A worker without a job this call may wake after run() returned: jobs_ is null.
      if (jobs_ != nullptr && index < jobs_->size()) {
        job = &(*jobs_)[index];
        device = (*devices_)[index];
      }
    }
    if (job == nullptr) continue;  // fewer jobs than threads this time
    std::exception_ptr error;
    try {
      run_on(device, *job);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    // Moved, so the exception is released by the caller's thread, which reads it.
    errors_[index] = std::move(error);
    if (--pending_ == 0) done_.notify_one();
  }
}

void ReplicaThreads::run(const std::vector<std::function<void()>>& jobs,
                         const std::vector<Device>& devices) {
  DDP_CHECK(!jobs.empty() && jobs.size() <= threads_.size() + 1 && devices.size() >= jobs.size(),
            "ReplicaThreads::run: {} jobs for {} threads", jobs.size(), threads_.size() + 1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_ = &jobs;
    devices_ = &devices;
    pending_ = jobs.size() - 1;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    ++generation_;
  }
  if (jobs.size() > 1) wake_.notify_all();
  try {
    run_on(devices[0], jobs[0]);
  } catch (...) {
    errors_[0] = std::current_exception();
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    jobs_ = nullptr;
    devices_ = nullptr;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (errors_[i]) {
      rethrow_with_prefix(errors_[i], fmt::format("replica {} on {}: ", i, devices[i].str()));
    }
  }
}

std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Stream>& streams, ReplicaThreads& threads) {
  const size_t n = replicas.size();
  DDP_ASSERT(inputs.size() == n && streams.size() >= n, "{} replicas, {} inputs, {} streams", n,
             inputs.size(), streams.size());
  const bool grad_mode = grad_mode_enabled();
  const AutocastState autocast = autocast_state();
  std::vector<Device> devices;
  std::vector<Event> queued, finished;  // on the CPU both are no-ops
  queued.reserve(n);
  finished.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    devices.push_back(inputs[i].device());
    DDP_ASSERT(streams[i].device() == devices[i] || !devices[i].is_cuda(),
               "replica {}: its stream is on {} but its input on {}", i, streams[i].device().str(),
               devices[i].str());
    queued.emplace_back(devices[i], /*enable_timing=*/false);
    finished.emplace_back(devices[i], /*enable_timing=*/false);
    queued[i].record(current_stream(devices[i]));
  }
  std::vector<Tensor> outputs(n);
  std::vector<std::function<void()>> jobs;
  for (size_t i = 0; i < n; ++i) {
    jobs.emplace_back([&, i] {
      // Note [autograd and threads]: a worker starts with grad mode on and outside
      // any autocast region (Note [autocast]): it takes the caller's.
      std::optional<NoGradGuard> no_grad;
      if (!grad_mode) no_grad.emplace();
      const AutocastGuard mixed_precision(autocast);
      StreamGuard stream(streams[i]);
      queued[i].block(streams[i]);
      outputs[i] = replicas[i]->forward(inputs[i]);
      finished[i].record(streams[i]);
    });
  }
  threads.run(jobs, devices);
  for (size_t i = 0; i < n; ++i) finished[i].block(current_stream(devices[i]));
  return outputs;
}

}  // namespace ddp::data_parallel
