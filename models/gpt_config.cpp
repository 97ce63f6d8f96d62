#include "models/gpt_config.h"

#include "runtime/error.h"

#include <fmt/ranges.h>
#include "runtime/fmt.h"

#include <charconv>
#include <map>
#include <sstream>

namespace ddp::models {
namespace {

constexpr const char* kSpecPrefix = "gpt:";
constexpr const char* kSpecExample = "gpt:layers=4,d=128,heads=4,ctx=128";
constexpr const char* kValidKeys = "layers, d, heads, ctx, vocab, padded_vocab, dropout";

GptConfig named(const std::string& name, int64_t layers, int64_t d, int64_t heads, int64_t ctx,
                int64_t vocab) {
  return GptConfig{.name = name,
                   .layers = layers,
                   .d_model = d,
                   .heads = heads,
                   .context = ctx,
                   .vocab = vocab,
                   .dropout = 0.0};
}

const std::vector<GptConfig>& named_configs() {
  static const std::vector<GptConfig> configs = {
      named("gpt-tiny", 2, 64, 4, 64, 256),
      named("gpt-mini", 6, 384, 6, 256, 256),
      named("gpt2", 12, 768, 12, 1024, 50257),
  };
  return configs;
}

int64_t parse_whole(const std::string& spec, const std::string& key, const std::string& value) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  DDP_CHECK(ec == std::errc() && ptr == value.data() + value.size() && v > 0,
            "--model '{}': {}={} is not a positive whole number; write it like {}", spec, key,
            value, kSpecExample);
  return v;
}

double parse_dropout(const std::string& spec, const std::string& value) {
  double v = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  DDP_CHECK(ec == std::errc() && ptr == value.data() + value.size(),
            "--model '{}': dropout={} is not a number; write a probability like dropout=0.1", spec,
            value);
  return v;
}

// "layers=2,d=64" -> {layers: "2", d: "64"}; rejects unknown and repeated keys.
std::map<std::string, std::string> split_spec(const std::string& spec) {
  std::map<std::string, std::string> out;
  std::stringstream in(spec.substr(std::string(kSpecPrefix).size()));
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto eq = part.find('=');
    DDP_CHECK(eq != std::string::npos && eq > 0,
              "--model '{}': '{}' is not key=value; write it like {}", spec, part, kSpecExample);
    const std::string key = part.substr(0, eq);
    DDP_CHECK(key == "layers" || key == "d" || key == "heads" || key == "ctx" || key == "vocab" ||
                  key == "padded_vocab" || key == "dropout",
              "--model '{}': unknown key '{}'; valid keys are {}", spec, key, kValidKeys);
    DDP_CHECK(!out.contains(key), "--model '{}': {} is given twice; give each key once", spec, key);
    out[key] = part.substr(eq + 1);
  }
  return out;
}

GptConfig parse_spec(const std::string& spec) {
  const auto values = split_spec(spec);
  GptConfig c;
  c.name = spec;
  for (const char* key : {"layers", "d", "heads", "ctx"}) {
    DDP_CHECK(values.contains(key),
              "--model '{}': {}= is missing; a gpt spec needs layers, d, "
              "heads and ctx (vocab defaults to 256 bytes), like {}",
              spec, key, kSpecExample);
  }
  c.layers = parse_whole(spec, "layers", values.at("layers"));
  c.d_model = parse_whole(spec, "d", values.at("d"));
  c.heads = parse_whole(spec, "heads", values.at("heads"));
  c.context = parse_whole(spec, "ctx", values.at("ctx"));
  if (values.contains("vocab")) c.vocab = parse_whole(spec, "vocab", values.at("vocab"));
  if (values.contains("padded_vocab")) {
    c.padded_vocab = parse_whole(spec, "padded_vocab", values.at("padded_vocab"));
  }
  if (values.contains("dropout")) c.dropout = parse_dropout(spec, values.at("dropout"));
  return c;
}

}  // namespace

int64_t GptTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool is_gpt_model(const std::string& model) {
  return model.starts_with("gpt-") || model == "gpt2" || model.starts_with(kSpecPrefix);
}

GptConfig gpt_config(const std::string& model) {
  for (const GptConfig& c : named_configs()) {
    if (c.name == model) return c;
  }
  DDP_CHECK(model.starts_with(kSpecPrefix),
            "--model '{}': valid gpt models are gpt-tiny, gpt-mini, gpt2, or a spec like {} "
            "(optional vocab=, padded_vocab=, dropout=)",
            model, kSpecExample);
  GptConfig c = parse_spec(model);
  validate(c);
  return c;
}

