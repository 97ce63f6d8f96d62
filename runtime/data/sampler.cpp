#include "runtime/data/sampler.h"

#include "runtime/error.h"
#include "runtime/rng/philox.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace ddp {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size,
                                       SamplerOptions options)
    : dataset_size_(dataset_size), rank_(rank), world_size_(world_size), options_(options) {
  DDP_CHECK(world_size >= 1, "DistributedSampler: world_size must be >= 1, got {}", world_size);
  DDP_CHECK(rank >= 0 && rank < world_size,
            "DistributedSampler: rank {} is out of range for world_size {} (valid ranks: 0 to {})",
            rank, world_size, world_size - 1);
  DDP_CHECK(dataset_size >= 0, "DistributedSampler: dataset_size must be >= 0, got {}",
            dataset_size);
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch, int64_t start) {
  DDP_CHECK(start >= 0 && (start == 0 || !uneven()),
            "DistributedSampler::set_epoch: start {} must be >= 0, and 0 when the shares are "
            "uneven (drop_last=false, pad=false)",
            start);
  epoch_ = epoch;
  start_ = std::min(start, dataset_size_);
  // PyTorch: drop_last and an uneven split -> floor(N / W); else ceil(N / W).
  const int64_t n = remaining();
  num_samples_ = options_.drop_last ? n / world_size_ : (n + world_size_ - 1) / world_size_;
}

int64_t DistributedSampler::num_samples_of(int rank) const {
  DDP_CHECK(rank >= 0 && rank < world_size_,
            "DistributedSampler::num_samples_of: rank {} is out of range for world_size {} "
            "(valid ranks: 0 to {})",
            rank, world_size_, world_size_ - 1);
  if (!uneven()) return num_samples_;
  // Positions rank, rank + W, ... below N.
  return dataset_size_ > rank ? (dataset_size_ - rank + world_size_ - 1) / world_size_ : 0;
}

std::vector<int64_t> philox_permutation(int64_t n, uint64_t key) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  rng::Philox4 block{};
  for (int64_t k = 0; k + 1 < n; ++k) {
    if (k % 2 == 0) block = rng::philox_block(key, static_cast<uint64_t>(k / 2));
    const int w = static_cast<int>(k % 2) * 2;  // words 0,1 or 2,3 of the block
    const uint64_t r = (uint64_t{block.v[w]} << 32) | block.v[w + 1];
    const int64_t j = n - 1 - k;
    const auto pick = static_cast<int64_t>(r % static_cast<uint64_t>(j + 1));
    std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick)]);
  }
  return perm;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = philox_permutation(dataset_size_, options_.seed + static_cast<uint64_t>(epoch_));
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  order.erase(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(start_));
  const auto total = static_cast<size_t>(total_size());
  // Pad by repeating from the start (more than once when N < W), or cut the tail.
  for (size_t i = 0; order.size() < total; ++i) {
    const int64_t repeated = order[i];
    order.push_back(repeated);
  }
  order.resize(total);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples()));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(world_size_)) {
    mine.push_back(order[i]);
  }
  return mine;
}

}  // namespace ddp
