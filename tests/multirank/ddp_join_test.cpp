// Join (collectives/ddp/join.h) in forked ranks with different numbers of steps:
// every rank finishes, and every synchronized gradient is the closed-form sum
// over the ranks that still train divided by the world size or by their count
// (Note [join] in join.cpp); joined ranks see the same average while they
// shadow; at the end every rank holds the last joiner's model. Also gradient
// accumulation under no_sync(), many buckets, the bucket rebuild with a rank
// that joins before the first step, a comm hook, buffers, unused parameters,
// gradient_as_bucket_view, gloo, and misuse.
//
// The model (Note [join closed form]): parameters a and b of 4 elements (b
// registered first, so the plan holds two parameters); forward(x) = a * x +
// 2 b * x with x of 4 elements, loss = sum, so rank r's gradient at step s is
// a: x_r(s), b: 2 x_r(s), whatever the weights. With find_unused, rank r leaves
// a out (forward = 2 b * x, a's gradient 0) at the steps s where r + s is odd.
// With SGD without momentum the final weights are the initial ones minus lr
// times the sum of the averages.
#include "collectives/ddp/distributed_data_parallel.h"
#include "collectives/ddp/join.h"
#include "collectives/ddp/reducer.h"
#include "runtime/autograd/autograd.h"
#include "runtime/autograd/functions.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/multirank/conformance.h"
#include "tests/multirank/spawn.h"

#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>

namespace ddp::test {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kN = 4;
constexpr float kLr = 0.5f;
constexpr double kRelTol = 1e-6;  // float32 sums of quarters, divided by W or n

class ClosedForm : public nn::Module {
 public:
  explicit ClosedForm(bool with_buffer) {
    b_ = register_parameter("b", from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f}, {kN}));
    a_ = register_parameter("a", from_vector<float>({1.0f, 2.0f, -3.0f, 4.0f}, {kN}));
    if (with_buffer) register_buffer("tag", zeros({1}));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor twice_b = functional::scale(functional::mul(b_, x), 2);
    return use_a ? functional::add(functional::mul(a_, x), twice_b) : twice_b;
  }
  bool use_a = true;
  std::string name() const override { return "ClosedForm"; }
  Tensor param(const char* n) const { return own_parameter(n); }
  Tensor tag() const { return own_buffer("tag"); }

 private:
  Tensor a_, b_;
};

// Rank r's input at step s, micro-batch m: quarters, so every sum is exact.
std::vector<double> input(int rank, int step, int micro) {
  const double r = rank + 1, s = step + 1, m = micro + 1;
  return {r * s * 0.25, -r - m, s * 0.5 + m, 0.25 * r * m - s};
}

struct JoinCase {
  std::string backend = "shm";
  std::vector<int> steps;  // per rank
  bool divide_by_world = true;
  int micro_batches = 1;
  bool step_when_joined = false;  // after_shadow_step runs the optimizer
  bool tiny_buckets = false;      // one bucket per parameter
  CommHook hook = CommHook::none;
  bool buffer = false;
  bool find_unused = false;  // a unused where rank + step is odd
  bool bucket_view = false;  // DdpOptions::gradient_as_bucket_view (as train)
  double rel_tol = kRelTol;
};

bool uses_a(const JoinCase& c, int rank, int step) {
  return !c.find_unused || (rank + step) % 2 == 0;
}

struct Grads {
  std::vector<double> a, b;
};

// The average of step s over the ranks that still train.
Grads expected_grad(const JoinCase& c, int world, int step) {
  Grads g{std::vector<double>(kN, 0.0), std::vector<double>(kN, 0.0)};
  int active = 0;
  for (int q = 0; q < world; ++q) {
    if (c.steps[static_cast<size_t>(q)] <= step) continue;
    ++active;
    for (int m = 0; m < c.micro_batches; ++m) {
      const auto x = input(q, step, m);
      for (int64_t i = 0; i < kN; ++i) {
        if (uses_a(c, q, step)) g.a[i] += x[i];
        g.b[i] += 2 * x[i];
      }
    }
  }
  const double divisor = c.divide_by_world ? world : active;
  for (double& v : g.a) v /= divisor;
  for (double& v : g.b) v /= divisor;
  return g;
}

