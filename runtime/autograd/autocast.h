// Mixed precision: the autocast region of torch.autocast, as a per-thread guard.
//
// Note [autocast]
// ~~~~~~~~~~~~~~~
// While an AutocastGuard is alive in a thread, the functional ops
// (autograd/functions.h) choose their compute dtype as torch.autocast does for
// bf16 on CUDA:
//   - lower precision (the guard's dtype): matmul, linear (its bias too), bmm
//     and attention. Their other float operands are cast on the way in
//     (parameters once per guard, see below); matmul, linear and attention
//     multiply on tensor cores on CUDA with f32 accumulation (bmm, not on our
//     models' path, widens to f32 for now) and give a bf16 output, the bias
//     added before the one rounding. A parameter's gradient is
//     computed straight into f32 (its own dtype), never rounded to bf16 on the way.
//   - f32: layer_norm's statistics, softmax, log_softmax, cross_entropy and sum
//     read 16-bit inputs as f32 and compute in f32. cross_entropy on bf16
//     logits is one fused kernel (no f32 copy of the logits, no probabilities
//     kept; ops.h softmax_cross_entropy).
//   - layer_norm computes in f32 and stores its output in the guard's dtype:
//     every LayerNorm in our models feeds a matmul, which would cast it to bf16
//     anyway, so the rounding is the one autocast does, one kernel earlier
//     (the gradient flowing back is cast to f32 by the engine).
//   - the rest run in their inputs' dtype (gelu, relu, dropout, reshape); add,
//     sub and mul promote (f32 + bf16 = f32), so a residual stream that starts
//     f32 (the embeddings) stays f32.
//   - conv2d stays f32 for now (the CNN's linear layers run in bf16).
// Gradients reach each input in its own dtype (Note [gradient dtypes] in
// autograd.h). Parameters stay f32, and so do their gradients, DDP's buckets
// and the optimizer state: master weights in f32, as PyTorch AMP keeps them.
//
// Cast cache: a leaf that requires grad (a parameter) is cast at its first
// use inside the outermost guard and the copy reused until that guard ends
// (GPT's tied wte is read in f32 by the embedding and in bf16 by the head:
// one cast). Guards nest; an inner AutocastGuard(enabled=false) turns casting
// off inside (torch.autocast(enabled=False)). A new thread starts outside any
// region; DataParallel hands its workers the caller's state, as grad mode.
#pragma once

#include "runtime/tensor.h"

#include <string>

namespace ddp {

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::bf16;
};

// The calling thread's current state.
AutocastState autocast_state();
bool autocast_enabled();

class AutocastGuard {
 public:
  // dtype: bf16 (f16 would need loss scaling, which ddp does not have: ValueError).
  explicit AutocastGuard(DType dtype = DType::bf16, bool enabled = true);
  explicit AutocastGuard(const AutocastState& state);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

// ValueError unless a GPU of compute capability major.minor multiplies bf16 on tensor
// cores (8.0, Ampere, and later), naming the device, the GPU and its capability.
void check_bf16_gpu(const std::string& device, const std::string& gpu_name, int major, int minor);

namespace autocast {
// For op implementations. x in the region's lower-precision dtype: other float
// tensors are cast (parameters through the cache), integer ones returned as they are.
// Outside a region, x itself.
Tensor lower(const Tensor& x);
// x as f32 when it is bf16 or f16 (any region or none), else x itself.
Tensor upper(const Tensor& x);
// The number of casts the cache saved in this thread since the outermost guard
// began (tests).
int64_t cache_hits();
}  // namespace autocast

}  // namespace ddp
