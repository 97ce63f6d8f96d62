// bench device: how fast data is made, moved and allocated on a device.
//
// On a CUDA device: rand made on the host and copied vs made on the device;
// host<->device bandwidth with pageable and pinned host memory; the caching
// allocator vs raw cudaMalloc/cudaFree. On the CPU: rand, memcpy bandwidth as
// the physical reference next to ddp::copy_, and ddp::empty vs aligned_alloc.
// On both: the memory-bound kernels of a bf16 training step (Note [vectorized
// elementwise]) in bytes moved per second, against a copy on the same device.
#include "bench/subcommands.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/tensor.h"

#include "runtime/fmt.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp::bench {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kRandRows = 10000;
constexpr int64_t kRandCols = 10000;
constexpr uint64_t kRandSeed = 7;
constexpr int64_t kCopyBytes[] = {1 * kMiB, 16 * kMiB, 256 * kMiB};
constexpr int64_t kAllocBytes[] = {1 * kMiB, 64 * kMiB};
// Copies and allocations: cheap, so many repeats, each batching calls up to 5 ms.
constexpr int kRepeats = 20;
constexpr double kMinSampleMs = 5.0;

int64_t f32_count(int64_t bytes) {
  return bytes / static_cast<int64_t>(element_size(DType::f32));
}

Row& add_ms(Row& row, const Timing& t) {
  return row.add("ms_median", t.median_ms, 3).add("ms_min", t.min_ms, 3).add("ms_p90", t.p90_ms, 3);
}

Row& add_us(Row& row, const Timing& t) {
  return row.add("us_median", t.median_ms * 1e3, 2)
      .add("us_min", t.min_ms * 1e3, 2)
      .add("us_p90", t.p90_ms * 1e3, 2);
}

Row size_row(int64_t bytes) {
  Row row;
  row.add("size", format_bytes(static_cast<uint64_t>(bytes))).add("bytes", bytes);
  return row;
}

Row setup_row(const Device& device) {
  const DeviceProperties props = device_properties(device);
  Row row;
  row.add("device", device.str()).add("name", props.name);
  if (device.is_cuda()) {
    row.add("compute_capability",
            fmt::format("{}.{}", props.compute_capability_major, props.compute_capability_minor))
        .add("memory", format_bytes(props.total_memory))
        .add("sms", props.multiprocessors);
  } else {
    row.add("cores", props.multiprocessors);
  }
  return row;
}

// rand of a 10000x10000 f32 tensor; on a GPU made on the host and copied vs made there.
void bench_rand(const BenchOptions& options, const Reporter& reporter) {
  const Device device = options.device;
  const Shape shape{kRandRows, kRandCols};
  const double bytes = static_cast<double>(kRandRows * kRandCols) * element_size(DType::f32);
  auto rand_on = [&](const Device& where) {
    return [&shape, where] {
      Tensor t = rand(shape, kRandSeed, {.device = where});
      do_not_optimize(t.data_ptr());
    };
  };
  std::vector<Row> rows;
  auto add_row = [&](const std::string& method, const Timing& t) -> Row& {
    Row row;
    row.add("method", method);
    add_ms(row, t)
        .add("gb_per_s_written", gb_per_s(bytes, t.median_ms), 2)
        .add("repeats", t.repeats);
    rows.push_back(std::move(row));
    return rows.back();
  };
  if (device.is_cpu()) {
    reporter.progress(fmt::format("rand {} f32 on cpu", shape_str(shape)));
    add_row("rand on cpu", time_op(device, options.timing(1, 3), rand_on(device)));
  } else {
    reporter.progress(
        fmt::format("rand {} f32 on cpu, then .to({})", shape_str(shape), device.str()));
    const Timing via_host = time_op(device, options.timing(1, 3), [&] {
      Tensor t = rand(shape, kRandSeed).to(device);
      do_not_optimize(t.data_ptr());
    });
    add_row(fmt::format("rand on cpu + .to({})", device.str()), via_host);
    reporter.progress(fmt::format("rand {} f32 on {}", shape_str(shape), device.str()));
    const Timing direct = time_op(device, options.timing(2, 10), rand_on(device));
    add_row(fmt::format("rand on {}", device.str()), direct)
        .add("speedup", via_host.median_ms / direct.median_ms, 1);
  }
  reporter.section("rand", rows);
}