void expect_near(const Tensor& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  const auto v = got.to_vector<float>();
  double most = 0;
  for (double w : want) most = std::max(most, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    require(std::abs(v[i] - want[i]) <= tol * std::max(most, 1.0),
            fmt::format("{}: element {} is {}, expected {} (all: {} vs {})", what, i, v[i], want[i],
                        fmt::join(v, ", "), fmt::join(want, ", ")));
  }
}

void check_grads(const JoinCase& c, const ClosedForm& model, int rank, int world, int step,
                 const char* when) {
  const Grads g = expected_grad(c, world, step);
  const std::string what = fmt::format("rank {} step {} ({})", rank, step, when);
  expect_near(grad(model.param("a")), g.a, c.rel_tol, what + ": .grad of a");
  expect_near(grad(model.param("b")), g.b, c.rel_tol, what + ": .grad of b");
}

void train_rank(const JoinCase& c, DistributedDataParallel& ddp, ClosedForm& model, optim::SGD& sgd,
                int rank) {
  const int world = ddp.comm()->size();
  for (int s = 0; s < c.steps[static_cast<size_t>(rank)]; ++s) {
    sgd.zero_grad(true);
    model.use_a = uses_a(c, rank, s);
    for (int m = 0; m < c.micro_batches; ++m) {
      if (c.buffer) {
        Tensor tag = model.tag();
        fill_(tag, 10.0 * rank + s);
      }
      const auto x = input(rank, s, m);
      const Tensor xt = from_vector<float>(std::vector<float>(x.begin(), x.end()), {kN});
      Tensor out;
      if (m + 1 < c.micro_batches) {
        auto guard = ddp.no_sync();
        out = ddp(xt);
      } else {
        out = ddp(xt);
      }
      if (c.buffer && m + 1 == c.micro_batches) {
        // The highest rank that still trains at step s broadcast its tag.
        int h = 0;
        for (int q = 0; q < world; ++q) h = c.steps[static_cast<size_t>(q)] > s ? q : h;
        expect_near(model.tag(), {10.0 * h + s}, 0, fmt::format("rank {} step {} tag", rank, s));
      }
      ddp.backward(functional::sum(out));
    }
    check_grads(c, model, rank, world, s, "training");
    sgd.step();
  }
}

int join_body(const JoinCase& c, int rank, int world) {
  require(static_cast<int>(c.steps.size()) == world, "one step count per rank");
  auto comm = make_backend(c.backend, rank, world, {.timeout = 30s});
  auto model = std::make_shared<ClosedForm>(c.buffer);
  DdpOptions options;
  options.comm_hook = c.hook;
  if (c.tiny_buckets) options.bucket_cap_mb = options.first_bucket_mb = 1e-6;
  options.find_unused_parameters = c.find_unused;
  options.gradient_as_bucket_view = c.bucket_view;
  DistributedDataParallel ddp(model, comm, options);
  optim::SGD sgd(model->parameters(), {.lr = kLr, .momentum = 0.0f});
  const auto a0 = model->param("a").to_vector<float>();
  const auto b0 = model->param("b").to_vector<float>();
  const int mine = c.steps[static_cast<size_t>(rank)];
  const int most = *std::max_element(c.steps.begin(), c.steps.end());
  int shadowed = 0;
  JoinOptions join_options;
  join_options.divide_by_initial_world_size = c.divide_by_world;
  join_options.after_shadow_step = [&] {
    const int s = mine + shadowed++;
    check_grads(c, *model, rank, world, s, "shadowed");
    if (c.buffer) {
      int h = 0;
      for (int q = 0; q < world; ++q) h = c.steps[static_cast<size_t>(q)] > s ? q : h;
      expect_near(model->tag(), {10.0 * h + s}, 0, fmt::format("rank {} shadow {} tag", rank, s));
    }
    if (c.step_when_joined) sgd.step();
  };
  Join join(ddp, join_options);
  train_rank(c, ddp, *model, sgd, rank);
  join.finish();
  require(join.shadowed_steps() == most - mine && shadowed == most - mine,
          fmt::format("rank {}: shadowed {} steps (callback {}), expected {}", rank,
                      join.shadowed_steps(), shadowed, most - mine));
  int last = 0;
  for (int q = 0; q < world; ++q) last = c.steps[static_cast<size_t>(q)] == most ? q : last;
  require(join.authoritative_rank() == last,
          fmt::format("rank {}: the final model came from rank {}, expected the last joiner {}",
                      rank, join.authoritative_rank(), last));
  // Every rank holds the last joiner's weights: the initial ones minus lr x the averages.
  std::vector<double> a(a0.begin(), a0.end()), b(b0.begin(), b0.end());
  for (int s = 0; s < most; ++s) {
    const Grads g = expected_grad(c, world, s);
    for (int64_t i = 0; i < kN; ++i) a[i] -= kLr * g.a[i], b[i] -= kLr * g.b[i];
  }
  expect_near(model->param("a"), a, c.rel_tol, fmt::format("rank {}: final a", rank));
  expect_near(model->param("b"), b, c.rel_tol, fmt::format("rank {}: final b", rank));
  if (c.buffer) {
    expect_near(model->tag(), {10.0 * last + (c.steps[static_cast<size_t>(last)] - 1)}, 0,
                fmt::format("rank {}: final tag", rank));
  }
  return 0;
}

