// The GPT-2-style transformer (models/gpt.h). The module tree mirrors nanoGPT's, so
// named_parameters() gives GPT-2's names in gpt_tensors() order:
//
//   Gpt
//     transformer: wte, wpe (Embedding), drop, h (Sequential of Block), ln_f
//       Block: ln_1, attn (c_attn, c_proj, resid_dropout), ln_2, mlp (c_fc, c_proj, dropout)
//
// Activations move between modules as [B, T, C]; each Linear sees them as [B*T, C]
// (a reshape is a view) and the attention sees c_attn's output as qkv [B, T, 3C].
#include "models/gpt.h"

#include "runtime/autograd/autocast.h"
#include "runtime/autograd/functions.h"
#include "runtime/nn/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"

#include "runtime/fmt.h"

#include <cmath>
#include <map>
#include <tuple>
#include <utility>

namespace ddp::models {
namespace {

namespace F = functional;

constexpr double kInitStd = 0.02;

// Each Dropout module draws its masks from its own Philox stream: the model's seed mixed
// with the module's index, so two dropout layers never share masks.
uint64_t dropout_seed(const Generator& gen, uint64_t index) {
  return gen.seed() ^ ((index + 1) * 0x9E3779B97F4A7C15ULL);
}

// The child `name` of `parent` as the class it was registered with.
template <typename M>
std::shared_ptr<M> typed(const std::shared_ptr<nn::Module>& child) {
  auto out = std::dynamic_pointer_cast<M>(child);
  DDP_ASSERT(out != nullptr, "gpt: child has an unexpected class");
  return out;
}

// [B, T, C] <-> [B*T, C] views for the Linear layers.
Tensor rows(const Tensor& x) {
  return F::reshape(x, {x.size(0) * x.size(1), x.size(2)});
}
Tensor unrows(const Tensor& x, int64_t b, int64_t t) {
  return F::reshape(x, {b, t, x.size(1)});
}

// The library's Embedding draws N(0, 1) from `scratch` at construction, and LayerNorm
// starts at 1 and 0; Gpt's constructor then sets every parameter to GPT-2's init, so
// the model's Generator only feeds GPT-2's draws (as for linear() below).
std::shared_ptr<nn::Embedding> embedding(int64_t rows, int64_t dim) {
  Generator scratch;
  return std::make_shared<nn::Embedding>(rows, dim, scratch);
}

// nn::Linear draws PyTorch's default init from `scratch`; Gpt's constructor then
// overwrites every weight with GPT-2's, so the model's Generator only feeds GPT-2's draws.
std::shared_ptr<nn::Linear> linear(int64_t in, int64_t out) {
  Generator scratch;
  return std::make_shared<nn::Linear>(in, out, scratch);
}

// x [B, T, C] -> [B, T, C]: c_proj(causal_self_attention(c_attn(x))), then dropout.
class SelfAttention : public nn::Cloneable<SelfAttention> {
 public:
  SelfAttention(const GptConfig& c, uint64_t seed) : heads_(c.heads) {
    register_module("c_attn", linear(c.d_model, 3 * c.d_model));
    register_module("c_proj", linear(c.d_model, c.d_model));
    register_module("resid_dropout",
                    std::make_shared<nn::Dropout>(static_cast<float>(c.dropout), seed));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t b = x.size(0), t = x.size(1);
    const Tensor qkv = unrows((*own_child("c_attn"))(rows(x)), b, t);
    const Tensor y = F::causal_self_attention(qkv, heads_);
    return (*own_child("resid_dropout"))(unrows((*own_child("c_proj"))(rows(y)), b, t));
  }
  std::string name() const override { return "CausalSelfAttention"; }
  std::string extra_repr() const override { return fmt::format("heads={}", heads_); }

