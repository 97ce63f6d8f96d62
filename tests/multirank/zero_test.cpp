// ZeRO-1 and ZeRO-2 (collectives/ddp/zero.h) in forked ranks: after 20 AdamW
// steps the parameters equal DistributedDataParallel's to 1e-6 on 2, 3 and 4
// ranks over shm and gloo, with a parameter count no world size divides (uneven
// shards), in one collective round or many; with gradient accumulation and
// clipping; SGD with momentum. The optimizer state (and at stage 2 the
// gradient) a rank holds is its shard alone. ZeRO-2 attached to the DDP: right
// after a synchronized backward no parameter keeps a .grad and the shard is
// DDP's average's; under no_sync() the backward stays local. A state gathered at
// 4 ranks and saved resumes at 2 ranks and at 1 (resharding) to the run that
// never stopped.
//
// Runtime: the model has 4805 parameters; a shm case takes ~0.1 s, gloo ~1 s.
#include "collectives/ddp/zero.h"
#include "collectives/backends.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/ddp/join.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/env.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/ops.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/ddp_parity.h"
#include "tests/multirank/spawn.h"

#include <gtest/gtest.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using functional::cross_entropy;

constexpr int kZeroSteps = 20;
constexpr double kAbsTol = 1e-6;              // the bar: fp32 parameters equal to 1e-6
constexpr int64_t kGlobalRows = 12;           // divisible by 1, 2, 3 and 4 ranks
const std::vector<int64_t> kHidden = {6, 5};  // 4805 parameters: odd, not a multiple of 3 or 4

struct Setup {
  int stage = 0;  // 0: DDP with the plain optimizer
  bool sgd = false;
  double cap_mb = 25;  // ZeRO's round size (and DDP's bucket cap)
  int micro_batches = 1;
  double clip = 0;             // > 0: clip the global gradient norm to this
  bool by_parameters = false;  // ZeroOptions::by_parameters
  bool attach = true;          // stage 2: ZeroOptimizer::attach(ddp), else step() reduces
  int replicas = 1;            // ZeroOptions::replicas
  std::vector<int64_t> hidden = kHidden;
  bool freeze_first = false;  // the first weight registered with requires_grad false
};

// Rows [rank, rank + 1) * kGlobalRows / world of the global batch of (step, micro):
// the same global batch at every world size.
Batch shard_of(int world, int rank, int step, int micro) {
  const Batch global = global_batch(kGlobalRows / kRowsPerRank, step, micro);
  const int64_t rows = kGlobalRows / world;
  return global.rows(rank * rows, (rank + 1) * rows);
}

std::unique_ptr<optim::Optimizer> inner_optimizer(nn::Module& model, bool sgd) {
  if (sgd)
    return std::make_unique<optim::SGD>(model.parameters(),
                                        optim::SgdOptions{.lr = 0.05f, .momentum = 0.9f});
  return std::make_unique<optim::AdamW>(model.parameters(),
                                        optim::AdamWOptions{.lr = 1e-2f, .weight_decay = 0.1f});
}

// Steps [first, last) of training through ddp with `opt` (a ZeroOptimizer at stage > 0).
void train_steps(DistributedDataParallel& ddp, optim::Optimizer& opt, const Setup& s, int first,
                 int last) {
  const int rank = ddp.comm()->rank(), world = ddp.comm()->size();
  auto* zero = dynamic_cast<ZeroOptimizer*>(&opt);
  for (int step = first; step < last; ++step) {
    opt.zero_grad(true);
    for (int m = 0; m < s.micro_batches; ++m) {
      const Batch b = shard_of(world, rank, step, m);
      auto loss = [&] {
        return functional::scale(cross_entropy(ddp(b.x), b.labels), 1.0f / float(s.micro_batches));
      };
      if (m + 1 < s.micro_batches) {
        auto guard = ddp.no_sync();
        ddp.backward(loss());
      } else {
        ddp.backward(loss());
      }
    }
    if (s.clip > 0) {
      const double norm = zero != nullptr
                              ? zero->clip_grad_norm(s.clip)
                              : optim::clip_grad_norm_(ddp.module().parameters(), s.clip);
      require(norm > s.clip,
              fmt::format("step {}: norm {} does not clip at {}", step, norm, s.clip));
    }
    opt.step();
  }
}

struct Trained {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
};

Trained make_run(const std::shared_ptr<Communicator>& comm, const Setup& s) {
  Trained t;
  t.model = tiny_mlp(1 + static_cast<uint64_t>(comm->rank()), s.hidden);  // DDP broadcasts rank 0's
  if (s.freeze_first) set_requires_grad(t.model->parameters().front(), false);
  DdpOptions options{.bucket_cap_mb = s.cap_mb, .first_bucket_mb = std::min(1.0, s.cap_mb)};
  options.zero_stage = s.stage;
  t.ddp = std::make_unique<DistributedDataParallel>(t.model, comm, options);
  t.opt = inner_optimizer(*t.model, s.sgd);
  if (s.stage > 0) {
    auto zero = std::make_unique<ZeroOptimizer>(std::move(t.opt), comm,
                                                ZeroOptions{.stage = s.stage,
                                                            .bucket_cap_mb = s.cap_mb,
                                                            .by_parameters = s.by_parameters,
                                                            .replicas = s.replicas});
    if (s.stage == 2 && s.attach) zero->attach(*t.ddp);
    t.opt = std::move(zero);
  }
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::abs(double(x[i]) - double(y[i])));
  return d;
}