// Host<->device copies through ddp::copy_, pageable and pinned host memory.
void bench_transfers_gpu(const BenchOptions& options, const Reporter& reporter) {
  const Device device = options.device;
  std::vector<Row> rows;
  for (const int64_t bytes : kCopyBytes) {
    reporter.progress(fmt::format("copies of {}", format_bytes(static_cast<uint64_t>(bytes))));
    Tensor on_device = empty({f32_count(bytes)}, {.device = device});
    fill_(on_device, 1.0);
    Timing t[2][2];  // [pinned][0: host to device, 1: device to host]
    for (const bool pinned : {false, true}) {
      Tensor host = empty({f32_count(bytes)}, {.pinned = pinned});
      fill_(host, 2.0);  // touches every page before timing
      const std::function<void()> h2d = [&] { copy_(on_device, host, pinned); };
      const std::function<void()> d2h = [&] { copy_(host, on_device, pinned); };
      const auto times =
          time_interleaved(device, options.timing(2, kRepeats, kMinSampleMs), {h2d, d2h});
      t[pinned][0] = times[0];
      t[pinned][1] = times[1];
    }
    for (const int dir : {0, 1}) {
      for (const bool pinned : {false, true}) {
        const Timing& timing = t[pinned][dir];
        Row row = size_row(bytes);
        row.add("direction", dir == 0 ? "host to device" : "device to host")
            .add("host_memory", pinned ? "pinned" : "pageable")
            .add("gb_per_s", gb_per_s(static_cast<double>(bytes), timing.median_ms), 2);
        add_ms(row, timing);
        if (pinned) row.add("vs_pageable", t[0][dir].median_ms / timing.median_ms, 2);
        rows.push_back(std::move(row));
      }
    }
  }
  reporter.section("host-device bandwidth", rows);
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<std::byte, FreeDeleter>;

HostBuffer aligned_buffer(int64_t bytes, int fill) {
  HostBuffer buffer(static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
  DDP_CHECK_T(OutOfMemoryError, buffer != nullptr, "aligned_alloc of {} failed",
              format_bytes(static_cast<uint64_t>(bytes)));
  std::memset(buffer.get(), fill, static_cast<size_t>(bytes));  // touches every page
  return buffer;
}

// memcpy as the physical reference for host copies, next to ddp::copy_.
void bench_memcpy_cpu(const BenchOptions& options, const Reporter& reporter) {
  std::vector<Row> rows;
  for (const int64_t bytes : kCopyBytes) {
    reporter.progress(fmt::format("host copies of {}", format_bytes(static_cast<uint64_t>(bytes))));
    HostBuffer src = aligned_buffer(bytes, 1);
    HostBuffer dst = aligned_buffer(bytes, 0);
    Tensor t_src = full({f32_count(bytes)}, 1.0);
    Tensor t_dst = zeros({f32_count(bytes)});
    const std::function<void()> mem = [&] {
      std::memcpy(dst.get(), src.get(), static_cast<size_t>(bytes));
      do_not_optimize(dst.get());
    };
    const std::function<void()> ours = [&] { copy_(t_dst, t_src); };
    const auto t =
        time_interleaved(options.device, options.timing(2, kRepeats, kMinSampleMs), {mem, ours});
    const char* names[] = {"std::memcpy", "ddp::copy_"};
    for (size_t i = 0; i < t.size(); ++i) {
      Row row = size_row(bytes);
      row.add("method", names[i])
          .add("gb_per_s", gb_per_s(static_cast<double>(bytes), t[i].median_ms), 2);
      add_ms(row, t[i]);
      if (i == 1) row.add("vs_memcpy", t[0].median_ms / t[1].median_ms, 2);
      rows.push_back(std::move(row));
    }
  }
  reporter.section("host copy bandwidth (bytes copied per second)", rows);
}

// ddp::empty (the device's allocator) vs the raw system allocator, per allocate+free pair.
void bench_alloc(const BenchOptions& options, const Reporter& reporter) {
  const Device device = options.device;
  const bool gpu = device.is_cuda();
  const std::string raw_name = gpu ? "cudaMalloc+cudaFree" : "std::aligned_alloc+free";
  std::vector<Row> rows;
  for (const int64_t bytes : kAllocBytes) {
    const std::string size = format_bytes(static_cast<uint64_t>(bytes));
    reporter.progress(fmt::format("allocations of {}", size));
    const int64_t count = f32_count(bytes);
    { Tensor warm = empty({count}, {.device = device}); }  // a cached block to reuse on a GPU
    const std::function<void()> ours = [&] {
      Tensor t = empty({count}, {.device = device});
      do_not_optimize(t.data_ptr());
    };
    const std::function<void()> raw = [&] {
      void* p = gpu ? cuda_api::malloc_device(device.index, static_cast<size_t>(bytes))
                    : std::aligned_alloc(64, static_cast<size_t>(bytes));
      DDP_CHECK_T(OutOfMemoryError, p != nullptr, "{} of {} failed", raw_name, size);
      do_not_optimize(p);
      gpu ? cuda_api::free_device(device.index, p) : std::free(p);
    };
    // Allocation is host work: time it with the host clock.
    const auto t =
        time_interleaved(Device::cpu(), options.timing(2, kRepeats, kMinSampleMs), {ours, raw});
    const std::string names[] = {gpu ? "ddp::empty (caching allocator)" : "ddp::empty", raw_name};
    for (size_t i = 0; i < t.size(); ++i) {
      Row row = size_row(bytes);
      row.add("method", names[i]);
      add_us(row, t[i]);
      if (i == 0) row.add("speedup_vs_raw", t[1].median_ms / t[0].median_ms, 2);
      rows.push_back(std::move(row));
    }
  }
  reporter.section("allocate+free pair", rows);
}

// Note [kernel bandwidth]: the memory-bound kernels of a bf16 GPT step, each moving
// the fewest bytes it can (every input read once, every output written once: the
// bytes column), over a copy between two buffers of the same device: the ceiling a
// memory-bound kernel's bytes per second can approach. On a GPU every case reads and
// writes more than 4 times an H100's or H200's L2 cache (50-60 MB; at least 268 MB),
// so little of it runs from there: the elementwise ops over 64M elements (GPT-2's MLP activations
// at batch 16 are 50M), LayerNorm over [65536, 768] rows (GPT-2's width), the cross-entropy over
// [8192, 50257] bf16 logits (GPT-2's vocabulary); a sixteenth of each on the CPU.
// Each sample runs the kernel back to back for at least 5 ms, so the host's work
// before a launch overlaps the device's (as in a training step) instead of counting
// as kernel time.
void bench_kernel_bandwidth(const BenchOptions& options, const Reporter& reporter) {
  const Device device = options.device;
  const int64_t scale = device.is_cuda() ? 1 : 16;
  const int64_t n = (int64_t{64} << 20) / scale;  // the elementwise ops' elements
  const int64_t rows = 65536 / scale, d = 768;
  const int64_t logit_rows = 8192 / scale, vocab = 50257;
  const TimingOptions timing = options.timing(2, device.is_cuda() ? 20 : 5, kMinSampleMs);
  reporter.progress(
      fmt::format("kernel bandwidth on {}: {} elements, rows [{}, {}], logits [{}, {}]",
                  device.str(), n, rows, d, logit_rows, vocab));
  const auto make = [&](const Shape& shape, DType dtype, uint64_t seed) {
    return cast(randn(shape, seed, {.device = device}), dtype);
  };
  const Tensor x32 = make({n}, DType::f32, 1), y16 = make({n}, DType::bf16, 2);
  const Tensor g16 = make({n}, DType::bf16, 3);
  Tensor copy_dst = empty({n}, {.device = device}), acc = make({n}, DType::f32, 4);
  const Tensor stream32 = make({rows, d}, DType::f32, 5),
               branch16 = make({rows, d}, DType::bf16, 6);
  const Tensor w = make({d}, DType::f32, 7), b = make({d}, DType::f32, 8);
  const Tensor logits = make({logit_rows, vocab}, DType::bf16, 9);
  std::vector<int64_t> label_ids(static_cast<size_t>(logit_rows));
  for (size_t i = 0; i < label_ids.size(); ++i)
    label_ids[i] = static_cast<int64_t>(i * 7919 % vocab);
  const Tensor labels = from_vector(label_ids, {logit_rows}).to(device);
  const CrossEntropyResult xent = softmax_cross_entropy(logits, labels);
  const Tensor one = full({}, 1.0f, {.device = device});
  const double f4 = 4, f2 = 2, nd = static_cast<double>(n), rd = static_cast<double>(rows * d);
  const double ld = static_cast<double>(logit_rows * vocab);
  struct Case {
    std::string op;
    double bytes;
    std::function<void()> fn;
  };
  const std::vector<Case> cases = {
      {"copy f32 (the ceiling)", 2 * f4 * nd, [&] { copy_(copy_dst, x32); }},
      {"fill f32", f4 * nd, [&] { fill_(copy_dst, 0.0); }},
      {"cast f32 -> bf16", (f4 + f2) * nd,
       [&] { do_not_optimize(cast(x32, DType::bf16).data_ptr()); }},
      {"add f32 + bf16 -> f32 (the residual add's)", (f4 + f2 + f4) * nd,
       [&] { do_not_optimize(add(x32, y16).data_ptr()); }},
      {"axpy f32 (in place)", 3 * f4 * nd, [&] { axpy_(0.5f, x32, acc); }},
      {"gelu bf16", 2 * f2 * nd, [&] { do_not_optimize(gelu(y16).data_ptr()); }},
      {"gelu_backward bf16", 3 * f2 * nd,
       [&] { do_not_optimize(gelu_backward(g16, y16).data_ptr()); }},
      {"layer_norm f32 -> bf16", (f4 + f2) * rd,
       [&] { do_not_optimize(layer_norm(stream32, w, b, 1e-5f, DType::bf16).out.data_ptr()); }},
      {"residual add + layer_norm", (f4 + f2 + f4 + f2) * rd,
       [&] {
         do_not_optimize(
             add_layer_norm(stream32, branch16, w, b, 1e-5f, DType::bf16).sum.data_ptr());
       }},
      {"cross-entropy forward bf16 logits", f2 * ld,
       [&] { do_not_optimize(softmax_cross_entropy(logits, labels).loss.data_ptr()); }},
      {"cross-entropy backward bf16 logits", 2 * f2 * ld, [&] {
         do_not_optimize(
             softmax_cross_entropy_backward_from_logits(logits, xent.lse, labels, one).data_ptr());
       }}};
  std::vector<Row> out;
  double ceiling = 0;
  for (const Case& c : cases) {
    reporter.progress(fmt::format("kernel bandwidth: {}", c.op));
    const Timing t = time_op(device, timing, c.fn);
    const double rate = gb_per_s(c.bytes, t.median_ms);
    if (ceiling == 0) ceiling = rate;
    Row row;
    row.add("op", c.op).add("bytes", static_cast<int64_t>(c.bytes));
    add_ms(row, t).add("gb_per_s", rate, 1).add("vs_copy", ceiling > 0 ? rate / ceiling : 0.0, 2);
    out.push_back(std::move(row));
  }
  reporter.section("kernel bandwidth (bytes read + written per second; Note [kernel bandwidth])",
                   out);
}

}  // namespace

int run_device_bench(const BenchOptions& options, const Reporter& reporter) {
  if (options.device.is_cpu()) {
    if (device_count(DeviceType::cuda) == 0) {
      reporter.note(fmt::format("no CUDA device: {}; running the CPU part",
                                unavailable_reason(DeviceType::cuda)));
    } else {
      reporter.note("--device cpu: running the CPU part");
    }
  }
  reporter.section("setup", {setup_row(options.device)});
  bench_rand(options, reporter);
  if (options.device.is_cuda()) {
    bench_transfers_gpu(options, reporter);
  } else {
    bench_memcpy_cpu(options, reporter);
  }
  bench_alloc(options, reporter);
  bench_kernel_bandwidth(options, reporter);
  return 0;
}

}  // namespace ddp::bench
