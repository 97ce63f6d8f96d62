// bench gpt: one training step of the GPT model (models/gpt.h) on one device, split
// into forward, backward, clipping and optimizer, with the step's GEMM work and the
// process's peak memory (Note [gpt step flops]).
#include "bench/subcommands.h"

#include "models/gpt.h"
#include "runtime/autograd/autocast.h"
#include "runtime/autograd/functions.h"
#include "runtime/memory/allocator.h"
#include "runtime/optim/optimizer.h"
#include "runtime/rng/generator.h"
#include "runtime/stream.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <random>
#include <vector>

namespace ddp::bench {
namespace {

// Note [gpt step flops]
// ~~~~~~~~~~~~~~~~~~~~~
// The GEMMs of one forward per token: each block's four projections, 2 (3d^2 + d^2 +
// 4d^2 + 4d^2) = 24 d^2, the attention's two products q k^T and P v over the T
// positions, 2 * 2 * T * d (the full T x T squares, as MFU figures count them; the CPU
// kernels skip most of the masked half, Note [causal blocks]), and the tied head 2 d V. A training
// step is three times that (backward: the input and the weight gradient of every product).
// Everything else (LayerNorm, GELU, softmax, embedding, AdamW) is O(d) per token and not counted.
double step_gemm_flops(const models::GptConfig& c, int64_t batch) {
  const double d = static_cast<double>(c.d_model), t = static_cast<double>(c.context);
  const double per_token =
      static_cast<double>(c.layers) * (24.0 * d * d + 4.0 * t * d) + 2.0 * d * c.vocab;
  return 3.0 * per_token * static_cast<double>(batch) * t;
}

// llm.c's count of a training step's FLOPs per token (its MFU): 6 N for the
// parameters' forward and backward products plus 6 L C T for attention's, N being
// every parameter (the tied embedding once, the position embedding included).
double model_flops_per_token(const models::GptConfig& c, int64_t parameters) {
  return 6.0 * static_cast<double>(parameters) +
         6.0 * static_cast<double>(c.layers * c.d_model * c.context);
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux: KiB
}

int64_t parse_batch(const BenchOptions& o) {
  const std::string text = o.flag("--batch-size", "8");
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  DDP_CHECK(ec == std::errc() && ptr == text.data() + text.size() && v >= 1,
            "--batch-size expects an integer >= 1, got '{}'", text);
  return v;
}

bool parse_bf16(const BenchOptions& o) {
  const std::string p = o.flag("--precision", "fp32");
  DDP_CHECK(p == "fp32" || p == "bf16", "--precision expects fp32 or bf16, got '{}'", p);
  return p == "bf16";
}

double parse_peak_tflops(const BenchOptions& o) {
  const std::string text = o.flag("--peak-tflops", "0");
  double v = -1;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  DDP_CHECK(ec == std::errc() && ptr == text.data() + text.size() && v >= 0,
            "--peak-tflops expects a number >= 0 (the device's dense peak in TFLOP/s, e.g. 989 "
            "for an H100's bf16), got '{}'",
            text);
  return v;
}

struct Phases {
  double forward = 0, backward = 0, clip = 0, optimizer = 0;
  double total() const { return forward + backward + clip + optimizer; }
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start, const Device& device) {
  synchronize(device);
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

int run_gpt_bench(const BenchOptions& o, const Reporter& reporter) {
  const models::GptConfig config = models::gpt_config(o.flag("--model", "gpt-mini"));
  const int64_t batch = parse_batch(o);
  const bool bf16 = parse_bf16(o);
  const double peak_tflops = parse_peak_tflops(o);
  const TimingOptions timing = o.timing(2, 10);
  Generator gen(1234);
  auto model = models::make_gpt(config, gen);
  model->to(o.device);
  const models::DecayGroups groups = models::decay_groups(*model);
  optim::AdamW optimizer({{groups.decay, 0.1f}, {groups.no_decay, 0.0f}},
                         {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f});
  // Fixed pseudo-random tokens: a step's work does not depend on their values.
  std::mt19937_64 rng(99);
  std::vector<int64_t> ids(static_cast<size_t>(batch * config.context));
  for (int64_t& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint64_t>(config.vocab));
  const Tensor inputs = from_vector(ids, {batch, config.context}).to(o.device);
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());
  const Tensor targets = from_vector(ids, {batch * config.context}).to(o.device);
  reporter.progress(
      fmt::format("bench gpt: {} ({} parameters), batch {} x {} tokens, {}, {} + {} steps",
                  models::describe(config), model->num_parameters(), batch, config.context,
                  bf16 ? "bf16 autocast" : "fp32", timing.warmup, timing.repeats));
  if (o.device.is_cuda()) reset_peak_memory_stats(o.device);
  std::vector<Phases> steps;
  for (int s = 0; s < timing.warmup + timing.repeats; ++s) {
    Phases p;
    auto start = Clock::now();
    optimizer.zero_grad();
    Tensor loss;
    {
      const AutocastGuard mixed_precision(DType::bf16, bf16);  // Note [autocast]
      const Tensor logits = (*model)(inputs);
      loss = functional::cross_entropy(functional::reshape(logits, {-1, config.vocab}), targets);
    }
    p.forward = ms_since(start, o.device);
    start = Clock::now();
    backward(loss);
    p.backward = ms_since(start, o.device);
    start = Clock::now();
    // As train: on CUDA the norm never comes back to the host (Note [clipping on the
    // device]).
    if (o.device.is_cuda()) {
      optim::clip_grad_norm_on_device(model->parameters(), 1.0);
    } else {
      optim::clip_grad_norm_(model->parameters(), 1.0);
    }
    p.clip = ms_since(start, o.device);
    start = Clock::now();
    optimizer.step();
    p.optimizer = ms_since(start, o.device);
    if (s >= timing.warmup) steps.push_back(p);
  }
  std::sort(steps.begin(), steps.end(),
            [](const Phases& a, const Phases& b) { return a.total() < b.total(); });
  const Phases& median = steps[steps.size() / 2];
  const double flops = step_gemm_flops(config, batch);
  const double tokens_per_s = static_cast<double>(batch * config.context) / median.total() * 1e3;
  const double model_tflops =
      model_flops_per_token(config, model->num_parameters()) * tokens_per_s / 1e12;
  Row row;
  row.add("model", models::describe(config))
      .add("parameters", model->num_parameters())
      .add("batch", batch)
      .add("precision", bf16 ? "bf16" : "fp32")
      .add("tokens_per_s", tokens_per_s, 0)
      .add("step_ms", median.total(), 1)
      .add("forward_ms", median.forward, 1)
      .add("backward_ms", median.backward, 1)
      .add("clip_ms", median.clip, 1)
      .add("optimizer_ms", median.optimizer, 1)
      .add("gemm_gflop", flops / 1e9, 2)
      .add("gflops", flops / (median.total() * 1e6), 1)
      .add("model_tflops", model_tflops, 1);
  if (peak_tflops > 0) row.add("mfu", model_tflops / peak_tflops, 4);
  row.add("peak_rss_mib", peak_rss_mib(), 0);
  if (o.device.is_cuda()) {
    row.add("peak_device_mib",
            static_cast<double>(max_memory_allocated(o.device)) / (1024.0 * 1024.0), 0);
  }
  row.add("device", o.device.str());
  reporter.section("gpt training step (median of the timed steps)", {row});
  return 0;
}

}  // namespace ddp::bench