void run_join(int world, const JoinCase& c) {
  const auto results = spawn_ranks(
      world, [&](int rank, int size) { return join_body(c, rank, size); }, {.timeout = 60s});
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

TEST(DdpJoin, TwoRanksDivideByWorld) {
  run_join(2, {.steps = {5, 3}});
}
TEST(DdpJoin, ThreeRanksDivideByWorld) {
  run_join(3, {.steps = {4, 6, 2}});
}
TEST(DdpJoin, ThreeRanksDivideByActive) {
  run_join(3, {.steps = {4, 6, 2}, .divide_by_world = false});
}
TEST(DdpJoin, JoinedRanksStepTheOptimizer) {
  run_join(3, {.steps = {2, 5, 3}, .step_when_joined = true});
}
TEST(DdpJoin, EvenInputsJoinTogether) {
  run_join(2, {.steps = {3, 3}});
}
TEST(DdpJoin, NoSyncAccumulation) {
  run_join(3, {.steps = {3, 1, 4}, .divide_by_world = false, .micro_batches = 3});
}
// Rank 1 joins before any step: it shadows the first backward and the bucket
// rebuild that follows it; rank 0 trains fewer steps than rank 2.
TEST(DdpJoin, RankWithoutStepsShadowsTheRebuildManyBuckets) {
  run_join(3, {.steps = {2, 0, 3}, .tiny_buckets = true});
}
// Rank 0 joins first: the rebuilt order it broadcasts is its unobserved default.
TEST(DdpJoin, RankZeroWithoutStepsManyBuckets) {
  run_join(2, {.steps = {0, 3}, .divide_by_world = false, .tiny_buckets = true});
}
// A comm hook runs on a joined rank's zeros too (fp16 holds these quarters exactly).
TEST(DdpJoin, CompressionHook) {
  run_join(2, {.steps = {2, 4}, .hook = CommHook::fp16, .rel_tol = 1e-3});
}
// Buffers come from the highest rank that still trains, and at the end from the last joiner.
TEST(DdpJoin, BuffersFromTheHighestTrainingRank) {
  run_join(3, {.steps = {4, 2, 3}, .buffer = true});
}
// A parameter without a gradient on some ranks (find_unused) holds bucket 0 (the
// only one) back until finish_backward launches it, and with it the count: the
// scale W / n must come from this step's count, on training and joined ranks.
TEST(DdpJoin, FindUnusedDivideByActive) {
  run_join(3, {.steps = {2, 5, 3}, .divide_by_world = false, .find_unused = true});
}
// As train runs it: every .grad a view into its bucket; joined ranks step too.
TEST(DdpJoin, GradientAsBucketViewManyBuckets) {
  run_join(
      3, {.steps = {3, 1, 4}, .step_when_joined = true, .tiny_buckets = true, .bucket_view = true});
}
TEST(DdpJoin, GradientAsBucketViewFindUnusedAccumulation) {
  run_join(2, {.steps = {4, 2},
               .divide_by_world = false,
               .micro_batches = 2,
               .find_unused = true,
               .bucket_view = true});
}
TEST(DdpJoinGloo, ThreeRanks) {
  run_join(3, {.backend = "gloo", .steps = {3, 1, 2}, .divide_by_world = false});
}
TEST(DdpJoinGloo, TwoRanksAccumulationManyBuckets) {
  run_join(2, {.backend = "gloo", .steps = {1, 3}, .micro_batches = 2, .tiny_buckets = true});
}

// Without a Join the same uneven loop cannot finish: the rank with more steps
// waits in a bucket all_reduce its peer never issues and gets a CommError at the
// communicator's timeout (what the Join is for).
TEST(DdpJoin, WithoutJoinUnevenStepsFail) {
  const auto results = spawn_ranks(2, [](int rank, int world) {
    auto comm = make_backend("shm", rank, world, {.timeout = 2s});
    auto model = std::make_shared<ClosedForm>(false);
    DistributedDataParallel ddp(model, comm);
    const Tensor x = from_vector<float>({1, 2, 3, 4}, {kN});
    try {
      for (int s = 0; s < 2 + rank; ++s) ddp.backward(functional::sum(ddp(x)));
    } catch (const CommError&) {
      return rank == 1 ? 0 : 1;
    }
    return rank == 0 ? 0 : 1;  // rank 0 ran out and returned
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

// A model without trainable parameters: no bucket, so no count would ever go.
class NoParameters : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string name() const override { return "NoParameters"; }
};

// Misuse, on one rank (the local communicator): a synchronized forward after
// joining, finish() twice, a second Join on the same model, a Join created
// during a backward, on a model without trainable parameters, and finished
// after its model was destroyed; shadowing during a backward; a disabled Join.
TEST(DdpJoin, MisuseIsNamed) {
  const auto results = spawn_ranks(1, [](int rank, int world) {
    auto comm = make_backend("local", rank, world, {});
    auto model = std::make_shared<ClosedForm>(false);
    DistributedDataParallel ddp(model, comm);
    const Tensor x = from_vector<float>({1, 2, 3, 4}, {kN});
    auto expect_error = [](const std::function<void()>& f, const std::string& text) {
      try {
        f();
      } catch (const ValueError& e) {
        require(std::string(e.what()).find(text) != std::string::npos,
                fmt::format("expected '{}' in: {}", text, e.what()));
        return;
      }
      require(false, "no ValueError; expected one saying: " + text);
    };
    {
      Join join(ddp);
      expect_error([&] { Join second(ddp); }, "already has a Join attached");
      ddp.backward(functional::sum(ddp(x)));
      require(!join.shadow_step(), "shadow_step on the only rank: nobody else trains");
      expect_error([&] { ddp(x); }, "ran a synchronized forward after it joined");
      {
        NoGradGuard no_grad;
        ddp(x);  // not synchronized: allowed
      }
      join.finish();
      require(join.finished() && join.authoritative_rank() == 0, "finish on one rank");
      expect_error([&] { join.finish(); }, "Join::finish() was called twice");
    }
    ddp.backward(functional::sum(ddp(x)));   // detached: plain DDP again
    ddp::backward(functional::sum(ddp(x)));  // its finish_backward() not yet called
    expect_error([&] { Join during(ddp); }, "during a synchronized backward");
    ddp.finish_backward();
    {
      DistributedDataParallel empty(std::make_shared<NoParameters>(), comm);
      expect_error([&] { Join no_buckets(empty); }, "has no parameter that requires a gradient");
    }
    {
      auto gone =
          std::make_unique<DistributedDataParallel>(std::make_shared<ClosedForm>(false), comm);
      Join orphan(*gone);
      gone.reset();
      expect_error([&] { orphan.shadow_step(); }, "was destroyed before");
      expect_error([&] { orphan.finish(); }, "was destroyed before");
    }
    {
      // The reducer's side of shadow_step() while this rank's own backward is
      // unfinished (a Join reaches it only while other ranks train): the rank named.
      auto fresh = std::make_shared<ClosedForm>(false);
      auto reducer =
          std::make_shared<Reducer>(std::vector<Tensor>{fresh->param("a"), fresh->param("b")},
                                    std::vector<std::string>{"a", "b"}, comm, ReducerOptions{});
      reducer->install_hooks();
      reducer->prepare(true);
      ddp::backward(functional::sum((*fresh)(x)));
      expect_error([&] { reducer->shadow(1.0); },
                   "Join: rank 0 shadowed a step while its own backward is unfinished");
      reducer->finish();
    }
    JoinOptions off;
    off.enable = false;
    Join disabled(ddp, off);
    Join other(ddp);  // the disabled one never attached
    other.finish();
    require(!disabled.shadow_step() && disabled.shadowed_steps() == 0, "disabled Join");
    disabled.finish();
    return 0;
  });
  for (const RankResult& r : results) EXPECT_TRUE(r.ok()) << r.describe();
}

}  // namespace
}  // namespace ddp::test
