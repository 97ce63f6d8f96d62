// Parallel apply for DataParallel: each replica's forward in its own thread.
#pragma once

#include "runtime/nn/module.h"
#include "runtime/stream.h"

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ddp::data_parallel {

// A fixed set of threads that run one job each per call. Job 0 runs on the calling
// thread, job i >= 1 on worker thread i - 1, the same thread every call (so the
// per-thread state of a device, such as its cuBLAS handle, is made once).
class ReplicaThreads {
 public:
  explicit ReplicaThreads(size_t count);  // count >= 1 jobs per call at most
  ~ReplicaThreads();                      // joins the workers
  ReplicaThreads(const ReplicaThreads&) = delete;
  ReplicaThreads& operator=(const ReplicaThreads&) = delete;

  // Runs jobs[i] as above (jobs.size() <= count), with devices[i] current if it is a
  // GPU (the calling thread's device is restored afterwards, Note [device guard] in
  // runtime/cuda/cuda_api.h), and returns when all have finished.
  // If any threw, rethrows the exception of the lowest index, of the same type,
  // its message prefixed with "replica i on <device>: " (devices[i]).
  void run(const std::vector<std::function<void()>>& jobs, const std::vector<Device>& devices);

 private:
  void worker_loop(size_t index);

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;  // bumped once per run() so each worker runs its job once
  size_t pending_ = 0;
  bool stopping_ = false;
  const std::vector<std::function<void()>>* jobs_ = nullptr;
  const std::vector<Device>* devices_ = nullptr;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

// Runs replicas[i]->forward(inputs[i]) on threads.run's thread i with streams[i]
// current (on CUDA: the replica's own stream, ordered after the work queued so far
// on the caller's current stream of that device, and the caller's stream is ordered
// after the replica's work on return), and with the caller's grad mode. Returns the
// outputs in replica order.
std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Stream>& streams, ReplicaThreads& threads);

}  // namespace ddp::data_parallel