void validate(const GptConfig& c) {
  DDP_CHECK(c.layers > 0 && c.d_model > 0 && c.heads > 0 && c.context > 0 && c.vocab > 0,
            "gpt model '{}': layers={}, d={}, heads={}, ctx={}, vocab={} must all be positive",
            c.name, c.layers, c.d_model, c.heads, c.context, c.vocab);
  DDP_CHECK(c.d_model % c.heads == 0,
            "gpt model '{}': d={} is not divisible by heads={} (each head gets d/heads "
            "dimensions); pick d a multiple of {}, like d={}, or heads dividing {}",
            c.name, c.d_model, c.heads, c.heads, c.heads * ((c.d_model + c.heads - 1) / c.heads),
            c.d_model);
  DDP_CHECK(c.padded_vocab == 0 || c.padded_vocab >= c.vocab,
            "gpt model '{}': padded_vocab={} is smaller than vocab={}; the LM head's logits "
            "are padded up to it (Note [padded head]): give a value >= {}, like {}, or leave it "
            "out",
            c.name, c.padded_vocab, c.vocab, c.vocab, (c.vocab + 63) / 64 * 64);
  DDP_CHECK(c.padded_vocab == 0 || c.padded_vocab == c.vocab || c.padded_vocab % 8 == 0,
            "gpt model '{}': padded_vocab={} is not a multiple of 8; the padding is for rows "
            "of bf16 logits that are 16-byte aligned (Note [padded head]): give a multiple of "
            "64, like {} (vocab={} rounded up; 50304 for GPT-2, as nanoGPT and llm.c)",
            c.name, c.padded_vocab, (c.vocab + 63) / 64 * 64, c.vocab);
  DDP_CHECK(c.dropout >= 0.0 && c.dropout < 1.0,
            "gpt model '{}': dropout={} is not a probability in [0, 1); 0 (the default) turns "
            "it off",
            c.name, c.dropout);
}

std::string describe(const GptConfig& c) {
  std::string out = fmt::format("gpt:layers={},d={},heads={},ctx={},vocab={}", c.layers, c.d_model,
                                c.heads, c.context, c.vocab);
  if (c.padded_vocab != 0) out += fmt::format(",padded_vocab={}", c.padded_vocab);
  if (c.dropout != 0.0) out += fmt::format(",dropout={}", c.dropout);
  return out;
}

bool same_model(const GptConfig& a, const GptConfig& b) {
  return a.layers == b.layers && a.d_model == b.d_model && a.heads == b.heads &&
         a.context == b.context && a.vocab == b.vocab && a.dropout == b.dropout;
}

int64_t parameter_count(const GptConfig& c) {
  const int64_t d = c.d_model;
  const int64_t per_layer = 2 * d                                     // ln_1
                            + d * 3 * d + 3 * d                       // attn.c_attn
                            + d * d + d                               // attn.c_proj
                            + 2 * d                                   // ln_2
                            + d * 4 * d + 4 * d                       // mlp.c_fc
                            + 4 * d * d + d;                          // mlp.c_proj
  return c.vocab * d + c.context * d + c.layers * per_layer + 2 * d;  // + ln_f; head tied
}

std::vector<GptTensor> gpt_tensors(const GptConfig& c) {
  const int64_t d = c.d_model;
  std::vector<GptTensor> out = {{"transformer.wte.weight", {c.vocab, d}},
                                {"transformer.wpe.weight", {c.context, d}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string h = fmt::format("transformer.h.{}.", i);
    // Linear weights are [out, in]: Note [gpt weight layout].
    out.push_back({h + "ln_1.weight", {d}});
    out.push_back({h + "ln_1.bias", {d}});
    out.push_back({h + "attn.c_attn.weight", {3 * d, d}});
    out.push_back({h + "attn.c_attn.bias", {3 * d}});
    out.push_back({h + "attn.c_proj.weight", {d, d}});
    out.push_back({h + "attn.c_proj.bias", {d}});
    out.push_back({h + "ln_2.weight", {d}});
    out.push_back({h + "ln_2.bias", {d}});
    out.push_back({h + "mlp.c_fc.weight", {4 * d, d}});
    out.push_back({h + "mlp.c_fc.bias", {4 * d}});
    out.push_back({h + "mlp.c_proj.weight", {d, 4 * d}});
    out.push_back({h + "mlp.c_proj.bias", {d}});
  }
  out.push_back({"transformer.ln_f.weight", {d}});
  out.push_back({"transformer.ln_f.bias", {d}});
  return out;
}

std::string tensors_json(const GptConfig& c) {
  std::string out = fmt::format("{{\"model\": \"{}\", \"parameters\": {}, \"tensors\": [\n",
                                describe(c), parameter_count(c));
  const auto tensors = gpt_tensors(c);
  for (size_t i = 0; i < tensors.size(); ++i) {
    out += fmt::format("  {{\"name\": \"{}\", \"shape\": [{}]}}{}\n", tensors[i].name,
                       fmt::join(tensors[i].shape, ", "), i + 1 < tensors.size() ? "," : "");
  }
  out += "]}\n";
  return out;
}

}  // namespace ddp::models
