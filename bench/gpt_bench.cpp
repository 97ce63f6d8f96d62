// bench gpt: one training step of the GPT model (models/gpt.h) on one device, split
// into forward, backward, clipping and optimizer, with the step's GEMM work and the
// process's peak memory (Note [gpt step flops]).
#include "bench/subcommands.h"

#include "models/gpt.h"
#include "runtime/autograd/autocast.h"
#include "runtime/autograd/functions.h"
#include "runtime/cuda_graph.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/cuda/linear_lt.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/profile.h"
#include "runtime/rng/generator.h"
#include "runtime/stream.h"

#include <sys/resource.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <functional>
#include <random>
#include <string>
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

// The integer value of `flag` (default `fallback`), at least `min`.
int64_t parse_count(const BenchOptions& o, const char* flag, const char* fallback, int64_t min) {
  const std::string text = o.flag(flag, fallback);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  DDP_CHECK(ec == std::errc() && ptr == text.data() + text.size() && v >= min,
            "{} expects an integer >= {}, got '{}'", flag, min, text);
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

// Note [gpt step timing]: a step is timed by the host's clock from its start to the
// device's end (one synchronize, as PyTorch's peer waits once, for loss.item());
// its phases by events on the stream between them (on the CPU, events read the host
// clock), so that timing them never drains the device in the middle of the step.
struct Phases {
  double forward = 0, backward = 0, clip = 0, optimizer = 0;
  double wall = 0;  // the whole step
  double total() const { return wall; }
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start, const Device& device) {
  synchronize(device);
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Note [gpt op breakdown]
// ~~~~~~~~~~~~~~~~~~~~~~~
// bench gpt --ops: each kind of op of a GPT training step timed alone, forward and
// backward, at the model's shapes and under the same autocast, then multiplied by
// how often one step runs it. It says where the step's time goes, op by op, on any
// device and without a profiler. Each op's inputs are fresh leaves with the dtypes
// the model feeds it (under bf16: the linear layers' inputs bf16, the residual
// stream f32, the logits bf16); an op's time is the median of its timed runs, the
// device synchronized around each, its inputs' gradients cleared before each run (as
// zero_grad does). The ops do not overlap, so their sum is comparable with the
// forward + backward phases of the step; the rest is what the step does besides
// them (reshapes, the casts of the parameters, the loss's reduction). A row counted 0
// times per step is an alternative timed for comparison, in parentheses: on CUDA under
// bf16, each linear layer with its bias gradient as a column sum instead of the weight
// gradient matmul's epilogue (Note [weight gradient epilogue]), and the MLP with its
// GELU inside the matmuls (Note [gelu epilogues]).
struct OpCost {
  std::string name;
  int64_t per_step;
  double ms;  // one run, forward + backward
};

// Note [op profile] over `steps` steps: the longest (op, shapes) entries, the rest
// summed, the ops' sum and the time outside any op; then the same summed over shapes.
void report_profile(const Reporter& reporter, const profile::Report& r, int64_t steps) {
  constexpr size_t kTop = 25;
  const double n = static_cast<double>(steps), step_ms = r.wall_ms / n;
  const auto rows_of = [&](const std::vector<profile::OpTime>& ops, size_t top) {
    std::vector<Row> rows;
    const auto add = [&](const std::string& op, const std::string& device,
                         const std::string& shapes, double calls, double ms) {
      Row row;
      row.add("op", op)
          .add("device", device)
          .add("shapes", shapes)
          .add("calls_per_step", calls / n, 1)
          .add("ms_per_step", ms / n, 3)
          .add("share_of_step", ms / n / step_ms, 3);
      rows.push_back(std::move(row));
    };
    double rest_ms = 0, rest_calls = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const profile::OpTime& t = ops[i];
      if (top == 0 || i < top) {
        add(t.op, t.device, t.shapes, static_cast<double>(t.calls), t.total_ms);
      } else {
        rest_ms += t.total_ms;
        rest_calls += static_cast<double>(t.calls);
      }
    }
    if (rest_calls > 0) {
      add(fmt::format("(the other {} entries)", ops.size() - top), "", "", rest_calls, rest_ms);
    }
    double calls = 0;
    for (const profile::OpTime& t : ops) calls += static_cast<double>(t.calls);
    add("(every op)", "", "", calls, r.ops_ms());
    add("(outside any op: the host between ops)", "", "", 0, r.wall_ms - r.ops_ms());
    add("(the whole step)", "", "", 0, r.wall_ms);
    return rows;
  };
  reporter.progress(
      fmt::format("bench gpt --profile-steps: {} steps of {:.2f} ms", steps, step_ms));
  reporter.section("gpt step op profile: the longest ops by shape (Note [op profile])",
                   rows_of(r.ops, kTop));
  reporter.section("gpt step op profile: by op (summed over shapes)", rows_of(r.by_op(), 0));
  if (r.dropped > 0) {
    reporter.note(fmt::format("op profile: {} op(s) not recorded, the first because: {}", r.dropped,
                              r.first_error));
  }
}

std::vector<OpCost> op_breakdown(const models::GptConfig& c, int64_t batch, bool bf16,
                                 const Device& device, int repeats) {
  const int64_t b = batch, t = c.context, d = c.d_model, l = c.layers, v = c.vocab;
  const int64_t rows = b * t;
  const DType act = bf16 ? DType::bf16 : DType::f32;  // what the linear layers read
  uint64_t seed = 500;
  // A leaf of `shape` and `dtype` on the device that requires grad.
  const auto leaf = [&](const Shape& shape, DType dtype) {
    Tensor x = randn(shape, ++seed, {.device = device});
    if (dtype != DType::f32) x = cast(x, dtype);
    set_requires_grad(x, true);
    return x;
  };
  const auto time = [&](std::vector<Tensor> leaves, const std::function<Tensor()>& forward) {
    Tensor seed_grad;
    std::vector<double> runs;
    for (int r = 0; r <= repeats; ++r) {  // run 0 warms up (plans, caches, the seed)
      for (Tensor& x : leaves) set_grad(x, Tensor());
      synchronize(device);
      const auto start = Clock::now();
      Tensor out;
      {
        const AutocastGuard mixed_precision(DType::bf16, bf16);
        out = forward();
      }
      if (r == 0 && out.numel() > 1)
        seed_grad = ones(out.shape(), {.dtype = out.dtype(), .device = device});
      backward(out, seed_grad);
      const double ms = ms_since(start, device);
      if (r > 0) runs.push_back(ms);
    }
    std::sort(runs.begin(), runs.end());
    return runs[runs.size() / 2];
  };
  namespace F = functional;
  std::vector<OpCost> out;
  const auto linear = [&](const std::string& name, int64_t count, int64_t in, int64_t out_f,
                          bool bias) {
    const Tensor x = leaf({rows, in}, act), w = leaf({out_f, in}, DType::f32);
    const Tensor bb = bias ? leaf({out_f}, DType::f32) : Tensor();
    std::vector<Tensor> leaves{x, w};
    if (bias) leaves.push_back(bb);
    const std::string shape = fmt::format("[{}, {}] x [{}, {}]^T", rows, in, out_f, in);
    out.push_back({fmt::format("{} {}", name, shape), count,
                   time(leaves, [&] { return F::linear(x, w, bb); })});
    // Note [weight gradient epilogue]: the same op with the bias gradient as a column
    // sum after the weight gradient's matmul, once per step 0 (an alternative, not a
    // part of the step).
    if (bias && device.is_cuda() && bf16 && kernels::cuda::lt_bias_grad_enabled()) {
      kernels::cuda::set_lt_bias_grad_enabled(false);
      const double apart = time(leaves, [&] { return F::linear(x, w, bb); });
      kernels::cuda::set_lt_bias_grad_enabled(true);
      out.push_back(
          {fmt::format("({} {}, bias gradient as a column sum: DDP_LT_BIAS_GRAD=0)", name, shape),
           0, apart});
    }
  };
  linear("linear c_attn", l, d, 3 * d, true);
  linear("linear attn c_proj", l, d, d, true);
  linear("linear c_fc", l, d, 4 * d, true);
  linear("linear mlp c_proj", l, 4 * d, d, true);
  if (c.logits_width() == v) {
    linear("linear head (tied wte)", 1, d, v, false);
  } else {  // Note [padded head]
    const Tensor x = leaf({rows, d}, act), w = leaf({v, d}, DType::f32);
    out.push_back({fmt::format("head (tied wte) [{}, {}] x [{}, {}]^T padded to {} columns", rows,
                               d, v, d, c.logits_width()),
                   1, time({x, w}, [&] { return F::lm_head(x, w, c.logits_width()); })});
  }
  {
    const Tensor qkv = leaf({b, t, 3 * d}, act);
    out.push_back({fmt::format("attention [{}, {}, {}], {} heads", b, t, 3 * d, c.heads), l,
                   time({qkv}, [&] { return F::causal_self_attention(qkv, c.heads); })});
  }
  {
    const Tensor x = leaf({rows, d}, DType::f32), w = leaf({d}, DType::f32),
                 bias = leaf({d}, DType::f32);
    out.push_back({fmt::format("layer_norm [{}, {}]", rows, d), l + 1,
                   time({x, w, bias}, [&] { return F::layer_norm(x, w, bias); })});
    // Each block's first residual add with ln_2 (Note [residual layer norm]); the
    // backward from the norm's output only (the sum's own gradient adds one add).
    const Tensor y = leaf({rows, d}, act);
    out.push_back({fmt::format("residual add + layer_norm [{}, {}]", rows, d), l,
                   time({x, y, w, bias}, [&] { return F::add_layer_norm(x, y, w, bias).out; })});
  }
  {
    const Tensor x = leaf({rows, 4 * d}, act);
    out.push_back(
        {fmt::format("gelu [{}, {}]", rows, 4 * d), l, time({x}, [&] { return F::gelu(x); })});
  }
  // Note [gelu epilogues]: the whole MLP with the GELU inside its matmuls, an
  // alternative to the c_fc, gelu and mlp c_proj rows together.
  if (device.is_cuda() && bf16) {
    const Tensor x = leaf({rows, d}, act);
    const Tensor w1 = leaf({4 * d, d}, DType::f32), b1 = leaf({4 * d}, DType::f32);
    const Tensor w2 = leaf({d, 4 * d}, DType::f32), b2 = leaf({d}, DType::f32);
    const bool was = gelu_epilogues_enabled();
    set_gelu_epilogues_enabled(true);
    const double fused = time({x, w1, b1, w2, b2}, [&] { return F::gelu_mlp(x, w1, b1, w2, b2); });
    set_gelu_epilogues_enabled(was);
    out.push_back({fmt::format("(mlp [{}, {}] -> [{}, {}] with GELU in the matmuls: the c_fc, "
                               "gelu and mlp c_proj rows in one; DDP_LT_GELU=1)",
                               rows, d, rows, 4 * d),
                   0, fused});
  }
  {
    const Tensor x = leaf({b, t, d}, DType::f32), y = leaf({b, t, d}, act);
    out.push_back({fmt::format("residual add [{}, {}, {}]", b, t, d), l,
                   time({x, y}, [&] { return F::add(x, y); })});
  }
  {
    const Tensor logits = leaf({rows, c.logits_width()}, act);
    std::vector<int64_t> labels(static_cast<size_t>(rows));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i * 7919 % v);
    const Tensor targets = from_vector(labels, {rows}).to(device);
    out.push_back({fmt::format("cross_entropy [{}, {}]", rows, c.logits_width()), 1,
                   time({logits}, [&] { return F::cross_entropy(logits, targets); })});
  }
  {
    const Tensor wte = leaf({v, d}, DType::f32);
    std::vector<int64_t> ids(static_cast<size_t>(rows));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 104729 % v);
    const Tensor tokens = from_vector(ids, {b, t}).to(device);
    out.push_back({fmt::format("embedding [{}, {}] of {} tokens", v, d, rows), 1,
                   time({wte}, [&] { return F::embedding(wte, tokens); })});
  }
  return out;
}

}  // namespace

