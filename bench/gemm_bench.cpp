// bench gemm: GFLOP/s of ddp::matmul_out next to the bare vendor GEMM
// (cblas_sgemm on the CPU, cublasSgemm on a GPU) on the same buffers, for the
// MLP's, CNN's and GPT's shapes and one large square GEMM; on a GPU also bf16 via
// ddp::matmul.
#include "bench/gemm_cublas.h"
#include "bench/subcommands.h"

#include "runtime/ops/nn_ops.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

#include <cblas.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace ddp::bench {
namespace {

constexpr double kAgreeTolerance = 1e-4;  // ours vs bare, same precision
constexpr double kBf16Tolerance = 1e-2;   // bf16 output vs float64 of the same bf16 inputs
constexpr double kOverheadTargetPct = 5.0;
constexpr int64_t kSampledEntries = 4096;  // entries checked against float64
// Default timing: the 2048^3 GEMM takes ~0.1 s on 2 cores, so 25 repeats of ours
// and bare stay near 6 s; the small shapes batch calls into 5 ms samples.
constexpr int kGemmRepeats = 25;
constexpr double kGemmMinSampleMs = 5.0;

struct GemmCase {
  const char* name;
  GemmDims dims;
};

// The MLP (784 -> 256 -> 10, batch 64), the CNN's classifier (3136 -> 128, batch
// 64), gpt-mini's projections (batch 8 x 128 tokens, d 256) and one large square
// GEMM: the shape classes of Note [gemm choice] on both sides of its rule.
const GemmCase kCases[] = {
    {"forward", {.m = 64, .n = 256, .k = 784}},
    {"weight_grad",
     {.m = 256, .n = 784, .k = 64, .trans_a = true}},  // grad^T [256,64] x input [64,784]
    {"output", {.m = 64, .n = 10, .k = 256}},
    {"cnn_fc_forward", {.m = 64, .n = 128, .k = 3136, .trans_b = true}},
    {"cnn_fc_input_grad", {.m = 64, .n = 3136, .k = 128}},
    {"gpt_qkv", {.m = 1024, .n = 768, .k = 256, .trans_b = true}},
    {"gpt_mlp_weight_grad", {.m = 1024, .n = 256, .k = 1024, .trans_a = true}},
    {"square", {.m = 2048, .n = 2048, .k = 2048}},
};

using BareGemm = std::function<void(const GemmDims&, const float*, const float*, float*)>;

double gflops(const GemmDims& d, double ms) {
  return ms > 0.0 ? 2.0 * static_cast<double>(d.m * d.n * d.k) / (ms * 1e6) : 0.0;
}

std::string shape_text(const GemmDims& d) {
  return fmt::format("{}{} x {}{}", shape_str(d.trans_a ? Shape{d.k, d.m} : Shape{d.m, d.k}),
                     d.trans_a ? "^T" : "",
                     shape_str(d.trans_b ? Shape{d.n, d.k} : Shape{d.k, d.n}),
                     d.trans_b ? "^T" : "");
}

struct Operands {
  Tensor a;  // stored [k, m] when trans_a
  Tensor b;  // stored [n, k] when trans_b
};

Operands make_operands(const GemmDims& d, uint64_t seed, const Device& device) {
  const Shape a_shape = d.trans_a ? Shape{d.k, d.m} : Shape{d.m, d.k};
  const Shape b_shape = d.trans_b ? Shape{d.n, d.k} : Shape{d.k, d.n};
  return {rand(a_shape, seed, {.device = device}), rand(b_shape, seed + 1, {.device = device})};
}

std::vector<float> host_floats(const Tensor& t) {
  const Tensor f32 = t.dtype() == DType::f32 ? t : t.to(DType::f32);
  return f32.cpu().to_vector<float>();
}

double max_rel_diff(const std::vector<float>& x, const std::vector<float>& ref) {
  DDP_ASSERT(x.size() == ref.size(), "comparing {} with {} elements", x.size(), ref.size());
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double denom = std::max(std::abs(static_cast<double>(ref[i])), 1e-30);
    worst = std::max(worst, std::abs(static_cast<double>(x[i]) - ref[i]) / denom);
  }
  return worst;
}

