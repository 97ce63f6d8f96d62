// gpt_parity: the C++ side of the golden parity test of the GPT model against PyTorch
// (tests/e2e/gpt_parity_test.sh, models/torch_gpt.py parity). Writes into --out:
//
//   init.safetensors    the model's initial weights (GPT-2 names; make_gpt from --seed)
//   batch.safetensors   "inputs", "targets" i64 [4, ctx]: windows of the Brown corpus's
//                       train split, evenly spaced; the generated stream of
//                       runtime/data/text_corpus.h when the corpus is not installed
//                       (metadata "corpus" says which)
//   step0.safetensors   "logits" [4, ctx, vocab], "loss" [1] and "grad.<name>" for every
//                       parameter, from one forward and backward of the initial model
//   steps.tsv           step, lr, loss (before the update), gradient norm (before
//                       clipping) of kSteps AdamW steps on the same batch (Note [parity steps])
//   final.safetensors   the weights after those steps
//
// With --curve STEPS (the loss-curve benchmark, bench/gpt_loss_curve.sh) it writes
// init.safetensors, curve_batches.safetensors ("inputs", "targets" i64 [STEPS, B, ctx]:
// step s takes the next B windows of epoch 0 of a TextWindowSampler over the train split,
// seed --seed, one rank) and curve.tsv (step, lr, loss, gradient norm) of STEPS AdamW
// steps with the recipe of Note [parity steps], the warmup being STEPS / 10 and the
// cosine spanning STEPS; torch_gpt.py curve replays them.
//
// With --load FILE (a torch_gpt.py `init` file) it instead loads FILE strictly into the
// model and writes load_logits.safetensors ("logits" on the same batch): the check that
// our safetensors reader and load_state_dict read what PyTorch wrote.
//
// Note [parity steps]
// ~~~~~~~~~~~~~~~~~~~
// nanoGPT's optimisation, shortened: AdamW with betas (0.9, 0.95), eps 1e-8, decay_groups'
// two groups (weight decay 0.1 and 0), learning rate 1e-3 warmed up over 3 steps then
// cosine down to 1e-4 at step 10, global gradient-norm clipping at 1.0 before each update.
// The same batch every step, so the losses fall and any drift between the two programs
// (an optimizer rule, a clip, a learning rate) shows in them.
#include "models/gpt.h"
#include "runtime/autograd/functions.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/data/text_corpus.h"
#include "runtime/data/text_windows.h"
#include "runtime/error.h"
#include "runtime/optim/optimizer.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

namespace ddp::models {
namespace {

constexpr const char* kUsage =
    "usage: gpt_parity --out DIR [--model M] [--seed S] [--load FILE]\n"
    "       gpt_parity --out DIR --curve STEPS [--batch-size B] [--model M] [--seed S]\n"
    "  --out DIR         folder for the output files (created by the caller)\n"
    "  --model M         a gpt config (default gpt-tiny)\n"
    "  --seed S          seed of the initial weights (default 1234)\n"
    "  --load FILE       load FILE (torch_gpt.py init) and write DIR/load_logits.safetensors\n"
    "  --curve STEPS     STEPS training steps on new windows each (the loss-curve benchmark)\n"
    "  --batch-size B    windows per step of --curve (default 8)\n"
    "  -h, --help        this text\n";

constexpr int64_t kBatch = 4;
constexpr int64_t kSteps = 10;
constexpr int64_t kWarmup = 3;
constexpr float kLr = 1e-3f, kMinLr = 1e-4f;
constexpr float kWeightDecay = 0.1f;
constexpr double kMaxGradNorm = 1.0;

struct Args {
  std::string out, model = "gpt-tiny", load;
  uint64_t seed = 1234;
  int64_t curve_steps = 0, batch_size = 8;
  bool help = false;  // -h, --help: the usage, exit 0
};

uint64_t parse_count(const std::string& flag, const std::string& value, uint64_t minimum) {
  char* end = nullptr;
  const uint64_t v = std::strtoull(value.c_str(), &end, 10);
  DDP_CHECK(!value.empty() && value[0] != '-' && *end == '\0' && v >= minimum,
            "{} '{}': expected a whole number >= {}", flag, value, minimum);
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      a.help = true;
      return a;
    }
    static const std::array<std::string_view, 6> kFlags = {"--out",  "--model", "--load",
                                                           "--seed", "--curve", "--batch-size"};
    DDP_CHECK(std::find(kFlags.begin(), kFlags.end(), flag) != kFlags.end(),
              "unknown flag '{}'\n{}", flag, kUsage);
    DDP_CHECK(i + 1 < argc, "{} needs a value\n{}", flag, kUsage);
    const std::string value = argv[++i];
    if (flag == "--out") {
      a.out = value;
    } else if (flag == "--model") {
      a.model = value;
    } else if (flag == "--load") {
      a.load = value;
    } else if (flag == "--seed") {
      a.seed = parse_count(flag, value, 0);
    } else if (flag == "--curve") {
      a.curve_steps = static_cast<int64_t>(parse_count(flag, value, 1));
    } else if (flag == "--batch-size") {
      a.batch_size = static_cast<int64_t>(parse_count(flag, value, 1));
    } else {
      throw ValueError(fmt::format("unknown flag '{}'\n{}", flag, kUsage));
    }
  }
  DDP_CHECK(!a.out.empty(), "--out is required\n{}", kUsage);
  return a;
}

