// Random contiguous windows of a byte stream for language-model training,
// shared out by the DistributedSampler's rules: in an epoch the windows of all
// ranks are disjoint, each epoch has a new order (and new window boundaries),
// and everything follows from the seed, so every rank computes its own share
// without communication.
//
// Note [text windows]: a window is context + 1 bytes: inputs are its first
// `context` bytes and targets the last `context` (the input shifted by one).
// Epoch e cuts the stream into N = floor((bytes - context) / (context + 1))
// back-to-back windows starting at offset o_e + i * (context + 1), i = 0..N-1,
// where o_e in [0, context] is drawn from Philox (key seed + epoch, counter
// 2^62, clear of the counters the permutation uses), so the boundaries move
// between epochs and every byte can be a window's first. The window numbers
// 0..N-1 are the "dataset indices" of a DistributedSampler with drop_last
// (padding would repeat windows), or with drop_last=false and pad=false its
// uneven shares (train --drop-last false): the same permutation, rank r taking
// positions r, r + W, ... Without shuffle the offset is 0 and the order 0..N-1.
// The o_e bytes before the first window and the (at most 2 * context) after
// the last are not read in that epoch. An elastic regroup (docs/elastic.md)
// reshards the sampler and starts the epoch at the group's cursor (Note
// [elastic resharding] in sampler.h): the offset and the order depend on the
// seed and the epoch only, so the windows the new world shares out are the
// epoch's windows the old one had not taken, on the same boundaries.
#pragma once

#include "runtime/data/sampler.h"
#include "runtime/data/token_shards.h"
#include "runtime/tensor.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace ddp {

class TextWindowSampler {
 public:
  // Throws ValueError unless context >= 1 and the stream holds at least one
  // window per rank (bytes >= world_size * (context + 1) + context), naming the sizes.
  TextWindowSampler(int64_t stream_bytes, int64_t context, int rank, int world_size,
                    SamplerOptions options = {});

  // start: the epoch's first window positions (of its order) already taken by a
  // group of another size (Note [elastic resharding]); ValueError when uneven.
  void set_epoch(int64_t epoch, int64_t start = 0) { sampler_.set_epoch(epoch, start); }
  int64_t epoch() const { return sampler_.epoch(); }
  int64_t start() const { return sampler_.start(); }
  // The window positions shared out this epoch: those from start() on.
  int64_t remaining() const { return sampler_.remaining(); }
  // The same windows for `rank` of `world_size` (an elastic regroup); call
  // set_epoch before starts().
  void reshard(int rank, int world_size);
  // This rank's windows per epoch (the same on every rank unless uneven), and rank r's.
  int64_t num_windows() const { return sampler_.num_samples(); }
  int64_t num_windows_of(int rank) const { return sampler_.num_samples_of(rank); }
  bool uneven() const { return sampler_.uneven(); }
  int64_t context() const { return context_; }
  // This epoch's offset o_e of Note [text windows].
  int64_t offset() const;
  // This rank's window start positions in the stream for the current epoch.
  std::vector<int64_t> starts() const;

 private:
  int64_t context_;
  DistributedSampler sampler_;
};

// The windows at `starts` as a batch: inputs[b][t] = stream[starts[b] + t] and
// targets[b][t] = stream[starts[b] + t + 1], both i64 [starts.size(), context]
// on the CPU, byte values 0..255.
struct TokenBatch {
  Tensor inputs;
  Tensor targets;
};
TokenBatch window_batch(std::string_view stream, std::span<const int64_t> starts, int64_t context);
// The same from a token stream (bytes or token shards): tokens as they are.
TokenBatch window_batch(const TokenStream& stream, std::span<const int64_t> starts,
                        int64_t context);

}  // namespace ddp
