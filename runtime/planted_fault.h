// Planted faults: a testing aid that corrupts one op's output on one device type, so
// that a test of that op can be seen failing without rebuilding the kernel.
//
// Note [planted faults]
// ~~~~~~~~~~~~~~~~~~~~~
// A test must be able to fail (DEVELOPERS.md), and issue 29 asks that every CUDA
// kernel's gpu test be seen failing with a planted fault. Planting one in the kernel
// source needs a rebuild per fault, which a short loan of a GPU machine cannot
// afford. So a fault is planted in the op's output instead, after the kernel ran:
//
//   DDP_TEST_PLANT_FAULT=DEVICE:OP:ARG:MODE
//
// - DEVICE: cpu or cuda, the device type whose calls are corrupted (only that one, so
//   a gpu test that compares a CUDA op with the same op on the CPU sees a difference);
// - OP: the op's name as the op profile lists it (Note [op profile]): a kernel of the
//   device switch (ops/dispatch.h: layer_norm, cast, adamw_update_multi, ...), or
//   linear, linear_param_grads, linear_gelu, linear_input_grad_gelu,
//   causal_self_attention, causal_self_attention_backward (their results);
// - ARG: which tensor, 0-based among the op's tensor arguments in the profile's order
//   (a list of tensors counts as one; the fault then hits the first tensor it can
//   change for `first` (not empty, no infinity or NaN there), the last one for `last`,
//   every one for `scale`); for the ops of the
//   second kind above, among their results (linear:0 is its output);
// - MODE: `first` or `last` (that element, in the tensor's logical order, becomes
//   v + 1 + |v|: a wrong or unwritten element at either end, where vector heads and
//   tails go wrong), or `scale=X` (every element times X: a numerical error of 1 - X).
//
// Every call of OP on DEVICE is corrupted, through host copies on the current stream
// (whose synchronizations cuda_api::host_sync_count does not count); a thread
// capturing a CUDA graph is left alone, and a call where nothing changes (an empty
// tensor, an infinity at the end) does not count. The process prints to stderr
// "ddp: planted fault SPEC applied for the first time" when it first applies and
// "... applied N time(s)" at exit, so that a harness tells a fault its tests caught
// from one they never reached, even after a crash (bench/gpu/planted_faults.sh). Off
// (the variable unset), an op pays one relaxed load. A malformed value is reported on
// stderr as the process starts, which then runs without a fault.
#pragma once

#include "runtime/device.h"
#include "runtime/tensor.h"

#include <atomic>
#include <string>
#include <vector>

namespace ddp::planted_fault {

namespace detail {
extern std::atomic<bool> g_armed;
// Applies the fault when (op, device) match; `tensors` are the op's tensor arguments
// in order (a list as one entry).
void apply(const char* op, const Device& device, const std::vector<std::vector<Tensor>>& tensors);

inline void collect(std::vector<std::vector<Tensor>>& out, const Tensor& t) {
  out.push_back({t});
}
inline void collect(std::vector<std::vector<Tensor>>& out, const std::vector<Tensor>& ts) {
  out.push_back(ts);
}
template <typename T>
void collect(std::vector<std::vector<Tensor>>&, const T&) {}  // not a tensor
}  // namespace detail

// Whether DDP_TEST_PLANT_FAULT (or set()) armed a fault.
inline bool armed() noexcept {
  return detail::g_armed.load(std::memory_order_relaxed);
}

// After op `op` ran on `device` with these arguments: corrupts the one the armed
// fault names, when it names this op and device type.
template <typename... Args>
void after(const char* op, const Device& device, const Args&... args) {
  if (!armed()) return;
  std::vector<std::vector<Tensor>> tensors;
  (detail::collect(tensors, args), ...);
  detail::apply(op, device, tensors);
}

// Arms `spec` (the variable's form) for this process, or disarms with ""; for tests.
// ValueError naming the form when spec is malformed (nothing changes then). Resets the
// count.
void set(const std::string& spec);
// How often the armed fault was applied since it was armed.
int64_t applied();

}  // namespace ddp::planted_fault
