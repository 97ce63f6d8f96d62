// The GPT model (models/gpt.h): its tensors are gpt_tensors() by name, shape and order,
// it is causal as a whole, its loss gradient matches central finite differences for every
// parameter (the tied LM head included), GPT-2's init statistics, dropout placement,
// DataParallel replicas and the messages for bad tokens. PyTorch parity is the e2e test
// e2e.gpt_parity (models/gpt_parity.cpp, models/torch_gpt.py parity).
#include "models/gpt.h"

#include "runtime/autograd/autocast.h"
#include "runtime/autograd/functions.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/ops.h"
#include "runtime/profile.h"
#include "tests/unit/error_text.h"
#include "tests/unit/pending_gradients.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>
#include <vector>

namespace ddp::models {
namespace {

namespace F = functional;

constexpr const char* kMicro = "gpt:layers=1,d=8,heads=2,ctx=5,vocab=11";

using test_util::value_error;

std::shared_ptr<Gpt> model_of(const std::string& spec, uint64_t seed = 1) {
  Generator gen(seed);
  return make_gpt(gpt_config(spec), gen);
}

// Deterministic ids in [0, vocab): a small LCG, so tests do not depend on a corpus.
Tensor tokens_of(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> ids(static_cast<size_t>(b * t));
  uint64_t s = seed;
  for (auto& id : ids) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return from_vector(ids, {b, t});
}

// Mean next-token cross-entropy of logits [B, T, V] against targets [B, T].
Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  const int64_t n = logits.size(0) * logits.size(1);
  return F::cross_entropy(F::reshape(logits, {n, logits.size(2)}), targets.reshape({n}));
}

double std_of(const std::vector<float>& v, double* mean_out = nullptr) {
  double mean = 0, sq = 0;
  for (float x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  if (mean_out != nullptr) *mean_out = mean;
  return std::sqrt(sq / static_cast<double>(v.size()));
}

TEST(Gpt, ParametersAreGptTensorsByNameShapeAndOrder) {
  for (const char* spec : {kMicro, "gpt-tiny", "gpt:layers=3,d=12,heads=3,ctx=7,vocab=13"}) {
    const auto model = model_of(spec);
    const auto want = gpt_tensors(gpt_config(spec));
    const auto got = model->named_parameters();
    ASSERT_EQ(got.size(), want.size()) << spec;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].name) << spec << " tensor " << i;
      EXPECT_EQ(got[i].second.shape(), Shape(want[i].shape)) << spec << " " << want[i].name;
    }
    EXPECT_EQ(model->num_parameters(), parameter_count(gpt_config(spec))) << spec;
    EXPECT_TRUE(model->named_buffers().empty()) << spec;
  }
}

