// DataLoader: batches of a Dataset for one rank, on the training device.
//
//   DataLoader loader(train, {.batch_size = 64, .device = device},
//                     DistributedSampler(train.size(), rank, world_size, {.seed = 1}));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);               // reshuffles (the sampler's set_epoch)
//     for (Batch b; loader.next(b);) step(b.inputs, b.labels);
//   }
//
// The sampler decides which samples this rank sees; the loader cuts them, in the
// sampler's order, into num_batches() batches of batch_size (the last one smaller
// unless drop_last). Rows are gathered on the host -- into pinned memory when the
// device is CUDA, then copied with to(device, non_blocking=true) on the calling
// thread's current stream, so the copy is ordered before the work that uses the
// batch on that stream. With prefetch, the next batch is gathered by a background
// task (std::async) while the caller works on the current one; at most one task
// is in flight and it is waited for by start_epoch and the destructor.
//
// A DataLoader is used from one thread. It shares the Dataset's tensors, which
// must not be modified while it is alive.
#pragma once

#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"

#include <future>
#include <vector>

namespace ddp {

struct LoaderOptions {
  int64_t batch_size = 64;
  Device device = Device::cpu();
  bool drop_last = false;  // drop this rank's last batch of an epoch when it is short
  bool prefetch = true;    // gather the next batch in the background
};

struct Batch {
  Tensor inputs;  // [B, ...] as dataset.inputs, on options.device
  Tensor labels;  // [B, ...] as dataset.labels, on options.device
};

class DataLoader {
 public:
  // Throws ValueError for batch_size < 1, a non-CPU or inconsistent dataset, or a
  // sampler built for a different dataset size; DeviceError for an unavailable device.
  DataLoader(const Dataset& dataset, LoaderOptions options, DistributedSampler sampler);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch on this rank (the same on every rank unless the sampler
  // is uneven: DistributedSampler's pad=false).
  int64_t num_batches() const;
  // Rank r's batches per epoch, and the rows of its batch `batch` (0 past its
  // last): every rank computes every rank's without communication.
  int64_t num_batches_of(int rank) const;
  int64_t batch_rows_of(int rank, int64_t batch) const;
  // Starts epoch `epoch`: sets the sampler's epoch and rewinds. Must be called
  // before the first next().
  // start: the epoch's first sampler positions already taken by a group of another
  // size (Note [elastic resharding] in sampler.h).
  void start_epoch(int64_t epoch, int64_t start = 0);
  // The same sampler for `rank` of `world_size` (an elastic regroup); call
  // start_epoch before the next batch.
  void reshard(int rank, int world_size);
  // The next batch of the epoch into `out`; false (out untouched) when the epoch is over.
  bool next(Batch& out);

  const Dataset& dataset() const { return dataset_; }
  const LoaderOptions& options() const { return options_; }
  const DistributedSampler& sampler() const { return sampler_; }

 private:
  struct HostBatch {
    Tensor inputs;
    Tensor labels;
  };
  std::vector<int64_t> batch_indices(int64_t batch) const;
  static HostBatch gather(const Dataset& dataset, const std::vector<int64_t>& indices, bool pinned);
  void launch_prefetch(int64_t batch);
  // Note [prefetch on the cpu]: a batch of the zoo's models is gathered in tens of
  // microseconds, less than handing it over from another thread costs (a thread per
  // batch measured 30% slower steps on a loaded 2-core machine), so the background
  // gather runs only when the batch goes to a GPU, where it overlaps device work.
  bool prefetching() const { return options_.prefetch && options_.device.is_cuda(); }

  Dataset dataset_;
  LoaderOptions options_;
  DistributedSampler sampler_;
  std::vector<int64_t> epoch_indices_;  // this rank's sampler indices for the epoch
  int64_t cursor_ = 0;                  // the batch next() returns next
  bool started_ = false;
  std::future<HostBatch> pending_;  // the prefetched batch `cursor_`, if any
};

}  // namespace ddp
