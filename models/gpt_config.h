// GPT-2-style transformer configurations: the named configs, the `gpt:key=value,...`
// parser behind `--model`, the parameter count and the tensor names and shapes.
//
//   gpt-tiny   2 layers, d 64,  4 heads, context 64,   vocabulary 256      (120,576 parameters)
//   gpt-mini   6 layers, d 384, 6 heads, context 256,  vocabulary 256   (10,844,160 parameters)
//   gpt2      12 layers, d 768, 12 heads, context 1024, vocabulary 50257 (124,439,808 parameters)
//   gpt:layers=4,d=128,heads=4,ctx=128[,vocab=256][,padded_vocab=N][,dropout=0.1]   for sweeps
//
// The tensor names are GPT-2's (nanoGPT's state_dict without lm_head, which is tied to
// transformer.wte.weight), so a safetensors checkpoint loads into PyTorch code by name;
// models/torch_gpt.py is the PyTorch model with exactly these tensors.
//
// Note [gpt weight layout]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The four projection weights of a block (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
// are stored as torch.nn.Linear stores them, [out_features, in_features], as nanoGPT
// does; y = x W^T + b. HF transformers' GPT-2 uses Conv1D, whose weights are
// [in_features, out_features]: loading an HF GPT-2 checkpoint means transposing exactly
// those four tensors per layer (nanoGPT's from_pretrained does the same). One layout for
// every Linear keeps our nn::Linear, the PyTorch reference and the checkpoints alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::models {

struct GptConfig {
  std::string name;  // "gpt-tiny", "gpt-mini", "gpt2" or the "gpt:..." spec it came from
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t context = 0;  // the longest sequence; the size of the position embedding
  int64_t vocab = 256;  // 256: bytes
  // 0: none; else the LM head's logits columns (>= vocab; the columns past vocab are
  // -inf): rows of a multiple of 8 bf16 for the head's matmuls (Note [padded head]).
  int64_t padded_vocab = 0;
  double dropout = 0.0;

  int64_t head_dim() const { return d_model / heads; }
  // The logits' last dim: padded_vocab, or vocab.
  int64_t logits_width() const { return padded_vocab != 0 ? padded_vocab : vocab; }
};

struct GptTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// True for the names gpt_config accepts the form of ("gpt-...", "gpt2", "gpt:...").
bool is_gpt_model(const std::string& model);
// A named config or a `gpt:` spec; throws ValueError naming the value and the fix.
GptConfig gpt_config(const std::string& model);
// Throws ValueError when a field is out of range (non-positive, d_model not divisible
// by heads, padded_vocab below vocab, dropout outside [0, 1)).
void validate(const GptConfig& config);
// "gpt:layers=2,d=64,heads=4,ctx=64,vocab=256" (padded_vocab and dropout when non-zero): parses
// back to the same config; for logs and checkpoint metadata.
std::string describe(const GptConfig& config);
// Whether a and b are the same model: the same parameters and the same loss for the
// same weights. padded_vocab is left out (it only pads the LM head's product: Note
// [padded head]), so a checkpoint resumes across it.
bool same_model(const GptConfig& a, const GptConfig& b);

// The parameter count with the LM head tied to the token embedding (closed form).
int64_t parameter_count(const GptConfig& config);
// Every parameter tensor in GPT-2 order (Note [gpt weight layout]).
std::vector<GptTensor> gpt_tensors(const GptConfig& config);
// {"model": describe, "parameters": N, "tensors": [{"name": ..., "shape": [...]}, ...]}
// on one line per tensor; the format models/torch_gpt.py writes for the same config.
std::string tensors_json(const GptConfig& config);

}  // namespace ddp::models
