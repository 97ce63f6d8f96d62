// sample: generates text from a gpt checkpoint written by `train --save`, a
// byte at a time, or a GPT-2 token at a time for models trained on token shards.
// See --help and docs/sample.md.
#include "models/gpt.h"
#include "models/sampling.h"
#include "runtime/autograd/autograd.h"
#include "runtime/data/bpe.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/tensor.h"
#include "trainer/checkpoint.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace {

const char* const kUsage = R"(usage: sample --checkpoint FILE [options]

Generates text from a gpt model checkpoint written by `train --model gpt-...
--save FILE`; prints the prompt and what follows it. A model trained on bytes
writes a byte at a time; one trained on token shards (`tokenize`) a GPT-2 token.

  --checkpoint FILE   the checkpoint (its metadata names the model)
  --prompt TEXT       the text to continue (default: a newline for a byte
                      model, <|endoftext|> for a GPT-2-token one; not printed)
  --tokens N          bytes or tokens to generate (default 200)
  --temperature T     > 0: divides the logits; below 1 sharpens (default 1)
  --top-k K           sample among the K most likely bytes only; 1 is greedy
                      (the most likely byte each time); 0: all (default 0)
  --seed S            the random stream of the choices (default 0)
  --device D          cpu | cuda | cuda:N (default cpu)
  --tokenizer T       auto | bytes | gpt2: how text maps to the model's tokens;
                      auto: what the checkpoint was trained on (default auto)
  --vocab DIR         GPT-2's encoder.json and vocab.bpe (default
                      $DDP_GPT2_BPE_DIR, else /usr/share/datasets/gpt2-bpe)
  -h, --help          this text
)";

struct Options {
  std::string checkpoint, prompt, device = "cpu", tokenizer = "auto", vocab;
  int64_t tokens = 200;
  uint64_t seed = 0;
  ddp::models::SamplingOptions sampling;
};

template <typename T>
T number(const std::string& flag, const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  DDP_CHECK(ec != std::errc::result_out_of_range, "{} {}: out of range (at most {})", flag, text,
            std::numeric_limits<T>::max());
  DDP_CHECK(!(std::is_unsigned_v<T> && text.starts_with('-')), "{} {}: must be >= 0", flag, text);
  DDP_CHECK(ec == std::errc() && ptr == end, "{} '{}': expected a number", flag, text);
  return v;
}

std::optional<Options> parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return std::nullopt;
    // An unknown flag is named as such, also when it comes last.
    static const std::array<std::string_view, 9> kFlags = {
        "--checkpoint", "--prompt", "--tokens",    "--temperature", "--top-k",
        "--seed",       "--device", "--tokenizer", "--vocab"};
    DDP_CHECK(std::find(kFlags.begin(), kFlags.end(), arg) != kFlags.end(), "unknown option '{}'",
              arg);
    DDP_CHECK(i + 1 < argc, "{} needs a value", arg);
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    ++i;
    if (arg == "--checkpoint") {
      o.checkpoint = value;
    } else if (arg == "--prompt") {
      o.prompt = value;
    } else if (arg == "--tokens") {
      o.tokens = number<int64_t>(arg, value);
    } else if (arg == "--temperature") {
      o.sampling.temperature = number<double>(arg, value);
    } else if (arg == "--top-k") {
      o.sampling.top_k = number<int64_t>(arg, value);
    } else if (arg == "--seed") {
      o.seed = number<uint64_t>(arg, value);
    } else if (arg == "--device") {
      o.device = value;
    } else if (arg == "--tokenizer") {
      DDP_CHECK(value == "auto" || value == "bytes" || value == "gpt2",
                "--tokenizer '{}': expected auto, bytes or gpt2", value);
      o.tokenizer = value;
    } else if (arg == "--vocab") {
      o.vocab = value;
    } else {
      throw ddp::ValueError(fmt::format("unknown option '{}'", arg));
    }
  }
  DDP_CHECK(!o.checkpoint.empty(), "--checkpoint FILE is required (a train --save checkpoint)");
  std::error_code ec;
  DDP_CHECK(!std::filesystem::is_directory(o.checkpoint, ec),
            "--checkpoint {}: is a directory; pass the checkpoint file (train --save PATH)",
            o.checkpoint);
  DDP_CHECK(o.tokens >= 0, "--tokens {}: must be >= 0", o.tokens);
  ddp::models::validate(o.sampling);
  ddp::Device::parse(o.device);
  return o;
}