TEST(Gpt, ForwardGivesLogitsForEveryPositionAndShorterSequencesWork) {
  const auto model = model_of("gpt-tiny");
  for (int64_t t : {int64_t{1}, int64_t{17}, int64_t{64}}) {
    const Tensor logits = model->forward(tokens_of(3, t, 256, 5));
    ASSERT_EQ(logits.shape(), Shape({3, t, 256})) << "T = " << t;
    for (float v : logits.to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
  }
}

// The positions made once per (batch, T) stay right when the shape changes back and
// forth: logits equal those of a fresh model that never saw another shape.
TEST(Gpt, PositionsFollowTheBatchShape) {
  const auto model = model_of("gpt-tiny");
  const Tensor a = tokens_of(2, 9, 256, 3), b = tokens_of(3, 5, 256, 4);
  for (const Tensor* tokens : {&a, &b, &a, &b}) {
    EXPECT_EQ(model->forward(*tokens).to_vector<float>(),
              model_of("gpt-tiny")->forward(*tokens).to_vector<float>())
        << shape_str(tokens->shape());
  }
}

// Changing the tokens after position `cut` leaves the logits at positions <= cut bit for
// bit unchanged, and the loss at position `cut` sends no gradient to wpe rows > cut.
TEST(Gpt, TheModelIsCausal) {
  const auto model = model_of("gpt:layers=2,d=16,heads=4,ctx=8,vocab=19");
  const int64_t b = 2, t = 8, cut = 3, v = 19;
  const Tensor tokens = tokens_of(b, t, v, 7);
  auto ids = tokens.to_vector<int64_t>();
  for (size_t i = 0; i < ids.size(); ++i)
    if (static_cast<int64_t>(i) % t > cut) ids[i] = (ids[i] + 5) % v;
  const auto a = model->forward(tokens).to_vector<float>();
  const auto c = model->forward(from_vector(ids, {b, t})).to_vector<float>();
  int64_t later_differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(i) / v % t;
    if (pos <= cut) {
      ASSERT_EQ(a[i], c[i]) << "logit " << i << " at position " << pos;
    } else {
      later_differ += a[i] != c[i];
    }
  }
  EXPECT_GT(later_differ, 0) << "changed tokens must change later logits";

  std::vector<float> pick(a.size(), 0.0f);
  for (size_t i = 0; i < pick.size(); ++i)
    pick[i] = static_cast<int64_t>(i) / v % t == cut ? 1.0f : 0.0f;
  const Tensor logits = model->forward(tokens);
  backward(F::sum(F::mul(logits, from_vector(pick, logits.shape()))));
  const auto named = model->named_parameters();
  const auto wpe_grad = grad(named[1].second).to_vector<float>();
  const int64_t d = named[1].second.size(1);
  double before = 0;
  for (size_t i = 0; i < wpe_grad.size(); ++i) {
    if (static_cast<int64_t>(i) / d > cut) {
      EXPECT_EQ(wpe_grad[i], 0.0f) << "wpe row " << i / d;
    } else {
      before += std::fabs(wpe_grad[i]);
    }
  }
  EXPECT_GT(before, 0.0);
}

// Moves every parameter to a generic point (GPT-2's init makes logits tiny and many
// gradients near 0, which would make the finite-difference check weak).
void randomize(const nn::Module& model, uint64_t seed) {
  uint64_t k = 0;
  for (auto [name, p] : model.named_parameters()) {
    Tensor r = scale(randn(p.shape(), seed + k++), 0.3f);
    if (name.find(".ln_") != std::string::npos && name.find(".weight") != std::string::npos) {
      r = add(r, ones(p.shape()));
    }
    copy_(p, r);
  }
}

// Central differences of the loss (f32, step 1e-2) against autograd for the first,
// middle and last element of every parameter. The f32 rounding of a loss near 2.5 over
// a step of 2e-2 is about 1e-5, the truncation error O(h^2); the tolerance
// 3e-4 + 2% is far below the gradients checked (see the count of large ones).
TEST(Gpt, LossGradientMatchesFiniteDifferencesForEveryParameter) {
  const auto model = model_of(kMicro);
  randomize(*model, 100);
  const Tensor tokens = tokens_of(2, 5, 11, 3), targets = tokens_of(2, 5, 11, 4);
  model->zero_grad(true);
  backward(lm_loss(model->forward(tokens), targets));
  NoGradGuard no_grad;
  const double h = 1e-2;
  int64_t large = 0, checked = 0;
  for (auto [name, p] : model->named_parameters()) {
    const auto analytic = grad(p).to_vector<float>();
    const int64_t n = p.numel();
    for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
      auto values = p.to_vector<float>();
      const float x0 = values[static_cast<size_t>(i)];
      auto loss_at = [&](float x) {
        values[static_cast<size_t>(i)] = x;
        copy_(p, from_vector(values, p.shape()));
        return static_cast<double>(lm_loss(model->forward(tokens), targets).item<float>());
      };
      const double numeric =
          (loss_at(x0 + static_cast<float>(h)) - loss_at(x0 - static_cast<float>(h))) / (2 * h);
      loss_at(x0);
      const double a = analytic[static_cast<size_t>(i)];
      EXPECT_NEAR(a, numeric, 3e-4 + 2e-2 * std::fabs(numeric)) << name << " element " << i;
      large += std::fabs(numeric) > 1e-2;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * static_cast<int64_t>(gpt_tensors(gpt_config(kMicro)).size()));
  EXPECT_GT(large, checked / 2) << "most checked gradients must be well above the tolerance";
}

