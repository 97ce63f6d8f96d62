// The GPT-2-style transformer of the model zoo (configs in models/gpt_config.h): token +
// learned position embeddings, pre-LayerNorm blocks (LayerNorm, causal multi-head
// self-attention, residual, LayerNorm, MLP 4x with GELU tanh, residual), final LayerNorm,
// LM head tied to the token embedding. Parameters carry GPT-2's names
// ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ...) in gpt_tensors'
// order, so state_dict() is a checkpoint models/torch_gpt.py loads.
//
// GPT-2's initialisation (as models/torch_gpt.py's): Linear and Embedding weights
// N(0, 0.02), biases 0, LayerNorm weight 1 and bias 0, the residual projections
// (attn.c_proj.weight, mlp.c_proj.weight) N(0, 0.02 / sqrt(2 * layers)).
#pragma once

#include "models/gpt_config.h"
#include "runtime/nn/module.h"

#include <memory>
#include <vector>

namespace ddp::models {

class Gpt;

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