// Note [sampling without a cache]: every byte runs the model over the last
// `context` bytes (the prompt cropped to the context window as it grows); no
// key/value cache, which is fine for the byte-level models' short contexts.
void generate(const Options& o) {
  using namespace ddp;
  const std::string spec = train::read_checkpoint_model(o.checkpoint);
  DDP_CHECK(models::is_gpt_model(spec),
            "{}: the checkpoint holds model '{}', not a gpt model; sample generates text from "
            "checkpoints of train --model gpt-tiny|gpt-mini|gpt2|gpt:...",
            o.checkpoint, spec);
  const models::GptConfig config = models::gpt_config(spec);
  Generator init(0);  // overwritten by the checkpoint's weights
  auto model = models::make_gpt(config, init);
  train::load_model_weights(o.checkpoint, *model);
  const Device device = Device::parse(o.device);
  check_available(device);
  model->to(device);
  model->eval();
  NoGradGuard no_grad;
  std::string unit = o.tokenizer;
  const bool trained_on_tokens = train::read_checkpoint_text_unit(o.checkpoint) == "token";
  if (unit == "auto") unit = trained_on_tokens ? "gpt2" : "bytes";
  DDP_CHECK(unit != "bytes" || !trained_on_tokens,
            "{}: the model was trained on GPT-2 tokens (its checkpoint's text_unit is token); "
            "--tokenizer bytes would feed the prompt's bytes to it as token ids: use --tokenizer "
            "gpt2 or auto",
            o.checkpoint);
  std::optional<Gpt2Tokenizer> bpe;
  std::vector<int64_t> tokens;
  if (unit == "gpt2") {
    bpe = Gpt2Tokenizer::load(o.vocab.empty() ? gpt2_bpe_dir() : o.vocab);
    DDP_CHECK(config.vocab >= bpe->vocab_size(),
              "{}: the model's vocabulary is {}, smaller than GPT-2's {}; it was not trained on "
              "GPT-2 tokens (use --tokenizer bytes)",
              o.checkpoint, config.vocab, bpe->vocab_size());
    const std::vector<int32_t> ids = bpe->encode(o.prompt);
    tokens.assign(ids.begin(), ids.end());
    if (tokens.empty()) tokens.push_back(bpe->end_of_text());  // a document's start
  } else {
    for (unsigned char c : o.prompt) tokens.push_back(c);
    if (tokens.empty()) tokens.push_back('\n');
  }
  // Bytes sample among the first 256 (gpt2's vocabulary is larger); GPT-2 tokens
  // among GPT-2's (a padded vocabulary's extra rows are never chosen).
  const int64_t choices = bpe ? bpe->vocab_size() : std::min<int64_t>(config.vocab, 256);
  std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  const std::vector<float> u =
      o.tokens == 0 ? std::vector<float>{} : rand({o.tokens}, o.seed).to_vector<float>();
  for (int64_t i = 0; i < o.tokens; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size()), config.context);
    const std::vector<int64_t> window(tokens.end() - n, tokens.end());
    const Tensor input = from_vector<int64_t>(window, {1, n}, {.dtype = DType::i64}).to(device);
    const Tensor logits = model->forward(input);  // [1, n, vocab or padded_vocab]
    const auto all = logits.to(Device::cpu()).to_vector<float>();
    const std::span<const float> last(all.data() + (n - 1) * logits.size(2),
                                      static_cast<size_t>(choices));
    const int64_t next = models::pick_token(last, o.sampling, u[static_cast<size_t>(i)]);
    tokens.push_back(next);
    if (bpe) {
      const int32_t id = static_cast<int32_t>(next);
      const std::string text = bpe->decode(std::span<const int32_t>(&id, 1));
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      std::fputc(static_cast<int>(next), stdout);
    }
  }
  std::fputc('\n', stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Options> options;
  try {
    options = parse(argc, argv);
  } catch (const ddp::Error& e) {
    std::cerr << "sample: " << e.what() << "\n\n" << kUsage;
    return 2;
  }
  if (!options) {
    std::cout << kUsage;
    return 0;
  }
  try {
    generate(*options);
    return 0;
  } catch (const ddp::Error& e) {
    std::fflush(stdout);
    std::cerr << "sample: error: " << e.what() << "\n";
    return 1;
  }
}