// The LM head is wte: a token that never appears in the batch still gets a gradient
// in its wte row, from the head alone (the finite-difference test checks its value).
TEST(Gpt, TheLmHeadIsTiedToTheTokenEmbedding) {
  const auto model = model_of(kMicro);
  const Tensor tokens = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5}, {1, 5});
  backward(lm_loss(model->forward(tokens), tokens));
  const auto g = grad(model->named_parameters()[0].second).to_vector<float>();
  double unused_row = 0;
  for (int64_t j = 0; j < 8; ++j) unused_row += std::fabs(g[static_cast<size_t>(10 * 8 + j)]);
  EXPECT_GT(unused_row, 0.0) << "wte row 10 (no input token) must get the head's gradient";
}

// Note [classifier gradient in place]: under bf16 autocast the model's logits, dropped
// after the loss as train and bench gpt do, take their own gradient: the backward makes
// one tensor fewer (the [N, V] gradient) than a step that keeps its logits, and the
// gradients are the same.
TEST(Gpt, TheLossBackwardWritesOverLogitsNobodyKeeps) {
  const std::string spec = "gpt:layers=1,d=8,heads=2,ctx=32,vocab=4096";
  const Tensor tokens = tokens_of(4, 32, 4096, 5), targets = tokens_of(4, 32, 4096, 6);
  struct Step {
    std::vector<float> grads;
    uint64_t allocations = 0;  // tensors the backward made
  };
  const auto step = [&](bool keep_logits) {
    const auto model = model_of(spec);
    Tensor logits, loss;
    {
      const AutocastGuard autocast(DType::bf16, true);
      logits = model->forward(tokens);
      loss = lm_loss(logits, targets);
    }
    if (!keep_logits) logits = Tensor();
    const uint64_t before = memory_stats(Device::cpu()).num_allocs;
    backward(loss);
    Step s;
    s.allocations = memory_stats(Device::cpu()).num_allocs - before;
    for (const auto& [name, p] : model->named_parameters()) {
      for (float v : grad(p).to_vector<float>()) s.grads.push_back(v);
    }
    return s;
  };
  const Step kept = step(true), dropped = step(false);
  EXPECT_EQ(dropped.grads, kept.grads);
  EXPECT_EQ(dropped.allocations + 1, kept.allocations)
      << "the loss's backward allocated a gradient for logits nobody kept";
}

// Note [padded head]: a config with padded_vocab is the same model (the same
// parameters from the same seed), its logits wider by columns of -inf; the loss and
// every parameter's gradient are the unpadded model's, in f32 and under bf16 autocast.
TEST(Gpt, APaddedHeadGivesTheUnpaddedModelsLossAndGradients) {
  const std::string spec = "gpt:layers=1,d=8,heads=2,ctx=5,vocab=11";
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    const auto plain = model_of(spec), padded = model_of(spec + ",padded_vocab=24");
    randomize(*plain, 100);
    randomize(*padded, 100);
    const Tensor tokens = tokens_of(2, 5, 11, 3), targets = tokens_of(2, 5, 11, 4);
    Tensor want_logits, got_logits, want_loss, got_loss;
    {
      const AutocastGuard autocast(DType::bf16, bf16);
      want_logits = plain->forward(tokens);
      got_logits = padded->forward(tokens);
      want_loss = lm_loss(want_logits, targets);
      got_loss = lm_loss(got_logits, targets);
    }
    ASSERT_EQ(got_logits.shape(), (Shape{2, 5, 24}));
    const auto w = cast(want_logits, DType::f32).to_vector<float>();
    const auto g = cast(got_logits, DType::f32).to_vector<float>();
    for (int64_t row = 0; row < 10; ++row) {
      for (int64_t j = 0; j < 24; ++j) {
        const float v = g[static_cast<size_t>(row * 24 + j)];
        if (j < 11) {
          // The same product, summed by a BLAS kernel that may order a row of 24
          // columns' sums apart from one of 11: a few ulps (x86-64 Haswell, Zen kernels).
          const float e = w[static_cast<size_t>(row * 11 + j)];
          ASSERT_NEAR(v, e, 1e-6 * (1 + std::fabs(e))) << "row " << row << " column " << j;
        } else {
          ASSERT_TRUE(std::isinf(v) && v < 0) << "padding column " << j << " is " << v;
        }
      }
    }
    EXPECT_NEAR(got_loss.item<float>(), want_loss.item<float>(), 1e-6);
    backward(want_loss);
    backward(got_loss);
    const auto a = plain->named_parameters(), b = padded->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
      const auto ga = grad(a[i].second).to_vector<float>(),
                 gb = grad(b[i].second).to_vector<float>();
      for (size_t k = 0; k < ga.size(); ++k) {
        ASSERT_NEAR(gb[k], ga[k], 1e-6 + 1e-5 * std::fabs(ga[k])) << a[i].first << " element " << k;
      }
    }
  }
  EXPECT_NE(value_error([] {
              Generator gen(1);
              const Tensor w = randn({11, 8}, 1), x = randn({3, 8}, 2);
              return F::lm_head(x, w, 10);
            }).find("lm_head: 10 columns for a weight of 11 rows"),
            std::string::npos);
}