// kBatch windows of the train split, evenly spaced over it.
struct ParityBatch {
  TokenBatch tokens;
  std::string corpus;
};
TextCorpus load_corpus();

ParityBatch make_batch(const GptConfig& c) {
  const TextCorpus corpus = load_corpus();
  const auto stride = static_cast<int64_t>(corpus.train.size()) / kBatch;
  DDP_CHECK(stride > c.context, "the {} train split ({} bytes) is too short for {} windows of {}",
            corpus.name, corpus.train.size(), kBatch, c.context + 1);
  std::vector<int64_t> starts;
  for (int64_t b = 0; b < kBatch; ++b) starts.push_back(b * stride);
  return {window_batch(corpus.train, starts, c.context), corpus.name};
}

Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  const int64_t n = logits.size(0) * logits.size(1);
  return functional::cross_entropy(functional::reshape(logits, {n, logits.size(2)}),
                                   targets.reshape({n}));
}

// One forward and backward of the initial model: logits, loss and every gradient.
void write_step0(Gpt& model, const TokenBatch& batch, const std::string& path) {
  const Tensor logits = model.forward(batch.inputs);
  const Tensor loss = lm_loss(logits, batch.targets);
  backward(loss);
  nn::NamedTensors out = {{"logits", logits}, {"loss", loss.reshape({1})}};
  for (const auto& [name, p] : model.named_parameters()) out.emplace_back("grad." + name, grad(p));
  save_safetensors(path, out, {{"model", describe(model.config())}});
}

// Note [parity steps]; one line per step in steps.tsv.
void run_steps(Gpt& model, const TokenBatch& batch, const std::string& path) {
  const DecayGroups groups = decay_groups(model);
  optim::AdamW opt({{groups.decay, kWeightDecay}, {groups.no_decay, 0.0f}},
                   {.lr = kLr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f});
  const optim::LrSchedule schedule{.kind = optim::LrSchedule::Kind::cosine,
                                   .base_lr = kLr,
                                   .warmup_steps = kWarmup,
                                   .total_steps = kSteps,
                                   .min_lr = kMinLr};
  const std::vector<Tensor> params = model.parameters();
  std::ofstream out(path);
  out << "step\tlr\tloss\tgrad_norm\n";
  for (int64_t step = 0; step < kSteps; ++step) {
    opt.set_lr(schedule.lr_at(step));
    opt.zero_grad(true);
    const Tensor loss = lm_loss(model.forward(batch.inputs), batch.targets);
    backward(loss);
    const double norm = optim::clip_grad_norm_(params, kMaxGradNorm);
    opt.step();
    out << fmt::format("{}\t{:.9g}\t{:.9g}\t{:.9g}\n", step, opt.lr(), loss.item<float>(), norm);
  }
  DDP_CHECK(out.good(), "could not write {}", path);
}

TextCorpus load_corpus() {
  const char* dir = std::getenv("DDP_BROWN_DIR");
  return load_text_corpus_or_synthetic(dir != nullptr ? dir : kBrownCorpusDir);
}

