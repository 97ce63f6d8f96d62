// A seeded position in the Philox stream: each draw takes the next counters, so a
// sequence of draws from one Generator is the same on every device.
#pragma once

#include "runtime/rng/philox.h"

#include <cstdint>

namespace ddp {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t offset = 0) : seed_(seed), offset_(offset) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  // Reserves the counters for `numel` elements and returns the offset to draw them at.
  uint64_t take(int64_t numel) {
    const uint64_t at = offset_;
    offset_ += rng::philox_counters(static_cast<uint64_t>(numel));
    return at;
  }
  void set_offset(uint64_t offset) { offset_ = offset; }

 private:
  uint64_t seed_;
  uint64_t offset_;
};

}  // namespace ddp