// Note [accumulating into a pending gradient]: each LayerNorm adds x's gradient into
// the residual stream's waiting one (ln_1 and ln_2 of every layer), so a step runs
// 2 x layers fewer adds, and every gradient keeps its bits; f32 and bf16 autocast.
TEST(Gpt, LayerNormsAddIntoTheResidualGradientWithTheBitsOfTheAdds) {
  const std::string spec = "gpt:layers=3,d=16,heads=2,ctx=6,vocab=13";
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    std::vector<std::vector<Tensor>> grads;
    std::vector<int64_t> adds;
    for (const bool pending : {false, true}) {
      const test_util::PendingGradients switch_(pending);
      const auto model = model_of(spec);
      randomize(*model, 100);
      const Tensor tokens = tokens_of(2, 6, 13, 3), targets = tokens_of(2, 6, 13, 4);
      Tensor loss;
      {
        const AutocastGuard autocast(DType::bf16, bf16);
        loss = lm_loss(model->forward(tokens), targets);
      }
      profile::start();
      backward(loss);
      const profile::Report report = profile::stop();
      int64_t binary = 0;
      for (const profile::OpTime& t : report.by_op()) {
        if (t.op == "binary") binary += t.calls;
      }
      adds.push_back(binary);
      std::vector<Tensor> g;
      for (const auto& [name, p] : model->named_parameters()) g.push_back(grad(p));
      grads.push_back(std::move(g));
    }
    EXPECT_EQ(adds[0] - adds[1], 2 * 3) << "adds without " << adds[0] << ", with " << adds[1];
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i) {
      const auto a = grads[0][i].to_vector<float>(), b = grads[1][i].to_vector<float>();
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        ASSERT_EQ(std::bit_cast<uint32_t>(a[k]), std::bit_cast<uint32_t>(b[k]))
            << "parameter " << i << " element " << k;
      }
    }
  }
}

TEST(Gpt, InitIsGpt2s) {
  const GptConfig c = gpt_config("gpt:layers=4,d=128,heads=4,ctx=64,vocab=512");
  Generator gen(11);
  const auto model = make_gpt(c, gen);
  const double residual = 0.02 / std::sqrt(2.0 * 4);
  for (const auto& [name, p] : model->named_parameters()) {
    const auto v = p.to_vector<float>();
    const bool is_bias = name.ends_with(".bias"), is_ln = name.find(".ln_") != std::string::npos;
    if (is_bias || is_ln) {
      const float want = is_bias ? 0.0f : 1.0f;
      for (float x : v) ASSERT_EQ(x, want) << name;
      continue;
    }
    double mean = 0;
    const double sd = std_of(v, &mean);
    const double want = name.ends_with("c_proj.weight") ? residual : 0.02;
    EXPECT_NEAR(sd, want, 0.03 * want) << name;
    EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(static_cast<double>(v.size()))) << name;
  }
  // Each weight draws its own counters: no two weights are the same numbers.
  const auto named = model->named_parameters();
  EXPECT_NE(named[0].second.to_vector<float>()[0], named[1].second.to_vector<float>()[0]);
  Generator same(11), other(12);
  EXPECT_EQ(make_gpt(c, same)->named_parameters()[4].second.to_vector<float>(),
            named[4].second.to_vector<float>());
  EXPECT_NE(make_gpt(c, other)->named_parameters()[4].second.to_vector<float>(),
            named[4].second.to_vector<float>());
}