// The --curve run: new windows every step, the parity recipe stretched over the steps.
int run_curve(const Args& args, Gpt& model) {
  const GptConfig& c = model.config();
  const TextCorpus corpus = load_corpus();
  TextWindowSampler sampler(static_cast<int64_t>(corpus.train.size()), c.context, 0, 1,
                            {.shuffle = true, .seed = args.seed});
  const std::vector<int64_t> starts = sampler.starts();
  const int64_t b = args.batch_size, steps = args.curve_steps;
  DDP_CHECK(static_cast<int64_t>(starts.size()) >= steps * b,
            "--curve {} x --batch-size {} needs {} windows; the {} train split has {} of {}", steps,
            b, steps * b, corpus.name, starts.size(), c.context + 1);
  const TokenBatch all =
      window_batch(corpus.train, {starts.data(), static_cast<size_t>(steps * b)}, c.context);
  const Shape shape = {steps, b, c.context};
  save_safetensors(args.out + "/curve_batches.safetensors",
                   {{"inputs", all.inputs.reshape(shape)}, {"targets", all.targets.reshape(shape)}},
                   {{"corpus", corpus.name}});
  const DecayGroups groups = decay_groups(model);
  optim::AdamW opt({{groups.decay, kWeightDecay}, {groups.no_decay, 0.0f}},
                   {.lr = kLr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f});
  const optim::LrSchedule schedule{.kind = optim::LrSchedule::Kind::cosine,
                                   .base_lr = kLr,
                                   .warmup_steps = std::max<int64_t>(1, steps / 10),
                                   .total_steps = steps,
                                   .min_lr = kMinLr};
  const std::vector<Tensor> params = model.parameters();
  std::ofstream out(args.out + "/curve.tsv");
  out << "step\tlr\tloss\tgrad_norm\n";
  for (int64_t step = 0; step < steps; ++step) {
    const Tensor inputs = all.inputs.flat_view(step * b * c.context, {b, c.context});
    const Tensor targets = all.targets.flat_view(step * b * c.context, {b, c.context});
    opt.set_lr(schedule.lr_at(step));
    opt.zero_grad(true);
    const Tensor loss = lm_loss(model.forward(inputs), targets);
    backward(loss);
    const double norm = optim::clip_grad_norm_(params, kMaxGradNorm);
    opt.step();
    out << fmt::format("{}\t{:.9g}\t{:.9g}\t{:.9g}\n", step, opt.lr(), loss.item<float>(), norm);
    if ((step + 1) % 20 == 0)
      std::cerr << fmt::format("gpt_parity: curve step {}/{}\n", step + 1, steps);
  }
  DDP_CHECK(out.good(), "could not write {}/curve.tsv", args.out);
  std::cout << fmt::format(
      "gpt_parity: {} curve of {} steps x {} windows of the {} train split -> {}\n", describe(c),
      steps, b, corpus.name, args.out);
  return 0;
}

int run(const Args& args) {
  const GptConfig config = gpt_config(args.model);
  Generator gen(args.seed);
  const auto model = make_gpt(config, gen);
  if (args.curve_steps > 0) {
    save_safetensors(args.out + "/init.safetensors", model->state_dict(),
                     {{"model", describe(config)}, {"seed", std::to_string(args.seed)}});
    return run_curve(args, *model);
  }
  const ParityBatch batch = make_batch(config);
  if (!args.load.empty()) {
    model->load_state_dict(load_safetensors(args.load).tensors, /*strict=*/true);
    NoGradGuard no_grad;
    save_safetensors(args.out + "/load_logits.safetensors",
                     {{"logits", model->forward(batch.tokens.inputs)}});
    std::cout << fmt::format(
        "gpt_parity: {} loaded into {}; logits -> {}/load_logits.safetensors\n", args.load,
        describe(config), args.out);
    return 0;
  }
  save_safetensors(args.out + "/init.safetensors", model->state_dict(),
                   {{"model", describe(config)}, {"seed", std::to_string(args.seed)}});
  save_safetensors(args.out + "/batch.safetensors",
                   {{"inputs", batch.tokens.inputs}, {"targets", batch.tokens.targets}},
                   {{"corpus", batch.corpus}});
  write_step0(*model, batch.tokens, args.out + "/step0.safetensors");
  run_steps(*model, batch.tokens, args.out + "/steps.tsv");
  save_safetensors(args.out + "/final.safetensors", model->state_dict(),
                   {{"model", describe(config)}});
  std::cout << fmt::format("gpt_parity: {} seed {} on {} windows of the {} train split -> {}\n",
                           describe(config), args.seed, kBatch, batch.corpus, args.out);
  return 0;
}

}  // namespace
}  // namespace ddp::models

int main(int argc, char** argv) {
  try {
    const auto args = ddp::models::parse_args(argc, argv);
    if (args.help) {
      std::cout << ddp::models::kUsage;
      return 0;
    }
    return ddp::models::run(args);
  } catch (const ddp::ValueError& e) {
    std::cerr << "gpt_parity: " << e.what() << "\n";
    return 2;
  }
}