void expect_equal_params(const nn::Module& got, const nn::Module& want, const std::string& what) {
  const nn::NamedTensors g = got.named_parameters(), w = want.named_parameters();
  for (size_t k = 0; k < g.size(); ++k) {
    const double d = max_abs_diff(g[k].second, w[k].second);
    require(d <= kAbsTol, fmt::format("{}: parameter '{}' differs from DDP's by {} (tolerance {})",
                                      what, g[k].first, d, kAbsTol));
  }
}

// The state of `want` (a plain optimizer's, or a file's) in `got` (a gathered
// one): the same names, and the order of want's optimizer (the file: by name).
void expect_equal_state(nn::NamedTensors got, nn::NamedTensors want, const std::string& what,
                        bool by_name = false) {
  auto by_key = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (by_name) {
    std::sort(got.begin(), got.end(), by_key);
    std::sort(want.begin(), want.end(), by_key);
  }
  require(got.size() == want.size(), fmt::format("{}: {} state tensors, DDP's optimizer has {}",
                                                 what, got.size(), want.size()));
  for (size_t k = 0; k < want.size(); ++k) {
    require(got[k].first == want[k].first, fmt::format("{}: state {} is '{}', expected '{}'", what,
                                                       k, got[k].first, want[k].first));
    const double d =
        want[k].second.dtype() == DType::i64
            ? std::abs(double(got[k].second.item<int64_t>() - want[k].second.item<int64_t>()))
            : max_abs_diff(got[k].second, want[k].second);
    require(d <= kAbsTol, fmt::format("{}: state '{}' differs by {}", what, want[k].first, d));
  }
}

// What a rank may hold: its shard (Note [zero layout]) of the state, and at stage 2
// of the gradient, and no full .grad.
void expect_sharded_memory(const ZeroOptimizer& zero, nn::Module& model, const Setup& s) {
  const int64_t n = zero.numel();
  const ShardRange shard = zero.shard();
  const int64_t buffers = s.sgd ? 1 : 2;
  require(zero.state_bytes() == buffers * 4 * shard.size,
          fmt::format("optimizer state of {} bytes for a shard of {} of {} elements",
                      zero.state_bytes(), shard.size, n));
  if (zero.stage() != 2) return;
  require(zero.grad_shard_bytes() == 4 * shard.size,
          fmt::format("gradient shard of {} bytes for {} elements", zero.grad_shard_bytes(),
                      shard.size));
  for (const auto& [name, p] : model.named_parameters()) {
    require(!grad(p).defined(), fmt::format("stage 2 kept the full .grad of '{}'", name));
  }
}

void check_zero_parity(const std::shared_ptr<Communicator>& comm, Setup s) {
  const int world = comm->size();
  Setup ddp_setup = s;
  ddp_setup.stage = 0;
  Trained ref = make_run(comm, ddp_setup);
  train_steps(*ref.ddp, *ref.opt, ddp_setup, 0, kZeroSteps);
  for (int stage : {1, 2}) {
    s.stage = stage;
    Trained run = make_run(comm, s);
    auto& zero = dynamic_cast<ZeroOptimizer&>(*run.opt);
    require(zero.numel() % world != 0 || world == 1,
            fmt::format("{} parameters divide evenly over {} ranks", zero.numel(), world));
    train_steps(*run.ddp, zero, s, 0, kZeroSteps);
    const std::string what = fmt::format("rank {} of {}, ZeRO-{}", comm->rank(), world, stage);
    expect_equal_params(*run.model, *ref.model, what);
    expect_sharded_memory(zero, *run.model, s);
    if (s.by_parameters) {  // this rank's shard starts and ends between parameters
      std::vector<int64_t> bounds{0};
      for (const Tensor& p : run.model->parameters()) bounds.push_back(bounds.back() + p.numel());
      const ShardRange own = zero.shard();
      for (int64_t edge : {own.begin, own.begin + own.size}) {
        require(std::count(bounds.begin(), bounds.end(), edge) == 1,
                fmt::format("{}: by_parameters shard [{}, {}) cuts a parameter", what, own.begin,
                            own.begin + own.size));
      }
    }
    zero.gather_state();
    nn::NamedTensors state = zero.state();
    if (s.freeze_first) {
      // The gathered state also holds the frozen parameter's (never stepped), which
      // the plain optimizer, having seen no gradient for it, has none of.
      const nn::NamedTensors want = ref.opt->state();
      std::erase_if(state, [&](const auto& e) {
        return std::none_of(want.begin(), want.end(),
                            [&](const auto& w) { return w.first == e.first; });
      });
    }
    expect_equal_state(state, ref.opt->state(), what);
  }
}