// Max relative error of `out` against a float64 reference on kSampledEntries
// entries spread over the output (all of them for small outputs).
double error_vs_f64(const GemmDims& d, const std::vector<float>& a, const std::vector<float>& b,
                    const std::vector<float>& out) {
  const int64_t total = d.m * d.n;
  const int64_t count = std::min(total, kSampledEntries);
  double worst = 0.0;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t idx = count == total ? s : (s * 7919 + 13) % total;  // 7919: prime, spreads
    const int64_t i = idx / d.n;
    const int64_t j = idx % d.n;
    double ref = 0.0;
    for (int64_t p = 0; p < d.k; ++p) {
      const double av = d.trans_a ? a[p * d.m + i] : a[i * d.k + p];
      const double bv = d.trans_b ? b[j * d.k + p] : b[p * d.n + j];
      ref += av * bv;
    }
    worst = std::max(worst, std::abs(out[idx] - ref) / std::max(std::abs(ref), 1e-30));
  }
  return worst;
}

void bare_cblas(const GemmDims& d, const float* a, const float* b, float* out) {
  cblas_sgemm(CblasRowMajor, d.trans_a ? CblasTrans : CblasNoTrans,
              d.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(d.m),
              static_cast<blasint>(d.n), static_cast<blasint>(d.k), 1.0f, a,
              static_cast<blasint>(d.trans_a ? d.m : d.k), b,
              static_cast<blasint>(d.trans_b ? d.k : d.n), 0.0f, out, static_cast<blasint>(d.n));
}

struct CaseResult {
  Row row;
  bool ok = true;
  double overhead_pct = 0.0;
};

// f32: ddp::matmul_out next to the bare call, checked to agree before timing.
CaseResult run_f32_case(const GemmCase& c, uint64_t seed, const BenchOptions& options,
                        const std::string& bare_name, const BareGemm& bare) {
  const GemmDims& d = c.dims;
  const Device& device = options.device;
  const Operands in = make_operands(d, seed, device);
  Tensor out_ours = empty({d.m, d.n}, {.device = device});
  Tensor out_bare = empty({d.m, d.n}, {.device = device});
  const MatmulOptions mm{.trans_a = d.trans_a, .trans_b = d.trans_b};
  const float* pa = in.a.data<float>();
  const float* pb = in.b.data<float>();
  float* pc = out_bare.data<float>();
  const std::function<void()> ours = [&] { matmul_out(in.a, in.b, out_ours, mm); };
  const std::function<void()> bare_call = [&] { bare(d, pa, pb, pc); };

  ours();
  bare_call();
  synchronize(device);
  const std::vector<float> ours_host = host_floats(out_ours);
  const double diff = max_rel_diff(ours_host, host_floats(out_bare));
  CaseResult result;
  if (!(diff < kAgreeTolerance)) {
    std::cerr << fmt::format(
        "bench gemm: error: {} {} on {}: ddp::matmul_out and {} disagree, max relative error "
        "{:.3e} (tolerance {:.0e}). ddp's GEMM dispatch is wrong for this shape or transpose.\n",
        c.name, shape_text(d), device.str(), bare_name, diff, kAgreeTolerance);
    result.ok = false;
    return result;
  }
  const double err64 = error_vs_f64(d, host_floats(in.a), host_floats(in.b), ours_host);

  const auto t = time_interleaved(device, options.timing(2, kGemmRepeats, kGemmMinSampleMs),
                                  {ours, bare_call});
  result.overhead_pct = (t[0].median_ms / t[1].median_ms - 1.0) * 100.0;
  result.row.add("gemm", c.name)
      .add("shape", shape_text(d))
      .add("dtype", "f32")
      .add("ours_ms", t[0].median_ms, 4)
      .add("ours_gflops", gflops(d, t[0].median_ms), 1)
      .add("ours_lib", !device.is_cpu()             ? "cublas"
                       : onednn_gemm(d.m, d.n, d.k) ? "onednn"
                                                    : "openblas")
      .add("bare", bare_name)
      .add("bare_ms", t[1].median_ms, 4)
      .add("bare_gflops", gflops(d, t[1].median_ms), 1)
      .add("overhead_pct", result.overhead_pct, 1)
      .add("diff_vs_bare", Number{diff, 1, true})
      .add("err_vs_f64", Number{err64, 1, true})
      .add("repeats", t[0].repeats)
      .add("calls_per_repeat", t[0].calls_per_sample);
  return result;
}