TEST(Gpt, DecayGroupsAreTheMatricesAndTheRest) {
  const auto model = model_of("gpt:layers=2,d=8,heads=2,ctx=5,vocab=11");
  const auto groups = decay_groups(*model);
  // wte, wpe and 4 Linear weights per layer decay; 4 LayerNorm tensors and 4 biases per
  // layer and ln_f's two do not.
  EXPECT_EQ(groups.decay.size(), 2u + 4 * 2);
  EXPECT_EQ(groups.no_decay.size(), 8u * 2 + 2);
  for (const Tensor& t : groups.decay) EXPECT_EQ(t.dim(), 2);
  for (const Tensor& t : groups.no_decay) EXPECT_EQ(t.dim(), 1);
  EXPECT_TRUE(groups.decay.front().is_same(model->named_parameters()[0].second));
}

TEST(Gpt, DropoutActsInTrainingOnlyAndZeroDropoutIsNone) {
  const auto with = model_of("gpt:layers=1,d=8,heads=2,ctx=5,vocab=11,dropout=0.5", 3);
  const auto without = model_of(kMicro, 3);
  const Tensor tokens = tokens_of(2, 5, 11, 9);
  const auto plain = without->forward(tokens).to_vector<float>();
  EXPECT_EQ(without->forward(tokens).to_vector<float>(), plain);  // training, p = 0
  const auto a = with->forward(tokens).to_vector<float>();
  const auto b = with->forward(tokens).to_vector<float>();
  EXPECT_NE(a, plain);
  EXPECT_NE(a, b) << "each training forward draws new masks";
  with->eval();
  EXPECT_EQ(with->forward(tokens).to_vector<float>(), plain) << "eval: no dropout";
}

TEST(Gpt, ReplicaComputesTheSameLogits) {
  const auto model = model_of(kMicro);
  std::vector<Tensor> params;
  for (const auto& [name, p] : model->named_parameters()) params.push_back(p.clone());
  const auto replica = model->replicate(params, {});
  const Tensor tokens = tokens_of(2, 4, 11, 2);
  EXPECT_EQ(replica->forward(tokens).to_vector<float>(), model->forward(tokens).to_vector<float>());
  EXPECT_EQ(replica->named_parameters()[2].first, "transformer.h.0.ln_1.weight");
}

TEST(Gpt, BadTokensNameTheValueAndTheFix) {
  const auto model = model_of(kMicro);
  std::string msg = value_error([&] { model->forward(randn({2, 3}, 1)); });
  EXPECT_NE(msg.find("int64 tensor [batch, T], got f32 [2, 3]"), std::string::npos) << msg;
  msg = value_error([&] { model->forward(tokens_of(1, 5, 11, 1).reshape({5})); });
  EXPECT_NE(msg.find("got i64 [5]"), std::string::npos) << msg;
  msg = value_error([&] { model->forward(tokens_of(1, 6, 11, 1)); });
  EXPECT_NE(msg.find("T = 6 (tokens [1, 6]) is outside [1, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("larger ctx"), std::string::npos) << msg;
  msg = value_error([&] { model->forward(from_vector(std::vector<int64_t>{1, 11}, {1, 2})); });
  EXPECT_NE(msg.find("token id 11 at [0, 1] is outside the vocabulary [0, 11)"), std::string::npos)
      << msg;
  msg = value_error([&] { model->forward(from_vector(std::vector<int64_t>{-1}, {1, 1})); });
  EXPECT_NE(msg.find("token id -1 at [0, 0]"), std::string::npos) << msg;
  msg = value_error([] { model_of("gpt:layers=1,d=9,heads=2,ctx=5"); });
  EXPECT_FALSE(msg.empty());
}

}  // namespace
}  // namespace ddp::models