void run_zero(const std::string& backend, int world, const Setup& s = {}) {
  const auto results = spawn_ranks(world, [&](int rank, int size) {
    check_zero_parity(make_backend(backend, rank, size, {.timeout = 30s}), s);
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

TEST(ZeroShard, BalancedWithinOneElementAndCoversEverything) {
  for (int64_t n : {0, 1, 5, 4805, 4806}) {
    for (int w : {1, 2, 3, 4, 7}) {
      int64_t next = 0, most = 0, least = n;
      for (int r = 0; r < w; ++r) {
        const ShardRange s = zero_shard(n, w, r);
        EXPECT_EQ(s.begin, next) << n << " over " << w << ", rank " << r;
        next += s.size;
        most = std::max(most, s.size);
        least = std::min(least, s.size);
      }
      EXPECT_EQ(next, n) << n << " over " << w;
      EXPECT_LE(most - least, 1) << n << " over " << w;
    }
  }
}

// What cannot be sharded is a ValueError naming the value and the choices.
TEST(ZeroErrors, BadStagesAndJoinAtStageTwo) {
  auto comm = make_local_communicator();
  auto model = tiny_mlp(1, kHidden);
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one saying: " << text;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&] {
        DdpOptions options;
        options.zero_stage = 4;
        DistributedDataParallel ddp(model, comm, options);
      },
      "zero_stage 4 is not a ZeRO stage; valid: 0 (DDP), 1");
  expect_error([&] { ZeroOptimizer zero(inner_optimizer(*model, false), comm, {.stage = 0}); },
               "stage 0 is not sharded; valid: 1");
  DdpOptions options;
  options.zero_stage = 2;
  DistributedDataParallel ddp(model, comm, options);
  EXPECT_TRUE(ddp.buckets().empty()) << "stage 2 allocates no gradient buckets";
  expect_error([&] { Join join(ddp); }, "has zero_stage 2");
  expect_error([&] { ddp.register_comm_hook(allreduce_hook); }, "zero_stage 2");
  expect_error(
      [&] {
        ZeroOptimizer zero(inner_optimizer(*model, false), comm, {.stage = 1});
        zero.attach(ddp);
      },
      "only stages 2 and 3 reduce gradients during the backward");
  // A synchronized backward left unfinished (ddp::backward without finish_backward):
  // its round is in flight, so the next forward says what to call.
  ZeroOptimizer zero(inner_optimizer(*model, false), ddp);
  const Batch b = shard_of(1, 0, 0, 0);
  ddp::backward(cross_entropy(ddp(b.x), b.labels));
  expect_error([&] { ddp(b.x); }, "call ddp.finish_backward() after ddp::backward(loss)");
  ddp.finish_backward();
  EXPECT_TRUE(zero.grad_shard().defined()) << "finish_backward() left no gradient shard";
}

TEST(ZeroShard, ByParametersKeepsParametersWhole) {
  const std::vector<int64_t> numels = {4704, 6, 30, 5, 50, 10};  // the test model's
  std::vector<int64_t> bounds{0};
  for (int64_t n : numels) bounds.push_back(bounds.back() + n);
  for (int w : {1, 2, 3, 4, 8}) {
    const std::vector<ShardRange> shards = zero_shards_by_parameters(numels, w);
    ASSERT_EQ(shards.size(), static_cast<size_t>(w));
    int64_t next = 0;
    for (const ShardRange& s : shards) {
      EXPECT_EQ(s.begin, next) << "over " << w;
      next += s.size;
      EXPECT_TRUE(std::count(bounds.begin(), bounds.end(), next) == 1)
          << "over " << w << ": a shard ends at " << next << ", inside a parameter";
    }
    EXPECT_EQ(next, bounds.back()) << "over " << w;
  }
  // Nearest boundaries: 2 ranks of {10, 10, 10, 10} split 20 / 20.
  const std::vector<ShardRange> even = zero_shards_by_parameters({10, 10, 10, 10}, 2);
  EXPECT_EQ(even[0].size, 20);
  EXPECT_EQ(even[1].size, 20);
}

TEST(ZeroParity, OneRankLocal) {
  check_zero_parity(make_local_communicator(), {});
}
TEST(ZeroParity, TwoRanksShm) {
  run_zero("shm", 2);
}
TEST(ZeroParity, ThreeRanksShm) {
  run_zero("shm", 3);
}
TEST(ZeroParity, FourRanksShm) {
  run_zero("shm", 4);
}
TEST(ZeroParity, ManyRoundsThreeRanksShm) {
  run_zero("shm", 3, {.cap_mb = 0.002});  // ~170 elements per rank and round
}
TEST(ZeroParity, AccumulationAndClippingThreeRanksShm) {
  run_zero("shm", 3, {.cap_mb = 0.002, .micro_batches = 2, .clip = 0.5});
}
// Whole parameters: rank 0 owns none of this model (its first weight holds 98%).
TEST(ZeroParity, ByParametersThreeRanksShm) {
  run_zero("shm", 3, {.cap_mb = 0.002, .by_parameters = true});
}
// Stage 2 without attach(): every backward local, step() reduce-scatters.
TEST(ZeroParity, ReducedInStepAccumulationThreeRanksShm) {
  run_zero("shm", 3, {.cap_mb = 0.002, .micro_batches = 2, .clip = 0.5, .attach = false});
}
// A frozen parameter (fine-tuning's usual case) stays as it was, at every stage,
// and the others train as DDP's do: stage 2 registers no gradient hook on it.
TEST(ZeroParity, AFrozenParameterThreeRanksShm) {
  run_zero("shm", 3, {.cap_mb = 0.002, .freeze_first = true});
}
TEST(ZeroParity, SgdMomentumFourRanksShm) {
  run_zero("shm", 4, {.sgd = true});
}
TEST(ZeroParity, TwoRanksGloo) {
  run_zero("gloo", 2);
}
TEST(ZeroParity, ThreeRanksGloo) {
  run_zero("gloo", 3);
}
TEST(ZeroParity, FourRanksGloo) {
  run_zero("gloo", 4);
}

// The averaged gradient DDP leaves in .grad, flattened in the optimizer's order,
// at [begin, begin + size).
std::vector<float> ddp_gradient_range(nn::Module& model, const ShardRange& range) {
  std::vector<float> flat;
  for (const Tensor& p : model.parameters()) {
    const Tensor g = grad(p);
    require(g.defined(), "DDP left a parameter without .grad");
    const std::vector<float> v = g.to_vector<float>();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return {flat.begin() + range.begin, flat.begin() + range.begin + range.size};
}

// Stage 2 attached: right after ddp.backward(loss) of a synchronized step, before
// step(), no parameter has a .grad and the gradient shard is DDP's averaged
// gradient's shard; at two steps (the second after an update).
void check_synchronized_backward(const std::shared_ptr<Communicator>& comm, Setup s,
                                 bool expect_overlap) {
  const int world = comm->size(), rank = comm->rank();
  Setup ddp_setup = s;
  ddp_setup.stage = 0;
  Trained ref = make_run(comm, ddp_setup);
  s.stage = 2;
  Trained run = make_run(comm, s);
  auto& zero = dynamic_cast<ZeroOptimizer&>(*run.opt);
  for (int step = 0; step < 2; ++step) {
    const std::string what = fmt::format("rank {} of {}, step {}", rank, world, step);
    const Batch b = shard_of(world, rank, step, 0);
    ref.opt->zero_grad(true);
    zero.zero_grad(true);
    ref.ddp->backward(cross_entropy((*ref.ddp)(b.x), b.labels));
    run.ddp->backward(cross_entropy((*run.ddp)(b.x), b.labels));
    for (const auto& [name, p] : run.model->named_parameters()) {
      require(
          !grad(p).defined(),
          fmt::format("{}: '{}' kept its full .grad after the synchronized backward", what, name));
    }
    const Tensor shard = zero.grad_shard();
    require(shard.defined() && shard.numel() == zero.shard().size,
            fmt::format("{}: no gradient shard of {} elements after the backward", what,
                        zero.shard().size));
    const std::vector<float> got = shard.to_vector<float>();
    const std::vector<float> want = ddp_gradient_range(*ref.model, zero.shard());
    for (size_t j = 0; j < want.size(); ++j) {
      require(std::abs(double(got[j]) - double(want[j])) <= kAbsTol,
              fmt::format("{}: gradient shard element {} is {}, DDP's average {}", what, j, got[j],
                          want[j]));
    }
    const int64_t early = zero.grad_rounds_overlapped();
    require(!expect_overlap || (early > 0 && early < zero.grad_rounds()),
            fmt::format("{}: {} of {} rounds overlapped the backward", what, early,
                        zero.grad_rounds()));
    ref.opt->step();
    zero.step();
  }
  expect_equal_params(*run.model, *ref.model, fmt::format("rank {} of {}", rank, world));
}

// Stage 2 attached, under no_sync(): the backward stays local, every .grad full
// and equal to DDP's local one; nothing is reduced.
void check_local_backward(const std::shared_ptr<Communicator>& comm, const Setup& s) {
  const int world = comm->size(), rank = comm->rank();
  Setup ddp_setup = s;
  ddp_setup.stage = 0;
  Trained ref = make_run(comm, ddp_setup);
  Trained run = make_run(comm, {.stage = 2, .cap_mb = s.cap_mb, .hidden = s.hidden});
  auto& zero = dynamic_cast<ZeroOptimizer&>(*run.opt);
  const Batch b = shard_of(world, rank, 0, 0);
  {
    auto guard = ref.ddp->no_sync();
    ref.ddp->backward(cross_entropy((*ref.ddp)(b.x), b.labels));
  }
  {
    auto guard = run.ddp->no_sync();
    run.ddp->backward(cross_entropy((*run.ddp)(b.x), b.labels));
  }
  const nn::NamedTensors got = run.model->named_parameters(), want = ref.model->named_parameters();
  for (size_t k = 0; k < got.size(); ++k) {
    const Tensor g = grad(got[k].second);
    require(g.defined() && g.shape() == got[k].second.shape(),
            fmt::format("rank {}: '{}' has no full .grad after a backward under no_sync()", rank,
                        got[k].first));
    const double d = max_abs_diff(g, grad(want[k].second));
    require(d <= kAbsTol, fmt::format("rank {}: '{}' .grad differs from the local gradient by {}",
                                      rank, got[k].first, d));
  }
  require(!zero.grad_shard().defined(),
          fmt::format("rank {}: a gradient shard after a local backward", rank));
}

// The wide model's last weight (20000 of 27580 elements) fills the upper rounds,
// which launch before the first layers' gradients exist.
const std::vector<int64_t> kWideHidden = {2, 2000};

TEST(ZeroBackward, ShardAfterSynchronizedBackwardThreeRanksShm) {
  const auto results = spawn_ranks(3, [&](int rank, int size) {
    check_synchronized_backward(make_backend("shm", rank, size, {.timeout = 30s}),
                                {.cap_mb = 0.002}, false);
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}
TEST(ZeroBackward, RoundsOverlapBackwardTwoRanksGloo) {
  const auto results = spawn_ranks(2, [&](int rank, int size) {
    check_synchronized_backward(make_backend("gloo", rank, size, {.timeout = 30s}),
                                {.cap_mb = 0.01, .hidden = kWideHidden}, true);
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}
TEST(ZeroBackward, ShardOneRankLocal) {
  check_synchronized_backward(make_local_communicator(), {}, false);
}
TEST(ZeroBackward, NoSyncStaysLocalThreeRanksShm) {
  const auto results = spawn_ranks(3, [&](int rank, int size) {
    check_local_backward(make_backend("shm", rank, size, {.timeout = 30s}), {.cap_mb = 0.002});
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// Resharding: ZeRO-2 at 4 ranks for half the steps; rank 0 saves the parameters
// and the gathered state; ZeRO-1 at 2 ranks and at 1 resumes from the file and
// equals the DDP run that never stopped (at 4 ranks, the same global batches).
// Collective: the run's ZeRO state gathered; rank 0 writes it with the parameters
// ("optimizer.<name>" next to the parameters' names), as train's checkpoint does.
void save_gathered(const std::string& path, Trained& run, int rank) {
  auto& zero = dynamic_cast<ZeroOptimizer&>(*run.opt);
  zero.gather_state();
  if (rank != 0) return;
  nn::NamedTensors all = run.model->named_parameters();
  for (const auto& [name, t] : zero.state()) all.emplace_back("optimizer." + name, t);
  save_safetensors(path, all);
}

std::string save_half_run(const std::string& dir) {
  const std::string path = dir + "/zero.safetensors";
  const auto results = spawn_ranks(4, [&](int rank, int size) {
    auto comm = make_backend("shm", rank, size, {.timeout = 30s});
    Trained run = make_run(comm, {.stage = 2});
    train_steps(*run.ddp, *run.opt, {.stage = 2}, 0, kZeroSteps / 2);
    save_gathered(path, run, rank);
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  return path;
}

void resume_and_compare(const std::shared_ptr<Communicator>& comm, const std::string& path,
                        const std::string& reference) {
  const SafetensorsFile file = load_safetensors(path);
  Trained run = make_run(comm, {.stage = 1});
  nn::NamedTensors state;
  for (const auto& [name, t] : file.tensors) {
    if (name.starts_with("optimizer.")) state.emplace_back(name.substr(10), t);
  }
  {
    NoGradGuard no_grad;
    for (auto& [name, p] : run.model->named_parameters()) copy_(p, file.at(name));
  }
  run.opt->load_state(state, kZeroSteps / 2);
  auto& zero = dynamic_cast<ZeroOptimizer&>(*run.opt);
  zero.gather_state();  // the resharded state, gathered again, is the saved one
  expect_equal_state(zero.state(), state, fmt::format("resumed at {} ranks", comm->size()), true);
  train_steps(*run.ddp, zero, {.stage = 1}, kZeroSteps / 2, kZeroSteps);
  const SafetensorsFile want = load_safetensors(reference);
  for (const auto& [name, p] : run.model->named_parameters()) {
    const double d = max_abs_diff(p, want.at(name));
    require(d <= 1e-5, fmt::format("resumed at {} ranks: '{}' differs from the run that never "
                                   "stopped by {}",
                                   comm->size(), name, d));
  }
}

TEST(ZeroCheckpoint, SavedAtFourRanksResumesAtTwoAndOne) {
  const std::string dir = testing::TempDir() + "/" + unique_run_id();
  std::filesystem::create_directories(dir);
  const std::string reference = dir + "/ddp.safetensors";
  auto results = spawn_ranks(4, [&](int rank, int size) {
    Trained run = make_run(make_backend("shm", rank, size, {.timeout = 30s}), {});
    train_steps(*run.ddp, *run.opt, {}, 0, kZeroSteps);
    if (rank == 0) save_safetensors(reference, run.model->named_parameters());
    return 0;
  });
  for (const RankResult& r : results) ASSERT_TRUE(r.ok()) << r.describe();
  const std::string path = save_half_run(dir);
  results = spawn_ranks(2, [&](int rank, int size) {
    resume_and_compare(make_backend("shm", rank, size, {.timeout = 30s}), path, reference);
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  resume_and_compare(make_local_communicator(), path, reference);
  std::filesystem::remove_all(dir);
}

// Note [zero replicas]: 4 ranks train with 2 replicas; then rank 2 leaves. Ranks
// 0, 1 and 3 recover into optimizers over a new group of 3 -- rank 2's shard from
// rank 1's replica -- and get the state and parameters the 4 ranks had, bit for
// bit; then rank 3 or rank 0 leaves too, and the two left get them again from
// the new optimizers' shards and replicas; ranks 0, 1 and 3 train on at 3 ranks
// to the DDP run that never stopped. The same with rank 2 replaced by a
// rank that joins with nothing (then rank 0 leaves: shard 0 from the joiner's
// replica); ranks 1 and 2 leaving together lose shard 2 (a ValueError naming it).
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  const Tensor g = got.cpu(), w = want.cpu();
  require(g.shape() == w.shape() && g.dtype() == w.dtype() &&
              std::memcmp(g.data_ptr(), w.data_ptr(),
                          static_cast<size_t>(g.numel()) * element_size(g.dtype())) == 0,
          fmt::format("{}: not the same bits (largest difference {})", what,
                      g.dtype() == DType::f32 ? max_abs_diff(g, w) : -1.0));
}

// ZeroOptimizer::recover() into a new optimizer over `group` (as the trainer
// does), and what it holds: its state gathered over `group`, the parameters.
// Rank q's shard in `zero`'s layout (Note [zero layout]).
ShardRange shard_in(const ZeroOptimizer& zero, int q, bool by_parameters) {
  if (!by_parameters) return zero_shard(zero.numel(), zero.world_size(), q);
  std::vector<int64_t> numels;
  for (const Tensor& p : zero.params()) numels.push_back(p.numel());
  return zero_shards_by_parameters(numels, zero.world_size())[static_cast<size_t>(q)];
}

struct Recovered {
  std::unique_ptr<ZeroOptimizer> zero;
  bool by_parameters = false;
  std::vector<Tensor> parameters;
  int64_t peak_bytes = 0;  // allocated by recover() at most, beyond what was before
};

Recovered recover_into(const std::shared_ptr<Communicator>& group, ZeroOptimizer* old,
                       nn::Module& model, const Setup& s, int64_t steps) {
  Recovered out;
  out.zero = std::make_unique<ZeroOptimizer>(inner_optimizer(model, s.sgd), group,
                                             ZeroOptions{.stage = s.stage,
                                                         .bucket_cap_mb = s.cap_mb,
                                                         .by_parameters = s.by_parameters,
                                                         .replicas = 2});
  out.by_parameters = s.by_parameters;
  const Device cpu = Device::cpu();
  reset_peak_memory_stats(cpu);
  const uint64_t before = memory_allocated(cpu);
  out.parameters = ZeroOptimizer::recover(*group, old, *out.zero, steps);
  out.peak_bytes = static_cast<int64_t>(max_memory_allocated(cpu) - before);
  return out;
}

// The optimizer holds, over its group, `state` and its shard and replica sizes.
void expect_recovered(Recovered& got, const nn::NamedTensors& state,
                      const std::vector<Tensor>& params, int64_t steps, const std::string& what) {
  ZeroOptimizer& zero = *got.zero;
  require(zero.steps() == steps,
          fmt::format("{}: {} steps, expected {}", what, zero.steps(), steps));
  const int64_t own = zero.shard().size;
  const int64_t kept =
      zero.replica_of() < 0 ? 0 : shard_in(zero, zero.replica_of(), got.by_parameters).size;
  int64_t buffers = 0;  // exp_avg and exp_avg_sq, or momentum_buffer, per parameter
  for (const auto& [name, t] : state) buffers += t.dtype() == DType::f32 ? 1 : 0;
  buffers /= static_cast<int64_t>(params.size());
  require(zero.state_bytes() == buffers * 4 * (own + kept),
          fmt::format("{}: {} bytes of state for a shard of {} and a replica of {} ({} buffers)",
                      what, zero.state_bytes(), own, kept, buffers));
  zero.gather_state();
  const nn::NamedTensors got_state = zero.state();
  require(got_state.size() == state.size(),
          fmt::format("{}: {} state tensors, expected {}", what, got_state.size(), state.size()));
  for (size_t k = 0; k < state.size(); ++k) {
    require(got_state[k].first == state[k].first,
            fmt::format("{}: state {} is '{}', expected '{}'", what, k, got_state[k].first,
                        state[k].first));
    expect_same_bits(got_state[k].second, state[k].second,
                     fmt::format("{}: state '{}'", what, state[k].first));
  }
  require(
      got.parameters.size() == params.size(),
      fmt::format("{}: {} parameters, expected {}", what, got.parameters.size(), params.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    expect_same_bits(got.parameters[i], params[i], fmt::format("{}: parameter {}", what, i));
  }
}

std::shared_ptr<Communicator> subgroup(const std::string& name, const std::vector<int>& members,
                                       int rank) {
  const auto at = std::find(members.begin(), members.end(), rank);
  return make_shm_communicator({.rank = static_cast<int>(at - members.begin()),
                                .size = static_cast<int>(members.size()),
                                .run_id = *env::get(env::kRunId) + name,
                                .comm = {.timeout = 30s},
                                .abandon = {}});
}

void check_replicas(int rank, int size, Setup s, const std::string& reference) {
  s.replicas = 2;
  Trained run = make_run(make_backend("shm", rank, size, {.timeout = 30s}), s);
  auto& zero = dynamic_cast<ZeroOptimizer&>(*run.opt);
  require(zero.replica_of() == (rank + 1) % size,
          fmt::format("rank {} keeps the replica of {}", rank, zero.replica_of()));
  train_steps(*run.ddp, zero, s, 0, kZeroSteps / 2);
  const int64_t own = zero.shard().size;
  const int64_t kept = shard_in(zero, (rank + 1) % size, s.by_parameters).size;
  require(zero.state_bytes() == (s.sgd ? 1 : 2) * 4 * (own + kept),
          fmt::format("rank {}: {} bytes of state for its shard of {} and a replica of {}", rank,
                      zero.state_bytes(), own, kept));
  zero.gather_state();
  nn::NamedTensors state;
  for (const auto& [name, t] : zero.state()) state.emplace_back(name, t.clone());
  std::vector<Tensor> params;
  for (const Tensor& p : run.model->parameters()) params.push_back(p.clone());
  const int64_t steps = zero.steps();
  const std::string what = fmt::format("rank {}, ZeRO-{}{}{}", rank, s.stage, s.sgd ? " SGD" : "",
                                       s.by_parameters ? " by parameters" : "");
  if (rank != 2) {  // rank 2 left
    auto group = subgroup("-left", {0, 1, 3}, rank);
    Recovered got = recover_into(group, &zero, *run.model, s, steps);
    expect_recovered(got, state, params, steps, what + ", rank 2 left");
    // Memory: the new shards, the parameter values and one round (and a few
    // small tensors), not the whole state (3 x 4805 floats with AdamW).
    const int64_t n = zero.numel();
    const int64_t per_rank = static_cast<int64_t>(s.cap_mb * (1 << 20) / 4) / 3;
    int64_t largest = 1;
    for (int q = 0; q < 3; ++q)
      largest = std::max(largest, shard_in(*got.zero, q, s.by_parameters).size);
    const int64_t round = 3 * std::clamp<int64_t>(per_rank, 1, largest);
    const int64_t bound = got.zero->state_bytes() + 4 * (n + round) + 4096;
    require(got.peak_bytes <= bound,
            fmt::format("{}: recovery allocated {} bytes at its peak, more than the new shards "
                        "({} bytes), the {} parameter values and a round of {} (+ 4 KiB): {}",
                        what, got.peak_bytes, got.zero->state_bytes(), n, round, bound));
  }
  {  // rank 2 replaced: it joins with nothing
    auto group = subgroup("-joined", {0, 1, 3, 2}, rank);
    Recovered got = recover_into(group, rank == 2 ? nullptr : &zero, *run.model, s, steps);
    expect_recovered(got, state, params, steps, what + ", rank 2 replaced");
    if (rank != 0) {  // then rank 0 leaves: shard 0 from the replica the joiner received
      auto again = subgroup("-joined-again", {1, 3, 2}, rank);
      Recovered twice = recover_into(again, got.zero.get(), *run.model, s, steps);
      expect_recovered(twice, state, params, steps, what + ", rank 2 replaced, then rank 0 left");
    }
  }
  if (rank == 0 || rank == 3) {  // ranks 1 and 2 left: shard 2 and its replica
    auto group = subgroup("-lost", {0, 3}, rank);
    try {
      recover_into(group, &zero, *run.model, s, steps);
      require(false, what + ": ranks 1 and 2 left, and recover() did not say shard 2 is lost");
    } catch (const ValueError& e) {
      const std::string text = e.what();
      require(text.find("state of shard 2 (rank 2 of the 4 held it, rank 1 its replica) is lost") !=
                  std::string::npos,
              what + ": " + text);
    }
  }
  if (rank == 2) return;
  // The ranks left train on at 3: the DDP run that never stopped.
  auto group = subgroup("-on", {0, 1, 3}, rank);
  Recovered got = recover_into(group, &zero, *run.model, s, steps);
  run.ddp.reset();  // its hooks leave the model's parameters
  Trained on;
  on.model = run.model;
  {
    NoGradGuard no_grad;
    std::vector<Tensor> live = on.model->parameters();
    for (size_t i = 0; i < live.size(); ++i) copy_(live[i], got.parameters[i]);
  }
  // Then another rank leaves too, its shard from the new optimizers' replicas:
  // rank 3 (2 of the 3; rank 1 kept its shard), or rank 0 (the last rank, 3,
  // kept shard 0).
  if (rank != 3) {
    auto again = subgroup("-again", {0, 1}, rank);
    Recovered twice = recover_into(again, got.zero.get(), *run.model, s, steps);
    expect_recovered(twice, state, params, steps, what + ", rank 2 left, then rank 3");
  }
  if (rank != 0) {
    auto again = subgroup("-again-wrap", {1, 3}, rank);
    Recovered twice = recover_into(again, got.zero.get(), *run.model, s, steps);
    expect_recovered(twice, state, params, steps, what + ", rank 2 left, then rank 0");
  }
  DdpOptions options{.bucket_cap_mb = s.cap_mb, .first_bucket_mb = std::min(1.0, s.cap_mb)};
  options.zero_stage = s.stage;
  on.ddp = std::make_unique<DistributedDataParallel>(on.model, group, options);
  std::unique_ptr<ZeroOptimizer> next = std::move(got.zero);
  if (s.stage == 2) next->attach(*on.ddp);
  train_steps(*on.ddp, *next, s, kZeroSteps / 2, kZeroSteps);
  const SafetensorsFile want = load_safetensors(reference);
  for (const auto& [name, p] : on.model->named_parameters()) {
    const double d = max_abs_diff(p, want.at(name));
    require(d <= 1e-5, fmt::format("{}: after going on at 3 ranks '{}' differs from the run that "
                                   "never stopped by {}",
                                   what, name, d));
  }
}

void run_replicas(const Setup& s) {
  const std::string dir = testing::TempDir() + "/" + unique_run_id();
  std::filesystem::create_directories(dir);
  const std::string reference = dir + "/ddp.safetensors";
  auto results = spawn_ranks(4, [&](int rank, int size) {
    Setup plain = s;
    plain.stage = 0;
    Trained run = make_run(make_backend("shm", rank, size, {.timeout = 30s}), plain);
    train_steps(*run.ddp, *run.opt, plain, 0, kZeroSteps);
    if (rank == 0) save_safetensors(reference, run.model->named_parameters());
    return 0;
  });
  for (const RankResult& r : results) ASSERT_TRUE(r.ok()) << r.describe();
  results = spawn_ranks(4, [&](int rank, int size) {
    check_replicas(rank, size, s, reference);
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  std::filesystem::remove_all(dir);
}

TEST(ZeroReplicas, StageOneClippedRecoversFromTheRanksLeft) {
  run_replicas({.stage = 1, .clip = 0.5});
}
TEST(ZeroReplicas, StageTwoRecoversFromTheRanksLeft) {
  // Rounds of about 520 elements: recovery moves the 3 x 4805 elements of
  // parameters and state in rounds that cross shards and buffers.
  run_replicas({.stage = 2, .cap_mb = 0.002});
}
TEST(ZeroReplicas, SgdMomentumStageOneRecoversFromTheRanksLeft) {
  run_replicas({.stage = 1, .sgd = true});
}
TEST(ZeroReplicas, ByParametersStageTwoRecoversFromTheRanksLeft) {
  run_replicas({.stage = 2, .cap_mb = 0.002, .by_parameters = true});
}

// An update caught in its commit: rank 3 leaves after its backward of step K+1
// (and the clipping), so ranks 0-2 enter the commit and fail in it. recover()
// over ranks 0-2 finishes their updates when the group says step K+1 counts --
// the state and parameters of a run that took K+1 steps, bit for bit, rank 3's
// shard from rank 2's replica -- and drops them when it does not (the state
// after K steps); each call first undoes what the one before applied.
void check_pending(int rank, int size, const std::string& after) {
  const Setup s{.stage = 1, .clip = 0.5, .replicas = 2};
  constexpr int kSteps = kZeroSteps / 2;
  Trained run = make_run(make_backend("shm", rank, size, {.timeout = 30s}), s);
  auto& zero = dynamic_cast<ZeroOptimizer&>(*run.opt);
  train_steps(*run.ddp, zero, s, 0, kSteps);
  zero.gather_state();
  nn::NamedTensors before;
  for (const auto& [name, t] : zero.state()) before.emplace_back(name, t.clone());
  std::vector<Tensor> params_before;
  for (const Tensor& p : run.model->parameters()) params_before.push_back(p.clone());
  // Step kSteps + 1 up to the commit.
  zero.zero_grad(true);
  const Batch b = shard_of(size, rank, kSteps, 0);
  run.ddp->backward(cross_entropy((*run.ddp)(b.x), b.labels));
  zero.clip_grad_norm(s.clip);
  if (rank == 3) return;  // it leaves
  try {
    zero.step();
    require(false, fmt::format("rank {}: step() went through without rank 3", rank));
  } catch (const CommError&) {
  }
  require(zero.steps() == kSteps,
          fmt::format("rank {}: {} steps after a failed commit", rank, zero.steps()));
  // What a run that took the step holds (the first spawn saved it).
  const SafetensorsFile file = load_safetensors(after);
  nn::NamedTensors counted;
  for (const auto& [name, t] : before) counted.emplace_back(name, file.at("optimizer." + name));
  std::vector<Tensor> params_counted;
  for (const auto& [name, p] : run.model->named_parameters())
    params_counted.push_back(file.at(name));
  auto group = subgroup("-pending", {0, 1, 2}, rank);
  const std::string what = fmt::format("rank {}, an update caught in its commit", rank);
  Recovered got = recover_into(group, &zero, *run.model, s, kSteps + 1);
  expect_recovered(got, counted, params_counted, kSteps + 1, what + ", the step counting");
  got = recover_into(group, &zero, *run.model, s, kSteps);
  expect_recovered(got, before, params_before, kSteps,
                   what + ", the step not counting (after it counted)");
  got = recover_into(group, &zero, *run.model, s, kSteps + 1);
  expect_recovered(got, counted, params_counted, kSteps + 1, what + ", the step counting again");
}

TEST(ZeroReplicas, UpdateCaughtInItsCommitIsFinishedOrDropped) {
  const std::string dir = testing::TempDir() + "/" + unique_run_id();
  std::filesystem::create_directories(dir);
  const std::string after = dir + "/after.safetensors";
  auto results = spawn_ranks(4, [&](int rank, int size) {
    const ddp::test::Setup s{.stage = 1, .clip = 0.5, .replicas = 2};
    Trained run = make_run(make_backend("shm", rank, size, {.timeout = 30s}), s);
    train_steps(*run.ddp, *run.opt, s, 0, kZeroSteps / 2 + 1);
    save_gathered(after, run, rank);
    return 0;
  });
  for (const RankResult& r : results) ASSERT_TRUE(r.ok()) << r.describe();
  results = spawn_ranks(4, [&](int rank, int size) {
    check_pending(rank, size, after);
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
  std::filesystem::remove_all(dir);
}

TEST(ZeroReplicas, RefusedAtStageThree) {
  auto model = tiny_mlp(1, kHidden);
  try {
    ZeroOptimizer zero(inner_optimizer(*model, false), make_local_communicator(),
                       {.stage = 3, .replicas = 2});
    ADD_FAILURE() << "replicas 2 at stage 3 was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("replicas 2 at stage 3; valid: 1, or 2 at stages 1 and 2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp::test