 private:
  int64_t heads_;
};

// x [B*T, C] -> [B*T, C]: c_proj(gelu(c_fc(x))), then dropout.
class Mlp : public nn::Cloneable<Mlp> {
 public:
  Mlp(const GptConfig& c, uint64_t seed) {
    register_module("c_fc", linear(c.d_model, 4 * c.d_model));
    register_module("c_proj", linear(4 * c.d_model, c.d_model));
    register_module("dropout", std::make_shared<nn::Dropout>(static_cast<float>(c.dropout), seed));
  }
  // Under bf16 autocast on CUDA with DDP_LT_GELU=1, the GELU runs inside c_fc's and
  // c_proj's matmuls (F::gelu_mlp, Note [gelu epilogues]); not when either Linear has
  // forward hooks (a ZeRO-3 unit gathers its parameters in them).
  Tensor forward(const Tensor& x) override {
    const auto fc = typed<nn::Linear>(own_child("c_fc"));
    const auto proj = typed<nn::Linear>(own_child("c_proj"));
    if (x.device().is_cuda() && autocast_enabled() && gelu_epilogues_enabled() &&
        !fc->has_forward_hooks() && !proj->has_forward_hooks()) {
      return (*own_child("dropout"))(
          F::gelu_mlp(x, fc->weight, fc->bias, proj->weight, proj->bias));
    }
    const Tensor h = F::gelu((*fc)(x));
    return (*own_child("dropout"))((*proj)(h));
  }
  std::string name() const override { return "MLP"; }
};

// Pre-LayerNorm block on x [B, T, C]: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class Block : public nn::Cloneable<Block> {
 public:
  Block(const GptConfig& c, Generator& gen, uint64_t index) {
    register_module("ln_1", std::make_shared<nn::LayerNorm>(c.d_model));
    register_module("attn", std::make_shared<SelfAttention>(c, dropout_seed(gen, 2 * index + 1)));
    register_module("ln_2", std::make_shared<nn::LayerNorm>(c.d_model));
    register_module("mlp", std::make_shared<Mlp>(c, dropout_seed(gen, 2 * index + 2)));
  }
  // The first residual add and ln_2 are one op (Note [residual layer norm]); the second
  // add stays apart: the next norm belongs to the next block (its own ZeRO-3 unit).
  Tensor forward(const Tensor& x) override {
    const int64_t b = x.size(0), t = x.size(1);
    const Tensor a = (*own_child("attn"))((*own_child("ln_1"))(x));
    const auto [h, n] = typed<nn::LayerNorm>(own_child("ln_2"))->forward_add(x, a);
    const Tensor m = (*own_child("mlp"))(rows(n));
    return F::add(h, unrows(m, b, t));
  }
  std::string name() const override { return "Block"; }
};

// tokens [B, T] -> ln_f(h(drop(wte[tokens] + wpe[0..T-1]))) [B, T, C].
class Transformer : public nn::Cloneable<Transformer> {
 public:
  Transformer(const GptConfig& c, Generator& gen) {
    register_module("wte", embedding(c.vocab, c.d_model));
    register_module("wpe", embedding(c.context, c.d_model));
    register_module(
        "drop", std::make_shared<nn::Dropout>(static_cast<float>(c.dropout), dropout_seed(gen, 0)));
    auto h = std::make_shared<nn::Sequential>();
    for (int64_t i = 0; i < c.layers; ++i)
      h->add(std::make_shared<Block>(c, gen, static_cast<uint64_t>(i)));
    register_module("h", h);
    register_module("ln_f", std::make_shared<nn::LayerNorm>(c.d_model));
  }
  Tensor forward(const Tensor& tokens) override {
    const Tensor& pos = positions(tokens.size(0), tokens.size(1), tokens.device());
    const Tensor x = F::add((*own_child("wte"))(tokens), (*own_child("wpe"))(pos));
    return (*own_child("ln_f"))((*own_child("h"))((*own_child("drop"))(x)));
  }
  std::string name() const override { return "Transformer"; }

 private:
  // Positions 0..t-1 in every row of [b, t], on the tokens' device, made once per (b, t,
  // device): a host-to-device copy per forward would block the host until the device
  // had run everything queued (Note [copy semantics] in runtime/ops/copy.cpp). Each is
  // kept, never replaced: a captured CUDA graph reads the one it was captured with at
  // every replay, while a batch of another shape runs eagerly between replays (Note
  // [graphed steps] in trainer/epoch.cpp).
  const Tensor& positions(int64_t b, int64_t t, const Device& device) {
    const auto key = std::make_tuple(b, t, static_cast<int>(device.type), device.index);
    auto it = positions_.find(key);
    if (it == positions_.end()) {
      std::vector<int64_t> ids(static_cast<size_t>(b * t));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) % t;
      it =
          positions_.emplace(key, from_vector(ids, {b, t}, {.dtype = DType::i64, .device = device}))
              .first;
    }
    return it->second;
  }
  std::map<std::tuple<int64_t, int64_t, int, int>, Tensor> positions_;