// bf16 through ddp::matmul (a fresh output each call, as training does).
CaseResult run_bf16_case(const GemmCase& c, uint64_t seed, const BenchOptions& options) {
  const GemmDims& d = c.dims;
  const Operands in = make_operands(d, seed, options.device);
  const Tensor a = in.a.to(DType::bf16);
  const Tensor b = in.b.to(DType::bf16);
  const MatmulOptions mm{.trans_a = d.trans_a, .trans_b = d.trans_b};
  const std::function<void()> ours = [&] {
    Tensor out = matmul(a, b, mm);
    do_not_optimize(&out);
  };
  const Tensor first = matmul(a, b, mm);
  const double err64 = error_vs_f64(d, host_floats(a), host_floats(b), host_floats(first));
  CaseResult result;
  if (!(err64 < kBf16Tolerance)) {
    std::cerr << fmt::format(
        "bench gemm: error: bf16 {} {} on {}: max relative error {:.3e} against float64 of the "
        "same bf16 inputs (tolerance {:.0e}).\n",
        c.name, shape_text(d), options.device.str(), err64, kBf16Tolerance);
    result.ok = false;
    return result;
  }
  const Timing t = time_op(options.device, options.timing(2, kGemmRepeats, kGemmMinSampleMs), ours);
  result.row.add("gemm", c.name)
      .add("shape", shape_text(d))
      .add("dtype", "bf16")
      .add("ours_ms", t.median_ms, 4)
      .add("ours_gflops", gflops(d, t.median_ms), 1)
      .add("err_vs_f64", Number{err64, 1, true})
      .add("repeats", t.repeats)
      .add("calls_per_repeat", t.calls_per_sample);
  return result;
}

Row setup_row(const BenchOptions& options, const std::string& bare_name) {
  Row row;
  row.add("device", options.device.str()).add("name", device_properties(options.device).name);
  row.add("bare", bare_name);
  if (options.device.is_cpu()) row.add("openblas_threads", openblas_get_num_threads());
  return row;
}

}  // namespace

int run_gemm_bench(const BenchOptions& options, const Reporter& reporter) {
  const bool gpu = options.device.is_cuda();
  const std::string bare_name = gpu ? "cublasSgemm" : "cblas_sgemm";
  std::unique_ptr<BareCublas> cublas;
  BareGemm bare = bare_cblas;
  if (gpu) {
    cublas = std::make_unique<BareCublas>(options.device);
    bare = [&cublas](const GemmDims& d, const float* a, const float* b, float* out) {
      cublas->sgemm(d, a, b, out);
    };
  }
  reporter.section("setup", {setup_row(options, bare_name)});

  std::vector<Row> rows;
  std::vector<std::string> over_target;
  uint64_t seed = 1000;
  for (const GemmCase& c : kCases) {
    reporter.progress(fmt::format("f32 {} {}", c.name, shape_text(c.dims)));
    CaseResult r = run_f32_case(c, seed, options, bare_name, bare);
    if (!r.ok) return 1;
    if (r.overhead_pct >= kOverheadTargetPct) over_target.push_back(c.name);
    rows.push_back(std::move(r.row));
    seed += 2;
  }
  if (gpu) {
    for (const GemmCase& c : kCases) {
      reporter.progress(fmt::format("bf16 {} {}", c.name, shape_text(c.dims)));
      CaseResult r = run_bf16_case(c, seed, options);
      if (!r.ok) return 1;
      rows.push_back(std::move(r.row));
      seed += 2;
    }
  }
  reporter.section("gflops", rows);
  if (over_target.empty()) {
    reporter.note(fmt::format("overhead vs {} below the {}% target for every shape", bare_name,
                              kOverheadTargetPct));
  } else {
    std::string names;
    for (const auto& n : over_target) names += (names.empty() ? "" : ", ") + n;
    reporter.note(fmt::format("overhead vs {} at or above the {}% target for: {}", bare_name,
                              kOverheadTargetPct, names));
  }
  return 0;
}

}  // namespace ddp::bench
