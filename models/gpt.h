// The GPT-2-style transformer of the model zoo (configs in models/gpt_config.h): token +
// learned position embeddings, pre-LayerNorm blocks (LayerNorm, causal multi-head
// self-attention, residual, LayerNorm, MLP 4x with GELU tanh, residual), final LayerNorm,
// LM head tied to the token embedding. Parameters carry GPT-2's names
// ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ...) in gpt_tensors'
// order, so state_dict() is a checkpoint models/torch_gpt.py loads.
//
// GPT-2's initialisation (as models/torch_gpt.py's): Linear and Embedding weights
// N(0, 0.02), biases 0, LayerNorm weight 1 and bias 0, the residual projections
// (attn.c_proj.weight, mlp.c_proj.weight) N(0, 0.02 / sqrt(2 * layers)), drawn from the
// Generator in gpt_tensors' order.
//
// Dropout (config.dropout > 0, training mode only) sits where nanoGPT's resid/embd dropout
// does: on the embedding sum (transformer.drop), on the attention output projection
// (attn.resid_dropout) and on the MLP output (mlp.dropout). nanoGPT's attn_dropout on the
// attention probabilities is NOT applied: the packed attention kernels keep the
// probabilities for the backward and have no mask (Note [packed attention]); at the
// dropout of 0 GPT-2 pretraining uses the two models are the same.
#pragma once

#include "models/gpt_config.h"
#include "runtime/nn/module.h"

#include <memory>
#include <vector>

namespace ddp::models {

// tokens i64 [B, T] (1 <= T <= context, ids in [0, vocab)) -> logits f32 [B, T, vocab]
// (bf16 under autocast; [B, T, padded_vocab] with -inf past vocab when the config pads
// the head: Note [padded head] in runtime/autograd/functions.cpp).
// Children and parameters are named as GPT-2's (above); forward works on any device its
// parameters were moved to. The LM head is wte itself (logits = x wte^T), so wte's gradient
// sums the embedding's and the head's. Cloneable: DataParallel replicas share the
// dropout streams (nn::Dropout).
class Gpt : public nn::Cloneable<Gpt> {
 public:
  // Validates config (ValueError); the parameters are initialised from gen as above.
  Gpt(const GptConfig& config, Generator& gen);
  // Throws ValueError for tokens that are not i64 [B, T], for T outside [1, context], and
  // (tokens on the CPU) for an id outside [0, vocab), naming the value and the fix.
  Tensor forward(const Tensor& tokens) override;
  std::string name() const override { return "Gpt"; }
  std::string extra_repr() const override;
  const GptConfig& config() const { return config_; }

 private:
  GptConfig config_;
};

// Builds the model on the CPU, initialised from gen.
std::shared_ptr<Gpt> make_gpt(const GptConfig& config, Generator& gen);

// Weight decay groups as nanoGPT forms them: every parameter of 2 or more dims
// (the Linear weights and the embeddings) decays, biases and LayerNorm parameters
// do not. Each group in named_parameters() order.
struct DecayGroups {
  std::vector<Tensor> decay, no_decay;
};
DecayGroups decay_groups(const nn::Module& model);

}  // namespace ddp::models