 public:
  Tensor token_embedding() const { return typed<nn::Embedding>(own_child("wte"))->weight; }
};

// GPT-2's init (models/gpt.h) over named_parameters(), which is gpt_tensors() order.
void init_gpt2(const nn::Module& model, const GptConfig& c, Generator& gen) {
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.layers));
  const auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (auto [name, p] : model.named_parameters()) {
    const bool layer_norm = name.find(".ln_") != std::string::npos;
    if (ends_with(name, ".bias")) {
      fill_(p, 0.0);
    } else if (layer_norm) {
      fill_(p, 1.0);
    } else {
      const double std = ends_with(name, "c_proj.weight") ? residual_std : kInitStd;
      const Tensor draw = randn(p.shape(), gen.seed(), {}, gen.take(p.numel()));
      copy_(p, scale(draw, static_cast<float>(std)));
    }
  }
}

void check_tokens(const Tensor& tokens, const GptConfig& c) {
  DDP_CHECK(tokens.dtype() == DType::i64 && tokens.dim() == 2,
            "Gpt ({}): expects token ids as an int64 tensor [batch, T], got {} {}; pass the "
            "inputs of a text window batch (runtime/data/text_windows.h)",
            describe(c), dtype_name(tokens.dtype()), shape_str(tokens.shape()));
  DDP_CHECK(tokens.size(0) >= 1 && tokens.size(1) >= 1 && tokens.size(1) <= c.context,
            "Gpt ({}): sequence length T = {} (tokens {}) is outside [1, {}], the model's "
            "context; use windows of at most {} tokens or a config with a larger ctx",
            describe(c), tokens.size(1), shape_str(tokens.shape()), c.context, c.context);
  if (!tokens.device().is_cpu()) return;  // the embedding kernel checks on the device
  const int64_t* ids = tokens.data<int64_t>();
  for (int64_t i = 0, n = tokens.numel(); i < n; ++i) {
    DDP_CHECK(ids[i] >= 0 && ids[i] < c.vocab,
              "Gpt ({}): token id {} at [{}, {}] is outside the vocabulary [0, {}); encode the "
              "text with a tokenizer of at most {} ids or use a config with a larger vocab",
              describe(c), ids[i], i / tokens.size(1), i % tokens.size(1), c.vocab, c.vocab);
  }
}

}  // namespace

Gpt::Gpt(const GptConfig& config, Generator& gen) : config_(config) {
  validate(config_);
  register_module("transformer", std::make_shared<Transformer>(config_, gen));
  init_gpt2(*this, config_, gen);
}

Tensor Gpt::forward(const Tensor& tokens) {
  check_tokens(tokens, config_);
  const int64_t b = tokens.size(0), t = tokens.size(1);
  auto transformer = typed<Transformer>(own_child("transformer"));
  const Tensor x = (*transformer)(tokens);
  // The LM head is wte itself: x wte^T, so wte's gradient gets this product's too;
  // padded to padded_vocab columns of -inf when the config asks (Note [padded head]).
  const int64_t width = config_.logits_width();
  const Tensor logits = F::lm_head(rows(x), transformer->token_embedding(), width);
  return F::reshape(logits, {b, t, width});
}

std::string Gpt::extra_repr() const {
  return describe(config_);
}

std::shared_ptr<Gpt> make_gpt(const GptConfig& config, Generator& gen) {
  return std::make_shared<Gpt>(config, gen);
}

DecayGroups decay_groups(const nn::Module& model) {
  DecayGroups groups;
  for (const auto& [name, p] : model.named_parameters()) {
    (p.dim() >= 2 ? groups.decay : groups.no_decay).push_back(p);
  }
  return groups;
}

}  // namespace ddp::models
