#include "runtime/data/text_windows.h"

#include "runtime/error.h"
#include "runtime/rng/philox.h"

namespace ddp {
namespace {

// Counter of the offset's Philox block: far above the permutation's counters (< N / 2).
constexpr uint64_t kOffsetCounter = uint64_t{1} << 62;

int64_t windows_in(int64_t stream_bytes, int64_t context, int world_size) {
  DDP_CHECK(context >= 1, "TextWindowSampler: context must be >= 1, got {}", context);
  const int64_t n = stream_bytes >= context ? (stream_bytes - context) / (context + 1) : 0;
  DDP_CHECK(n >= world_size,
            "TextWindowSampler: a stream of {} tokens holds {} windows of context {} (+1 "
            "token), fewer than one per rank for world_size {}; it needs at least {} tokens (a "
            "byte model's tokens are its bytes). Use a shorter context or more text",
            stream_bytes, n, context, world_size, int64_t{world_size} * (context + 1) + context);
  return n;
}

SamplerOptions with_drop_last(SamplerOptions options) {
  // Padding would repeat windows (Note [text windows]): drop, unless uneven shares
  // (drop_last=false, pad=false) were asked for.
  options.drop_last = options.drop_last || options.pad;
  return options;
}

}  // namespace

TextWindowSampler::TextWindowSampler(int64_t stream_bytes, int64_t context, int rank,
                                     int world_size, SamplerOptions options)
    : context_(context),
      sampler_(windows_in(stream_bytes, context, world_size), rank, world_size,
               with_drop_last(options)) {}

void TextWindowSampler::reshard(int rank, int world_size) {
  sampler_ = DistributedSampler(sampler_.dataset_size(), rank, world_size, sampler_.options());
}

int64_t TextWindowSampler::offset() const {
  if (!sampler_.options().shuffle) return 0;
  const uint64_t key = sampler_.options().seed + static_cast<uint64_t>(sampler_.epoch());
  return static_cast<int64_t>(rng::philox_block(key, kOffsetCounter).v[0] %
                              static_cast<uint64_t>(context_ + 1));
}

std::vector<int64_t> TextWindowSampler::starts() const {
  std::vector<int64_t> out = sampler_.indices();
  const int64_t o = offset();
  for (int64_t& i : out) i = o + i * (context_ + 1);
  return out;
}

TokenBatch window_batch(std::string_view stream, std::span<const int64_t> starts, int64_t context) {
  const auto rows = static_cast<int64_t>(starts.size());
  TokenBatch batch{empty({rows, context}, {.dtype = DType::i64}),
                   empty({rows, context}, {.dtype = DType::i64})};
  int64_t* in = batch.inputs.data<int64_t>();
  int64_t* tgt = batch.targets.data<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t s = starts[static_cast<size_t>(b)];
    DDP_CHECK(s >= 0 && s + context + 1 <= static_cast<int64_t>(stream.size()),
              "window_batch: window {} starts at {}, but a window of context {} needs "
              "start + {} <= {} (the stream's size)",
              b, s, context, context + 1, stream.size());
    for (int64_t t = 0; t < context; ++t) {
      in[b * context + t] = static_cast<uint8_t>(stream[static_cast<size_t>(s + t)]);
      tgt[b * context + t] = static_cast<uint8_t>(stream[static_cast<size_t>(s + t + 1)]);
    }
  }
  return batch;
}

TokenBatch window_batch(const TokenStream& stream, std::span<const int64_t> starts,
                        int64_t context) {
  const auto rows = static_cast<int64_t>(starts.size());
  TokenBatch batch{empty({rows, context}, {.dtype = DType::i64}),
                   empty({rows, context}, {.dtype = DType::i64})};
  int64_t* in = batch.inputs.data<int64_t>();
  int64_t* tgt = batch.targets.data<int64_t>();
  std::vector<int64_t> window(static_cast<size_t>(context + 1));
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t s = starts[static_cast<size_t>(b)];
    DDP_CHECK(s >= 0 && s + context + 1 <= stream.size(),
              "window_batch: window {} starts at {}, but a window of context {} needs "
              "start + {} <= {} (the stream's size)",
              b, s, context, context + 1, stream.size());
    stream.read(s, context + 1, window.data());
    std::copy(window.begin(), window.end() - 1, in + b * context);
    std::copy(window.begin() + 1, window.end(), tgt + b * context);
  }
  return batch;
}

}  // namespace ddp
