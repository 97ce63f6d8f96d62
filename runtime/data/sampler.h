// DistributedSampler: which samples each rank reads in an epoch, as PyTorch's
// torch.utils.data.distributed.DistributedSampler.
//
// Every rank builds the same ordering -- a permutation of 0..N-1 seeded by
// (seed + epoch), or 0..N-1 without shuffle -- then evens it to a multiple of
// the world size: drop_last=false pads by repeating indices from the start
// (some samples are seen twice per epoch), drop_last=true cuts the tail. Rank r
// takes positions r, r + W, r + 2W, ... so the shards are disjoint and every
// rank gets num_samples() indices (the ranks must run the same number of steps).
// A third mode, not in PyTorch: drop_last=false with pad=false neither pads nor
// cuts, so every sample is seen exactly once and rank r gets ceil((N - r) / W)
// indices: ranks below N mod W one more than the others. Their step counts may
// then differ, which DistributedDataParallel survives under a Join
// (collectives/ddp/join.h; train --drop-last false).
//
// Note [sampler shuffle]: the permutation is a Fisher-Yates shuffle driven by
// Philox 4x32-10 (runtime/rng/philox.h) with key seed + epoch: step k (k = 0, 1,
// ...) swaps position j = N-1-k with position r mod (j + 1), where r is the
// 64-bit number whose high half is word 2k and low half word 2k+1 of the stream
// (word w = philox_block(key, w / 4).v[w % 4]). The modulo bias is below N / 2^64. The result is
// the same on every platform and compiler (std::shuffle is not), but differs from torch.randperm's.
//
// Note [elastic resharding]: set_epoch(epoch, start) shares out only the
// ordering's positions from `start` on: the first `start` were taken by the
// group before it changed size (an elastic regroup, docs/elastic.md), so the
// rest of the epoch goes to the new world -- evened as above (padded from the
// start of the rest, or cut) -- and no sample is taken twice or skipped. With
// start 0 it is the plain sampler; the uneven mode (pad=false) has no start.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;  // must be the same on every rank
  bool drop_last = false;
  // drop_last=false: pad to a multiple of the world size (PyTorch), or leave
  // the shares uneven (pad=false). Ignored with drop_last.
  bool pad = true;
};

class DistributedSampler {
 public:
  // Throws ValueError unless dataset_size >= 0, world_size >= 1 and 0 <= rank < world_size.
  DistributedSampler(int64_t dataset_size, int rank, int world_size, SamplerOptions options = {});

  // Call before each epoch (as PyTorch's set_epoch) so each epoch has a new order.
  // start: the epoch's first positions already taken (Note [elastic resharding]);
  // ValueError when negative, or positive with pad=false.
  void set_epoch(int64_t epoch, int64_t start = 0);
  int64_t start() const { return start_; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch (num_samples() of them).
  std::vector<int64_t> indices() const;
  // This rank's indices per epoch: ceil(N / W), or floor(N / W) with drop_last;
  // uneven (pad=false): num_samples_of(rank()).
  int64_t num_samples() const { return num_samples_of(rank_); }
  // Rank r's (every rank computes every rank's: the same on every rank).
  int64_t num_samples_of(int rank) const;
  // The most any rank gets: rank 0's.
  int64_t max_num_samples() const { return num_samples_of(0); }
  bool uneven() const { return !options_.drop_last && !options_.pad; }
  // Positions of the evened ordering that are shared out: N when uneven.
  int64_t total_size() const { return uneven() ? dataset_size_ : num_samples_ * world_size_; }
  // The positions shared out this epoch: those from start() on.
  int64_t remaining() const { return dataset_size_ - start_; }
  int64_t dataset_size() const { return dataset_size_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const SamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  int rank_;
  int world_size_;
  SamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
  int64_t start_ = 0;  // Note [elastic resharding]
};

// The permutation of 0..n-1 of Note [sampler shuffle] for Philox key `key`.
std::vector<int64_t> philox_permutation(int64_t n, uint64_t key);

}  // namespace ddp
