#include "runtime/data/loader.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/error.h"

#include <algorithm>
#include <cstring>
#include <optional>

namespace ddp {

DataLoader::DataLoader(const Dataset& dataset, LoaderOptions options, DistributedSampler sampler)
    : dataset_(dataset), options_(options), sampler_(sampler) {
  DDP_CHECK(options.batch_size >= 1, "DataLoader: batch_size must be >= 1, got {}",
            options.batch_size);
  DDP_CHECK(dataset.inputs.defined() && dataset.labels.defined(),
            "DataLoader: dataset '{}' has no inputs or labels", dataset.name);
  DDP_CHECK(dataset.inputs.device().is_cpu() && dataset.labels.device().is_cpu(),
            "DataLoader: dataset '{}' must be on the cpu (batches move to {}), found inputs on {}",
            dataset.name, options.device.str(), dataset.inputs.device().str());
  DDP_CHECK(dataset.inputs.dim() >= 1 && dataset.labels.dim() >= 1 &&
                dataset.inputs.size(0) == dataset.labels.size(0),
            "DataLoader: dataset '{}' has inputs {} and labels {}; expected [N, ...] and [N, ...] "
            "with the same N (one row of each per sample)",
            dataset.name, shape_str(dataset.inputs.shape()), shape_str(dataset.labels.shape()));
  DDP_CHECK(sampler.dataset_size() == dataset.size(),
            "DataLoader: the sampler was built for {} samples, dataset '{}' has {}",
            sampler.dataset_size(), dataset.name, dataset.size());
  check_available(options.device);
}

DataLoader::~DataLoader() {
  if (pending_.valid()) pending_.wait();
}

int64_t DataLoader::num_batches() const {
  return num_batches_of(sampler_.rank());
}

int64_t DataLoader::num_batches_of(int rank) const {
  const int64_t n = sampler_.num_samples_of(rank);
  const int64_t b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t DataLoader::batch_rows_of(int rank, int64_t batch) const {
  if (batch < 0 || batch >= num_batches_of(rank)) return 0;
  return std::min(options_.batch_size, sampler_.num_samples_of(rank) - batch * options_.batch_size);
}

void DataLoader::reshard(int rank, int world_size) {
  if (pending_.valid()) pending_ = {};
  sampler_ = DistributedSampler(sampler_.dataset_size(), rank, world_size, sampler_.options());
  started_ = false;
}

void DataLoader::start_epoch(int64_t epoch, int64_t start) {
  if (pending_.valid()) pending_ = {};  // waits for the task; drops its batch or error
  sampler_.set_epoch(epoch, start);
  epoch_indices_ = sampler_.indices();
  cursor_ = 0;
  started_ = true;
  if (prefetching() && num_batches() > 0) launch_prefetch(0);
}

bool DataLoader::next(Batch& out) {
  DDP_CHECK(started_,
            "DataLoader::next: call start_epoch(epoch) first; the epoch seeds the shuffle "
            "(PyTorch's sampler.set_epoch), so every epoch gets a new order");
  if (cursor_ >= num_batches()) return false;
  const bool pinned = options_.device.is_cuda();
  HostBatch host =
      pending_.valid() ? pending_.get() : gather(dataset_, batch_indices(cursor_), pinned);
  ++cursor_;
  if (prefetching() && cursor_ < num_batches()) launch_prefetch(cursor_);
  // Asynchronous from pinned memory; the pinned block is reused only after the copy.
  out.inputs = host.inputs.to(options_.device, /*non_blocking=*/true);
  out.labels = host.labels.to(options_.device, /*non_blocking=*/true);
  return true;
}

std::vector<int64_t> DataLoader::batch_indices(int64_t batch) const {
  const int64_t begin = batch * options_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(epoch_indices_.size()));
  return {epoch_indices_.begin() + begin, epoch_indices_.begin() + end};
}

void DataLoader::launch_prefetch(int64_t batch) {
  // The task owns copies of everything it reads: Tensor handles of the (immutable)
  // dataset and its batch's indices; nothing it touches is shared with this thread.
  // The task's thread allocates pinned memory, a CUDA call: with the loader's device
  // current, so that it does not create a context on GPU 0 (Note [device guard] in
  // runtime/cuda/cuda_api.h).
  pending_ = std::async(std::launch::async, [dataset = dataset_, indices = batch_indices(batch),
                                             device = options_.device] {
    std::optional<cuda_api::DeviceGuard> guard;
    if (device.is_cuda()) guard.emplace(device.index);
    return gather(dataset, indices, /*pinned=*/device.is_cuda());
  });
}

DataLoader::HostBatch DataLoader::gather(const Dataset& dataset,
                                         const std::vector<int64_t>& indices, bool pinned) {
  const auto rows = static_cast<int64_t>(indices.size());
  auto batch_shape = [rows](const Tensor& t) {
    Shape s = t.shape();
    s[0] = rows;
    return s;
  };
  HostBatch out;
  const Tensor* sources[2] = {&dataset.inputs, &dataset.labels};
  Tensor* targets[2] = {&out.inputs, &out.labels};
  for (int k = 0; k < 2; ++k) {
    const Tensor& src = *sources[k];
    *targets[k] = empty(batch_shape(src), {.dtype = src.dtype(), .pinned = pinned});
    const size_t row_bytes = src.size(0) == 0 ? 0 : src.nbytes() / static_cast<size_t>(src.size(0));
    const auto* from = static_cast<const char*>(src.data_ptr());
    auto* to = static_cast<char*>(targets[k]->data_ptr());
    for (int64_t i = 0; i < rows && row_bytes > 0; ++i) {
      std::memcpy(to + static_cast<size_t>(i) * row_bytes,
                  from + static_cast<size_t>(indices[static_cast<size_t>(i)]) * row_bytes,
                  row_bytes);
    }
  }
  return out;
}

}  // namespace ddp
