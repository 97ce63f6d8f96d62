// ZeRO-3 (collectives/ddp/fully_shard.h, ZeroOptimizer stage 3) in forked ranks:
// after 20 AdamW steps the parameters and the gathered optimizer state equal
// DistributedDataParallel's to 1e-6 on the MLP (every Linear a unit) and a
// two-block gpt (the blocks units, the embeddings and ln_f the root), on 1 to 4
// ranks over shm and gloo, with parameter counts no world size divides; with
// gradient accumulation under no_sync() and clipping; without resharding after
// the forward; without prefetch; with units named by the user. A rank holds its
// shards, and a unit's full parameters only between its gather and its release:
// at most the root and two units at a time, none after the backward, and no full
// .grad. A state gathered at 4 ranks resumes at 2 (resharding) to the run that
// never stopped. Bad unit names are errors naming the modules.
//
// Runtime: a shm case takes ~0.2 s, gloo ~1.5 s.
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/ddp/fully_shard.h"
#include "collectives/ddp/zero.h"
#include "models/gpt.h"
#include "models/gpt_config.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/ops/ops.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/ddp_parity.h"
#include "tests/multirank/spawn.h"
#include "trainer/task.h"

#include <gtest/gtest.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>

// A namespace of its own: helpers named as in other files of the unity build (Note
// [unity test builds] in tests/CMakeLists.txt).
namespace ddp::test::zero3_test {
namespace {

using namespace std::chrono_literals;
using functional::cross_entropy;

constexpr int kSteps3 = 20;
constexpr double kAbsTol = 1e-6;
// gloo's all-reduce (the DDP reference) and its reduce-scatter (ZeRO-3) add the
// ranks' gradients in different orders; 20 AdamW steps, whose update divides by
// the gradients' own size, carry those roundings to the weights: 1.5e-6 at 4
// ranks on an AMD EPYC (Zen 4), under 1e-6 on others. shm adds in rank order in both.
constexpr double kGlooAbsTol = 1e-5;
constexpr int64_t kGlobalRows = 12;  // divisible by 1, 2, 3 and 4 ranks
const char* const kGpt = "gpt:layers=2,d=7,heads=1,ctx=8,vocab=37";  // 1687 parameters

struct Zero3Setup {
  bool gpt = false;
  int micro_batches = 1;
  double clip = 0;
  bool reshard_after_forward = true;
  bool prefetch = true;
  std::vector<std::string> units{};  // empty: the default policy
  bool freeze_first = false;         // the first parameter registered with requires_grad false
};

struct Data {
  Tensor x, labels;
};

// Rows [rank, rank + 1) * kGlobalRows / world of the global batch of (step, micro).
Data shard_of(const Zero3Setup& s, int world, int rank, int step, int micro) {
  const int64_t rows = kGlobalRows / world;
  if (!s.gpt) {
    const Batch global = global_batch(kGlobalRows / kRowsPerRank, step, micro);
    const Batch mine = global.rows(rank * rows, (rank + 1) * rows);
    return {mine.x, mine.labels};
  }
  const models::GptConfig c = models::gpt_config(kGpt);
  const int64_t t = c.context;
  std::vector<int64_t> tokens, labels;
  for (int64_t b = rank * rows; b < (rank + 1) * rows; ++b) {
    for (int64_t i = 0; i <= t; ++i) {
      const int64_t v = (b * 7 + i * i * 3 + step * 5 + micro * 11) % c.vocab;
      if (i < t) tokens.push_back(v);
      if (i > 0) labels.push_back(v);
    }
  }
  return {from_vector(tokens, {rows, t}), from_vector(labels, {rows * t})};
}

std::shared_ptr<nn::Module> make_model(const Zero3Setup& s, uint64_t seed) {
  if (!s.gpt) return tiny_mlp(seed, {6, 5});  // 4805 parameters
  Generator gen(seed);
  return std::make_shared<models::Gpt>(models::gpt_config(kGpt), gen);
}

Tensor loss_of(const Tensor& out, const Data& d) {
  return cross_entropy(functional::reshape(out, {d.labels.numel(), -1}), d.labels);
}

// eps 1e-6, not 1e-8: the attention's key bias gets a gradient that is rounding
// noise (softmax ignores a constant added to every key), which m / sqrt(v) would
// blow up to full steps of opposite signs whenever two reductions sum in another
// order (gloo's reduce_scatter and all_reduce do; so do 4 and 2 ranks).
std::unique_ptr<optim::AdamW> adamw(nn::Module& model) {
  return std::make_unique<optim::AdamW>(
      model.parameters(), optim::AdamWOptions{.lr = 1e-2f, .eps = 1e-6f, .weight_decay = 0.1f});
}

struct ShardRun {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
  ZeroOptimizer* zero = nullptr;
};

// stage 0: DDP with plain AdamW; stage 3: ZeRO-3.
ShardRun make_run(const std::shared_ptr<Communicator>& comm, const Zero3Setup& s, int stage) {
  ShardRun r;
  r.model = make_model(s, 1 + static_cast<uint64_t>(comm->rank()));  // DDP takes rank 0's
  if (s.freeze_first) set_requires_grad(r.model->parameters().front(), false);
  DdpOptions options;
  options.zero_stage = stage;
  r.ddp = std::make_unique<DistributedDataParallel>(r.model, comm, options);
  auto inner = adamw(*r.model);
  if (stage == 0) {
    r.opt = std::move(inner);
    return r;
  }
  auto zero = std::make_unique<ZeroOptimizer>(
      std::move(inner), *r.ddp,
      ZeroOptions{.fully_shard = {.units = s.units,
                                  .reshard_after_forward = s.reshard_after_forward,
                                  .prefetch = s.prefetch}});
  r.zero = zero.get();
  r.opt = std::move(zero);
  return r;
}

// Checked inside every unit's forward (a hook registered after the engine's):
// the gathered bytes never pass the root plus the two largest units.
struct Watch {
  int64_t limit = 0;
  int64_t worst = 0;
};

void train(ShardRun& r, const Zero3Setup& s, int first, int last, Watch* watch = nullptr) {
  const int rank = r.ddp->comm()->rank(), world = r.ddp->comm()->size();
  for (int step = first; step < last; ++step) {
    r.opt->zero_grad(true);
    for (int m = 0; m < s.micro_batches; ++m) {
      const Data d = shard_of(s, world, rank, step, m);
      auto loss = [&] {
        return functional::scale(loss_of(r.ddp->forward(d.x), d),
                                 1.0f / static_cast<float>(s.micro_batches));
      };
      if (m + 1 < s.micro_batches) {
        auto guard = r.ddp->no_sync();
        r.ddp->backward(loss());
      } else {
        r.ddp->backward(loss());
      }
    }
    if (r.zero != nullptr && r.zero->fully_sharded() != nullptr) {
      const auto* f = r.zero->fully_sharded();
      require(f->gathered_bytes() == 0,
              fmt::format("step {}: {} bytes of parameters still gathered after the backward", step,
                          f->gathered_bytes()));
      for (const Tensor& p : f->parameters()) {
        require(!grad(p).defined(), fmt::format("step {}: a full .grad was kept", step));
      }
      if (watch != nullptr) watch->worst = std::max(watch->worst, f->peak_gathered_bytes());
    }
    if (s.clip > 0) {
      const double norm = r.zero != nullptr ? r.zero->clip_grad_norm(s.clip)
                                            : optim::clip_grad_norm_(r.model->parameters(), s.clip);
      require(norm > s.clip,
              fmt::format("step {}: norm {} does not clip at {}", step, norm, s.clip));
    }
    r.opt->step();
  }
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double d = x.size() == y.size() ? 0 : INFINITY;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    d = std::max(d, std::abs(double(x[i]) - double(y[i])));
  return d;
}

void expect_equal(const nn::NamedTensors& got, const nn::NamedTensors& want,
                  const std::string& what, double tol = kAbsTol) {
  require(got.size() == want.size(),
          fmt::format("{}: {} tensors, the reference has {}", what, got.size(), want.size()));
  for (size_t k = 0; k < want.size(); ++k) {
    require(got[k].first == want[k].first, fmt::format("{}: tensor {} is '{}', expected '{}'", what,
                                                       k, got[k].first, want[k].first));
    const double d =
        want[k].second.dtype() == DType::i64
            ? std::abs(double(got[k].second.item<int64_t>() - want[k].second.item<int64_t>()))
            : max_abs_diff(got[k].second, want[k].second);
    require(d <= tol,
            fmt::format("{}: '{}' differs by {} (at most {})", what, want[k].first, d, tol));
  }
}

// The module's parameters, readable after gather_state() (copied: they are
// released at the next training forward).
nn::NamedTensors snapshot(nn::Module& m) {
  nn::NamedTensors out;
  for (auto& [name, p] : m.named_parameters()) out.emplace_back(name, p.clone());
  return out;
}

void check_parity(const std::shared_ptr<Communicator>& comm, const Zero3Setup& s) {
  const int world = comm->size();
  ShardRun ref = make_run(comm, s, 0);
  train(ref, s, 0, kSteps3);
  ShardRun run = make_run(comm, s, 3);
  const FullyShardedParameters& f = *run.zero->fully_sharded();
  // The watch: root + the two largest units.
  std::vector<int64_t> unit_bytes;
  for (size_t u = 1; u < f.units().size(); ++u) {
    if (f.units()[u].full) unit_bytes.push_back(static_cast<int64_t>(f.units()[u].full->bytes()));
  }
  std::sort(unit_bytes.rbegin(), unit_bytes.rend());
  Watch watch;
  watch.limit = f.units()[0].full ? static_cast<int64_t>(f.units()[0].full->bytes()) : 0;
  for (size_t k = 0; k < std::min<size_t>(2, unit_bytes.size()); ++k) watch.limit += unit_bytes[k];
  int64_t total = 0, padded = 0;
  for (const auto& u : f.units()) {
    total += u.starts.back();
    padded += u.block;
  }
  require(world == 1 || total % world != 0,
          fmt::format("{} parameters divide evenly over {} ranks", total, world));
  require(f.shard_bytes() == 4 * padded,
          fmt::format("shards of {} bytes, expected {} for {} of {} elements", f.shard_bytes(),
                      4 * padded, padded, total));
  train(run, s, 0, kSteps3, &watch);
  const std::string what = fmt::format("rank {} of {}, ZeRO-3", comm->rank(), world);
  require(watch.worst <= watch.limit || !s.reshard_after_forward,
          fmt::format("{}: {} bytes gathered at once, more than the root and two units ({})", what,
                      watch.worst, watch.limit));
  require(run.zero->state_bytes() == 2 * 4 * padded,
          fmt::format("{}: optimizer state of {} bytes, expected {}", what, run.zero->state_bytes(),
                      2 * 4 * padded));
  run.zero->gather_state();
  const double tol = comm->backend() == "gloo" ? kGlooAbsTol : kAbsTol;
  expect_equal(snapshot(*run.model), ref.model->named_parameters(), what + " parameters", tol);
  nn::NamedTensors state = run.zero->state();
  if (s.freeze_first) {
    // The gathered state also holds the frozen parameter's (never stepped, zeros),
    // which the plain optimizer, having seen no gradient for it, has none of.
    const nn::NamedTensors want = ref.opt->state();
    std::erase_if(state, [&](const auto& e) {
      return std::none_of(want.begin(), want.end(),
                          [&](const auto& w) { return w.first == e.first; });
    });
  }
  expect_equal(state, ref.opt->state(), what + " optimizer state", tol);
}

void run_parity(const std::string& backend, int world, const Zero3Setup& s = {}) {
  const auto results = spawn_ranks(world, [&](int rank, int size) {
    check_parity(make_backend(backend, rank, size, {.timeout = 30s}), s);
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

TEST(Zero3Parity, MlpOneRankLocal) {
  check_parity(make_local_communicator(), {});
}
TEST(Zero3Parity, GptOneRankLocal) {
  check_parity(make_local_communicator(), {.gpt = true});
}
TEST(Zero3Parity, MlpTwoRanksShm) {
  run_parity("shm", 2);
}
TEST(Zero3Parity, MlpThreeRanksShm) {
  run_parity("shm", 3);
}
TEST(Zero3Parity, MlpFourRanksShm) {
  run_parity("shm", 4);
}
TEST(Zero3Parity, GptTwoRanksShm) {
  run_parity("shm", 2, {.gpt = true});
}
TEST(Zero3Parity, GptThreeRanksShm) {
  run_parity("shm", 3, {.gpt = true});
}
TEST(Zero3Parity, GptFourRanksShm) {
  run_parity("shm", 4, {.gpt = true});
}
TEST(Zero3Parity, GptAccumulationAndClippingThreeRanksShm) {
  run_parity("shm", 3, {.gpt = true, .micro_batches = 2, .clip = 0.05});
}
TEST(Zero3Parity, GptKeptAfterForwardNoPrefetchTwoRanksShm) {
  run_parity("shm", 2, {.gpt = true, .reshard_after_forward = false, .prefetch = false});
}
// Units the user names, nested ones too: a block and, inside another, its mlp and
// its ln_2 (whose residual add + norm then runs unfused, through the unit's hooks:
// Note [residual layer norm]).
TEST(Zero3Parity, GptNamedUnitsThreeRanksShm) {
  run_parity("shm", 3,
             {.gpt = true,
              .units = {"transformer.h.0", "transformer.h.1.mlp", "transformer.h.1.ln_2",
                        "transformer.ln_f"}});
}
// A frozen token embedding (fine-tuning's usual case) in the root unit beside
// trained parameters: never stepped (no weight decay on it), as DDP leaves it.
TEST(Zero3Parity, GptFrozenEmbeddingThreeRanksShm) {
  run_parity("shm", 3, {.gpt = true, .freeze_first = true});
}
TEST(Zero3Parity, MlpTwoRanksGloo) {
  run_parity("gloo", 2);
}
TEST(Zero3Parity, GptThreeRanksGloo) {
  run_parity("gloo", 3, {.gpt = true});
}
TEST(Zero3Parity, GptFourRanksGloo) {
  run_parity("gloo", 4, {.gpt = true});
}

TEST(Zero3Units, DefaultPolicyAndBadNames) {
  auto comm = make_local_communicator();
  ShardRun r = make_run(comm, {.gpt = true}, 3);
  EXPECT_EQ(r.zero->fully_sharded()->unit_names(),
            (std::vector<std::string>{"(root)", "transformer.h.0", "transformer.h.1"}));
  ShardRun mlp = make_run(comm, {}, 3);
  EXPECT_EQ(mlp.zero->fully_sharded()->unit_names(),
            (std::vector<std::string>{"(root)", "1", "3", "5"}))
      << "each Linear of the Sequential; Flatten and the ReLUs hold nothing";
  try {
    make_run(comm, {.gpt = true, .units = {"transformer.h.7"}}, 3);
    ADD_FAILURE() << "no error for a unit that is not a module";
  } catch (const ValueError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("ZeRO-3 unit 'transformer.h.7' is not a module of the model"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("transformer.h.0"), std::string::npos) << text;
  }
  // A released parameter used outside its unit's forward is an error, not garbage.
  ShardRun used = make_run(comm, {}, 3);
  const Tensor w = used.model->parameters().front();
  try {
    (void)w.to_vector<float>();
    ADD_FAILURE() << "reading a released parameter did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("while its memory is released: it is a parameter of "
                                         "ZeRO-3 unit '1' (1.weight, 1.bias)"),
              std::string::npos)
        << e.what();
  }
}

// One Linear registered under two names (a tied weight): a unit that holds one
// name and not the other leaves the tensor to the root unit, gathered for the
// whole step (it was unit a's, released while the root's forward used it).
class TwoNames : public nn::Module {
 public:
  explicit TwoNames(const std::shared_ptr<nn::Linear>& linear) {
    register_module("a", linear);
    register_module("b", linear);
  }
  Tensor forward(const Tensor& x) override { return x; }
  std::string name() const override { return "TwoNames"; }
};

TEST(Zero3Units, ATiedParameterSplitAcrossUnitsGoesToTheRootUnit) {
  auto comm = make_local_communicator();
  Generator gen(1);
  TwoNames model(std::make_shared<nn::Linear>(4, 4, gen));
  const auto f = FullyShardedParameters::create(model, comm, {.units = {"a"}});
  ASSERT_EQ(f->units().size(), 2u);
  EXPECT_EQ(f->units()[0].params.size(), 2u) << "a.weight and a.bias in the root unit";
  EXPECT_TRUE(f->units()[1].params.empty()) << "nothing left in unit a";
}

// Note [lockstep evaluation]: rank r evaluates r + 1 batches (no-grad forwards,
// each unit gathered on its own); the ranks out of batches shadow the others'
// forwards, nobody hangs, every output equals DDP's model's, and afterwards a
// training step still matches (the collectives stayed paired).
void check_lockstep_evaluation(const std::shared_ptr<Communicator>& comm) {
  const Zero3Setup s{.gpt = true};
  const int rank = comm->rank(), world = comm->size();
  ShardRun ref = make_run(comm, s, 0);
  ShardRun run = make_run(comm, s, 3);
  FullyShardedParameters& f = *run.zero->fully_sharded();
  train(ref, s, 0, 2);
  train(run, s, 0, 2);
  const train::EvalLockstep lockstep{
      .ranks_with_batch = [&](bool has) { return f.ranks_with_batch(has); },
      .shadow = [&] { f.shadow_forward(); }};
  int given = 0, seen = 0;
  f.reset_peak();
  {
    NoGradGuard no_grad;
    train::for_each_eval_batch(
        &lockstep,
        [&](ddp::Batch& b) {
          if (given > rank) return false;
          const Data d = shard_of(s, world, rank, 100 + given++, 0);
          b.inputs = d.x;
          return true;
        },
        [&](const ddp::Batch& b) {
          ++seen;
          const double diff = max_abs_diff((*run.model)(b.inputs), (*ref.model)(b.inputs));
          require(diff <= kAbsTol, fmt::format("evaluation output differs by {}", diff));
          require(f.gathered_bytes() == 0,
                  fmt::format("{} bytes still gathered after an evaluation forward",
                              f.gathered_bytes()));
        });
  }
  require(seen == rank + 1, fmt::format("rank {} evaluated {} batches", rank, seen));
  train(ref, s, 2, 4);
  train(run, s, 2, 4);
  run.zero->gather_state();
  expect_equal(snapshot(*run.model), ref.model->named_parameters(), "after the evaluation");
}

TEST(Zero3Evaluation, UnevenBatchesInLockstepThreeRanksShm) {
  const auto results = spawn_ranks(3, [&](int rank, int size) {
    check_lockstep_evaluation(make_backend("shm", rank, size, {.timeout = 30s}));
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Note [version counter] under ZeRO-3: a unit released after the forward and gathered
// again for the backward holds the values the forward saw, so training runs as
// before (the parity tests); an optimizer step between a forward and its backward
// changes this rank's shards, and that backward is the error torch gives, naming the
// op, on every rank (not a gradient from the stepped weights).
TEST(Zero3VersionCounter, AStepBetweenAForwardAndItsBackwardIsAnErrorTwoRanksShm) {
  const Zero3Setup s{.gpt = true};
  const auto results = spawn_ranks(2, [&](int rank, int size) {
    auto comm = make_backend("shm", rank, size, {.timeout = 30s});
    ShardRun run = make_run(comm, s, 3);
    train(run, s, 0, 2);
    const Data d = shard_of(s, size, rank, 2, 0);
    run.opt->zero_grad(true);
    run.ddp->backward(loss_of(run.ddp->forward(d.x), d));
    const Tensor early = loss_of(run.ddp->forward(d.x), d);
    run.opt->step();
    try {
      run.ddp->backward(early);
    } catch (const ValueError& e) {
      const std::string what = e.what();
      require(what.find("Backward: a tensor its backward needs") != std::string::npos &&
                  what.find("was modified by an in-place operation") != std::string::npos,
              what);
      return 0;
    }
    require(false, "the backward of a forward before the step ran");
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Saved at 4 ranks after 10 steps (the gathered parameters and optimizer state),
// resumed at 2 ranks by ZeRO-3: after 10 more it equals DDP's 20 at 4 ranks.
TEST(Zero3Checkpoint, SavedAtFourRanksResumesAtTwo) {
  const Zero3Setup s{.gpt = true};
  const std::string dir = testing::TempDir() + "/" + unique_run_id();
  const std::string ref_path = dir + "_ref.bin", half_path = dir + "_half.bin";
  auto results = spawn_ranks(4, [&](int rank, int size) {
    auto comm = make_backend("shm", rank, size, {.timeout = 30s});
    ShardRun ref = make_run(comm, s, 0);
    train(ref, s, 0, kSteps3);
    ShardRun run = make_run(comm, s, 3);
    train(run, s, 0, kSteps3 / 2);
    run.zero->gather_state();
    if (rank == 0) {
      nn::NamedTensors all = snapshot(*run.model);
      for (const auto& [name, t] : run.zero->state()) all.emplace_back("optimizer." + name, t);
      save_safetensors(half_path, all);
      save_safetensors(ref_path, ref.model->named_parameters());
    }
    return 0;
  });
  for (const RankResult& r : results) ASSERT_TRUE(r.ok()) << r.describe();
  results = spawn_ranks(2, [&](int rank, int size) {
    auto comm = make_backend("shm", rank, size, {.timeout = 30s});
    const nn::NamedTensors saved = load_safetensors(half_path).tensors;
    // The model loads before the shards are made (the trainer's order), the
    // optimizer state after: with a 4-rank-wide index the 2-rank shards differ.
    ShardRun run;
    run.model = make_model(s, 1);
    nn::NamedTensors weights, state;
    for (const auto& [name, t] : saved) {
      if (name.starts_with("optimizer.")) {
        state.emplace_back(name.substr(10), t);
      } else {
        weights.emplace_back(name, t);
      }
    }
    run.model->load_state_dict(weights);
    DdpOptions options;
    options.zero_stage = 3;
    run.ddp = std::make_unique<DistributedDataParallel>(run.model, comm, options);
    auto zero = std::make_unique<ZeroOptimizer>(adamw(*run.model), *run.ddp);
    run.zero = zero.get();
    run.opt = std::move(zero);
    run.opt->load_state(state, kSteps3 / 2);
    train(run, s, kSteps3 / 2, kSteps3);
    run.zero->gather_state();
    // The reference ran at 4 ranks on the same global batches.
    const SafetensorsFile want = load_safetensors(ref_path);
    for (const auto& [name, p] : snapshot(*run.model)) {
      const double d = max_abs_diff(p, want.at(name));
      require(d <= 1e-5, fmt::format("resumed at 2 ranks, rank {}: '{}' differs from the run "
                                     "that never stopped by {}",
                                     rank, name, d));
    }
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  std::remove(ref_path.c_str());
  std::remove(half_path.c_str());
}

}  // namespace
}  // namespace ddp::test::zero3_test