int run_gpt_bench(const BenchOptions& o, const Reporter& reporter) {
  const models::GptConfig config = models::gpt_config(o.flag("--model", "gpt-mini"));
  const int64_t batch = parse_count(o, "--batch-size", "8", 1);
  const int64_t profile_steps = parse_count(o, "--profile-steps", "0", 0);
  const bool bf16 = parse_bf16(o);
  const double peak_tflops = parse_peak_tflops(o);
  const std::string ops_flag = o.flag("--ops", "no");
  DDP_CHECK(ops_flag == "yes" || ops_flag == "no", "--ops expects yes or no, got '{}'", ops_flag);
  const bool ops = ops_flag == "yes";
  const std::string graph_flag = o.flag("--cuda-graph", "no");
  DDP_CHECK(graph_flag == "yes" || graph_flag == "no", "--cuda-graph expects yes or no, got '{}'",
            graph_flag);
  const bool graphed = graph_flag == "yes";
  DDP_CHECK(!graphed || o.device.is_cuda(),
            "--cuda-graph yes captures CUDA work; this run is on {} (pass --device cuda)",
            o.device.str());
  const TimingOptions timing = o.timing(2, 10);
  DDP_CHECK(!graphed || timing.warmup >= 2,
            "--cuda-graph yes captures after the warm-up steps, which make the optimizer's "
            "state and the libraries' plans: --warmup {} must be at least 2",
            timing.warmup);
  Generator gen(1234);
  auto model = models::make_gpt(config, gen);
  model->to(o.device);
  const models::DecayGroups groups = models::decay_groups(*model);
  optim::AdamW optimizer({{groups.decay, 0.1f}, {groups.no_decay, 0.0f}},
                         {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f});
  optimizer.set_capturable(graphed);  // Note [captured optimizer steps]
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
  const auto loss_of = [&] {                                 // the forward and the loss
    const AutocastGuard mixed_precision(DType::bf16, bf16);  // Note [autocast]
    const Tensor logits = (*model)(inputs);
    return functional::cross_entropy(functional::reshape(logits, {-1, config.logits_width()}),
                                     targets);
  };
  CudaGraph graph;
  // Events at the boundaries of a step's phases (Note [gpt step timing]).
  std::array<Event, 5> marks{Event(o.device), Event(o.device), Event(o.device), Event(o.device),
                             Event(o.device)};
  // One training step; `graphed_now`: a replay of the captured step (captured first),
  // timed as a whole (forward_ms).
  const auto run_step = [&](bool graphed_now) {
    if (graphed_now) {  // Note [graphed steps] in trainer/epoch.cpp
      const bool capture = !graph.captured();
      if (capture) {
        // The first replay's host half, before the capture (untimed, with the capture).
        optimizer.prepare_step();
        graph.capture(o.device, [&] {
          optimizer.zero_grad();  // in place
          backward(loss_of());
          optim::clip_grad_norm_on_device(model->parameters(), 1.0, &optimizer);
          optimizer.apply_step();
        });
        synchronize(o.device);
      }
      const auto start = Clock::now();
      if (!capture) optimizer.prepare_step();
      graph.replay();
      const double whole = ms_since(start, o.device);
      return Phases{.forward = whole, .wall = whole};
    }
    auto& m = marks;
    const auto start = Clock::now();
    m[0].record();
    // As train and PyTorch's default: backward hands .grad its fresh tensors (no fill,
    // no accumulation into zeros); before a capture, in place as the captured step
    // zeroes them (as train's eager steps do then: Note [graphed steps]).
    optimizer.zero_grad(/*set_to_none=*/!graphed);
    const Tensor loss = loss_of();
    m[1].record();
    backward(loss);
    m[2].record();
    // As train: on CUDA the norm never comes back to the host (Note [clipping on the
    // device]) and AdamW applies the factor (Note [clipping in the step]): clip_ms is
    // the norm's time.
    if (o.device.is_cuda()) {
      optim::clip_grad_norm_on_device(model->parameters(), 1.0, &optimizer);
    } else {
      optim::clip_grad_norm_(model->parameters(), 1.0);
    }
    m[3].record();
    optimizer.step();
    m[4].record();
    Phases p;
    p.wall = ms_since(start, o.device);  // the step's one synchronize
    p.forward = m[0].elapsed_ms(m[1]);
    p.backward = m[1].elapsed_ms(m[2]);
    p.clip = m[2].elapsed_ms(m[3]);
    p.optimizer = m[3].elapsed_ms(m[4]);
    return p;
  };
  // The caching allocator's calls to the system (cudaMalloc) in the timed steps: 0 once
  // the warm-up steps have filled its cache; more is time a step spends there. (Not the
  // first graphed step's: the capture's graph pool is new memory by design.)
  uint64_t raw_allocs_timed = 0;
  for (int s = 0; s < timing.warmup + timing.repeats; ++s) {
    const uint64_t raw_before = memory_stats(o.device).num_raw_allocs;
    const Phases p = run_step(graphed && s >= timing.warmup);
    if (s >= timing.warmup) {
      steps.push_back(p);
      if (!graphed || s > timing.warmup) {
        raw_allocs_timed += memory_stats(o.device).num_raw_allocs - raw_before;
      }
    }
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
      .add("cuda_graph", graphed ? "yes" : "no")
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
    const MemoryStats memory = memory_stats(o.device);
    row.add("peak_device_mib", static_cast<double>(memory.max_allocated) / (1024.0 * 1024.0), 0)
        .add("peak_reserved_mib", static_cast<double>(memory.max_reserved) / (1024.0 * 1024.0), 0)
        .add("raw_allocs_timed", static_cast<int64_t>(raw_allocs_timed));
  }
  row.add("device", o.device.str());
  reporter.section("gpt training step (median of the timed steps)", {row});
  if (profile_steps > 0) {  // Note [op profile] in runtime/profile.h
    reporter.progress(
        fmt::format("bench gpt --profile-steps: {} more steps, op by op", profile_steps));
    synchronize(o.device);
    profile::start();
    for (int64_t s = 0; s < profile_steps; ++s) run_step(graphed);
    report_profile(reporter, profile::stop(), profile_steps);
  }
  if (ops) {  // Note [gpt op breakdown]
    reporter.progress("bench gpt --ops: each op alone, forward + backward");
    const std::vector<OpCost> ops =
        op_breakdown(config, batch, bf16, o.device, std::max(3, timing.repeats));
    double sum = 0;
    for (const OpCost& op : ops) sum += op.ms * static_cast<double>(op.per_step);
    const double phases = median.forward + median.backward;
    std::vector<Row> rows;
    for (const OpCost& op : ops) {
      const double per_step = op.ms * static_cast<double>(op.per_step);
      Row r;
      r.add("op", op.name)
          .add("per_step", op.per_step)
          .add("ms_each", op.ms, 3)
          .add("ms_per_step", per_step, 2)
          .add("share_of_forward_backward", per_step / phases, 3);
      rows.push_back(std::move(r));
    }
    Row total;
    total.add("op", "sum of the ops")
        .add("per_step", int64_t{0})
        .add("ms_each", 0.0, 3)
        .add("ms_per_step", sum, 2)
        .add("share_of_forward_backward", sum / phases, 3);
    rows.push_back(std::move(total));
    reporter.section(fmt::format("gpt step op by op (each alone, forward + backward; the step's "
                                 "forward + backward took {:.2f} ms)",
                                 phases),
                     rows);
  }
  return 0;
}

}  // namespace ddp::bench
