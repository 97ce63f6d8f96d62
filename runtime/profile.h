// The op profile: where a step's device time goes, op by op, inside the real step.
//
//   profile::start();
//   ... run some steps ...
//   const profile::Report report = profile::stop();  // waits for the devices
//   fmt::print("{}", profile::format_table(report.ops, report.wall_ms, 15));
//
// Note [op profile]
// ~~~~~~~~~~~~~~~~~
// While the profile is on, every op entry point (the device switch of
// ops/dispatch.h, and the library calls that bypass it: the cuBLASLt linear layers,
// cuDNN attention, oneDNN's convolutions, copies, the random fills) records an event
// on its device's current stream before and after the op, and the op's time is the
// elapsed time between the two, as torch.cuda.Event(enable_timing=True) pairs measure
// it. So on a GPU it is the device's time from reaching the op to finishing it, not
// the host's launch time; on the CPU (whose events record the host clock) it is the
// op's wall time. An op is keyed by its name, its device and its tensors' dtypes and
// shapes ("gemm" on cuda:0, "bf16[8192, 768] f32[2304, 768] bf16[8192, 2304]"), and
// the report sums calls and time per key.
// What it measures, and what it does not:
// - Only the outermost op of a thread counts: an op that calls others (a linear layer
//   whose cuBLASLt call falls back to gemm + add_bias_rows) is one entry, so no time
//   counts twice within a thread, and one thread's ops on one stream add up to at most
//   the wall time. Ops of several threads (DataParallel's replicas, DDP's
//   communication thread) or streams overlap, and their sum may exceed it.
// - A GPU op's time includes any wait of the device for the host to launch its
//   kernels, so on a launch-bound step (a small model) the ops' times add up to nearly
//   the wall time; the gaps between ops (the host's own work) are the wall time minus
//   that sum. Collectives (NCCL, shm) are not ops; the copies around them are.
// - Nothing is recorded by a thread that is capturing a CUDA graph (an event there
//   would become a graph node, and a query would break the capture); a replay is one
//   entry, "cuda_graph_replay". An op whose stream joined a capture while it ran is
//   dropped.
// - An op that throws is not counted. A CUDA call of the profile itself that fails (a
//   device already broken by a kernel fault) never throws from an op: the pair is
//   dropped and the report says how many were (Report::dropped, first_error).
// - The cost: off, one relaxed load per op. On, per op: two event records and two
//   cudaStreamIsCapturing calls (a few microseconds of host time on CUDA), a lookup
//   under a process-wide mutex (never held across a CUDA call that can wait for a
//   device), and the shapes formatted as text. Finished pairs are added up every
//   few thousand ops, never waiting for the device; stop() waits for the rest,
//   outside the mutex (a start() meanwhile begins a profile of its own).
// Threads: any thread's ops are recorded, each thread's nesting kept apart.
#pragma once

#include "runtime/device.h"
#include "runtime/tensor.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace ddp::profile {

namespace detail {
extern std::atomic<bool> g_on;
}  // namespace detail

// Whether ops are being recorded.
inline bool enabled() noexcept {
  return detail::g_on.load(std::memory_order_relaxed);
}

struct OpTime {
  std::string op{};      // "gemm", "layer_norm_backward", "linear", ...
  std::string device{};  // "cuda:0", "cpu"
  std::string shapes{};  // its tensors' dtypes and shapes, in argument order
  int64_t calls = 0;
  double total_ms = 0.0;
  double max_ms = 0.0;  // the longest call
};

struct Report {
  std::vector<OpTime> ops;    // one per (op, device, shapes), the longest total first
  double wall_ms = 0.0;       // from start() to the end of stop()'s wait
  int64_t dropped = 0;        // pairs the profile could not record (Note [op profile])
  std::string first_error{};  // why the first of them was dropped
  double ops_ms() const;      // the sum of every op's total
  // The same calls summed over shapes: one entry per (op, device), longest first
  // (shapes empty).
  std::vector<OpTime> by_op() const;
};

// Begins recording (ValueError when already on).
void start();
// Ends recording, waits for the ops still running on the devices and returns what was
// recorded since start() (ValueError when it is not on).
Report stop();

// A table of the `top` longest entries of `ops` (every entry when top is 0): op,
// device, shapes, calls, total ms, mean us, share of `total_ms`; then a line with the
// rest summed.
std::string format_table(const std::vector<OpTime>& ops, double total_ms, size_t top);

namespace detail {
void describe(std::string& out, const Tensor& t);
void describe(std::string& out, const std::vector<Tensor>& ts);
template <typename T>
void describe(std::string&, const T&) {}  // other arguments are not shown
// The bookkeeping behind Scope; neither throws. begin enters an op in this thread and
// returns whether it is recorded (not when nested in another op, or while this thread
// captures a CUDA graph); leave ends it, and drops it when `threw`.
bool begin(const char* op, const Device& device, std::string shapes) noexcept;
void leave(bool recorded, bool threw) noexcept;
// CudaGraph::capture marks its thread for the capture's span (Note [op profile]).
void set_thread_capturing(bool capturing) noexcept;
}  // namespace detail

// Records one op from construction to destruction (when the profile is on). `args` are
// the op's arguments; its tensors' dtypes and shapes form the key. An op that throws
// is not counted.
class Scope {
 public:
  template <typename... Args>
  Scope(const char* op, const Device& device, const Args&... args) {
    if (!enabled()) return;
    std::string shapes;
    try {
      (detail::describe(shapes, args), ...);
    } catch (...) {  // no memory for the text: the op is keyed without it
      shapes.clear();
    }
    exceptions_ = std::uncaught_exceptions();
    entered_ = true;
    recorded_ = detail::begin(op, device, std::move(shapes));
  }
  ~Scope() {
    if (entered_) detail::leave(recorded_, std::uncaught_exceptions() > exceptions_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool entered_ = false;
  bool recorded_ = false;
  int exceptions_ = 0;
};

}  // namespace ddp::profile
