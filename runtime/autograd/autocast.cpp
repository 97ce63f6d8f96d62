#include "runtime/autograd/autocast.h"

#include "runtime/autograd/autograd.h"
#include "runtime/ops/ops.h"

#include <unordered_map>

namespace ddp {
namespace {

// The cast cache of Note [autocast]: keyed by the parameter's TensorImpl, which
// the entry keeps alive, so a key is never reused for another tensor while cached.
struct CastCache {
  struct Entry {
    std::shared_ptr<TensorImpl> source;
    Tensor lowered;
  };
  std::unordered_map<const TensorImpl*, Entry> entries;
  int64_t hits = 0;
};

thread_local AutocastState t_state;
thread_local int t_depth = 0;  // live guards in this thread
thread_local CastCache t_cache;

}  // namespace

AutocastState autocast_state() {
  return t_state;
}

bool autocast_enabled() {
  return t_state.enabled;
}

AutocastGuard::AutocastGuard(DType dtype, bool enabled)
    : AutocastGuard(AutocastState{enabled, dtype}) {}

AutocastGuard::AutocastGuard(const AutocastState& state) : previous_(t_state) {
  DDP_CHECK(!state.enabled || state.dtype == DType::bf16,
            "autocast: dtype {} is not supported; use bf16 (f16 needs loss scaling, which ddp "
            "does not have)",
            dtype_name(state.dtype));
  t_state = state;
  ++t_depth;
}

AutocastGuard::~AutocastGuard() {
  t_state = previous_;
  if (--t_depth == 0) t_cache = CastCache{};
}

void check_bf16_gpu(const std::string& device, const std::string& gpu_name, int major, int minor) {
  DDP_CHECK(major >= 8,
            "--precision bf16 needs a GPU with bf16 tensor cores (compute capability 8.0 or later: "
            "A100, H100, RTX 30xx and newer), but {} is a {} of compute capability {}.{}; use "
            "--precision fp32 there",
            device, gpu_name, major, minor);
}

namespace autocast {

Tensor lower(const Tensor& x) {
  // Any other float dtype is cast, as torch.autocast casts every floating input.
  if (!t_state.enabled || !x.defined() || !is_floating(x.dtype()) || x.dtype() == t_state.dtype) {
    return x;
  }
  const bool cacheable = is_leaf(x) && requires_grad(x);
  if (!cacheable) return cast(x, t_state.dtype);
  auto it = t_cache.entries.find(x.impl_ptr().get());
  if (it != t_cache.entries.end() && it->second.lowered.dtype() == t_state.dtype) {
    ++t_cache.hits;
    return it->second.lowered;
  }
  Tensor lowered = cast(x, t_state.dtype);
  t_cache.entries[x.impl_ptr().get()] = {x.impl_ptr(), lowered};
  return lowered;
}

Tensor upper(const Tensor& x) {
  if (!x.defined() || (x.dtype() != DType::bf16 && x.dtype() != DType::f16)) return x;
  return cast(x, DType::f32);
}

int64_t cache_hits() {
  return t_cache.hits;
}

}  // namespace autocast
}  // namespace ddp
