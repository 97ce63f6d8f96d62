// tokenize: text files (or the Brown corpus) to GPT-2 token shards for
// `train --data DIR`. See --help and docs/data.md.
//
// Note [tokenize documents]: every input file is a document (the Brown corpus:
// each of its 500 documents, tags stripped as the byte models read them). As
// llm.c's and nanoGPT's data scripts do, each document's tokens follow one
// <|endoftext|>, so the model sees where documents start. Document i goes to the
// validation shards when i % --val-every == --val-every - 1 (the Brown split of
// the byte models with the default 10), in the order given (a directory's files
// sorted by name). Shards hold --shard-tokens tokens each (the last fewer), named
// NAME_val_000000.bin, NAME_train_000001.bin, ... as llm.c names fineweb's.
#include "runtime/data/bpe.h"
#include "runtime/data/text_corpus.h"
#include "runtime/data/token_shards.h"
#include "runtime/error.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;

const char* const kUsage = R"(usage: tokenize [options] FILE|DIR...
       tokenize --brown [options]
       tokenize --decode FILE.bin [--vocab DIR]

Turns text into GPT-2 token shards (the .bin form of llm.c and nanoGPT) for
`train --model gpt2 --data DIR`. Each file is a document, its tokens after an
<|endoftext|>; a DIR stands for its files, sorted by name, without hidden files,
token shards and subfolders (docs/data.md). Shards an earlier run wrote to the
same --out with the same --name are replaced (those not overwritten removed).

  --out DIR           where the shards go (default tokens)
  --name NAME         the shards' name: NAME_train_000001.bin, NAME_val_000000.bin
                      (default data; brown with --brown)
  --brown             the Brown corpus's 500 documents, tags stripped (from
                      $DDP_BROWN_DIR, else /usr/share/datasets/brown)
  --val-every N       document i is validation when i % N == N - 1; 0: none
                      (default 10)
  --shard-tokens N    tokens per shard (default 100000000)
  --vocab DIR         GPT-2's encoder.json and vocab.bpe (default
                      $DDP_GPT2_BPE_DIR, else /usr/share/datasets/gpt2-bpe)
  --decode FILE.bin   print a shard's tokens as text instead
  -h, --help          this text
)";

struct Options {
  std::vector<std::string> inputs;
  std::string out = "tokens", name, vocab, decode;
  bool brown = false;
  int64_t val_every = 10;
  int64_t shard_tokens = 100'000'000;
};

int64_t whole(const std::string& flag, const std::string& text, int64_t min) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  DDP_CHECK(ec == std::errc() && ptr == end && v >= min,
            "{} '{}': expected a whole number >= {}; run `tokenize --help`", flag, text, min);
  return v;
}

std::optional<Options> parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return std::nullopt;
    if (arg == "--brown") {
      o.brown = true;
      continue;
    }
    if (!arg.starts_with("--")) {
      o.inputs.push_back(arg);
      continue;
    }
    // An unknown flag is named as such, also when it comes last.
    static const std::array<std::string_view, 6> kFlags = {
        "--out", "--name", "--vocab", "--decode", "--val-every", "--shard-tokens"};
    DDP_CHECK(std::find(kFlags.begin(), kFlags.end(), arg) != kFlags.end(),
              "unknown option '{}'; run `tokenize --help`", arg);
    DDP_CHECK(i + 1 < argc, "{} needs a value; run `tokenize --help`", arg);
    const std::string value = argv[++i];
    if (arg == "--out") {
      o.out = value;
    } else if (arg == "--name") {
      o.name = value;
    } else if (arg == "--vocab") {
      o.vocab = value;
    } else if (arg == "--decode") {
      o.decode = value;
    } else if (arg == "--val-every") {
      o.val_every = whole(arg, value, 0);
    } else if (arg == "--shard-tokens") {
      o.shard_tokens = whole(arg, value, 1);
    } else {
      throw ddp::ValueError(fmt::format("unknown option '{}'; run `tokenize --help`", arg));
    }
  }
  if (o.name.empty()) o.name = o.brown ? "brown" : "data";
  // train reads a shard whose name has a "val" part as validation: NAME_train_* too.
  DDP_CHECK(!ddp::is_validation_shard_name(o.name + "_train_000001.bin"),
            "--name {}: \"val\" (or \"valid\", \"validation\", \"eval\") as a part of the "
            "name between '_', '-' and '.' marks a shard as validation to train, its train "
            "shards included; choose another name",
            o.name);
  if (o.vocab.empty()) o.vocab = ddp::gpt2_bpe_dir();
  DDP_CHECK(!o.decode.empty() || o.brown || !o.inputs.empty(),
            "nothing to tokenize: give text files or directories, or --brown; run `tokenize "
            "--help`");
  DDP_CHECK(!(o.brown && !o.inputs.empty()),
            "--brown tokenizes the Brown corpus; give it or files ({}), not both", o.inputs[0]);
  return o;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), "cannot read {}", path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Whether `path` starts as a token shard does (the magic of token_shards.h).
bool is_token_shard(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t magic = 0;
  return in.read(reinterpret_cast<char*>(&magic), sizeof magic) && magic == ddp::kTokenShardMagic;
}

// Note [tokenize folders]: a folder's documents are its regular files, not its
// hidden files (.DS_Store, an editor's swap file), nor token shards (a folder
// given as its own --out), nor its subfolders; each kind left out is counted on
// one line, so nothing is skipped unsaid.
std::vector<fs::path> folder_documents(const std::string& dir) {
  std::vector<fs::path> files;
  int64_t hidden = 0, shards = 0, folders = 0, others = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with(".")) {
      ++hidden;
    } else if (e.is_directory()) {
      ++folders;
    } else if (!e.is_regular_file()) {
      ++others;  // a link to nothing, a pipe, a socket
    } else if (is_token_shard(e.path())) {
      ++shards;
    } else {
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  if (hidden + shards + folders + others > 0) {
    std::cerr << fmt::format(
        "tokenize: {}: left out {} hidden file(s), {} token shard(s), {} subfolder(s) and {} "
        "other(s) that are no regular file (give a subfolder as an input of its own to "
        "tokenize it)\n",
        dir, hidden, shards, folders, others);
  }
  return files;
}

// The shards an earlier run wrote to --out under --name (NAME_train_NNNNNN.bin,
// NAME_val_NNNNNN.bin that start as token shards do).
std::vector<fs::path> earlier_shards(const Options& o) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o.out, ec)) {
    const std::string file = e.path().filename().string();
    for (const char* split : {"_train_", "_val_"}) {
      const std::string prefix = o.name + split;
      const bool numbered =
          file.size() == prefix.size() + 10 && file.starts_with(prefix) && file.ends_with(".bin") &&
          std::all_of(file.begin() + static_cast<std::ptrdiff_t>(prefix.size()), file.end() - 4,
                      [](char c) { return c >= '0' && c <= '9'; });
      if (numbered && e.is_regular_file() && is_token_shard(e.path())) found.push_back(e.path());
    }
  }
  return found;
}

// After this run's shards are written: removes the earlier run's that this run did
// not overwrite, so the folder holds this run's only (train reads every .bin
// there). A run that fails before leaves the earlier shards as they were: its own
// are written as NAME_..._NNNNNN.bin.partial (train reads no such file) and renamed
// only once all are (run()).
void remove_earlier_shards(const Options& o, const std::vector<fs::path>& earlier,
                           const std::vector<std::string>& written) {
  int64_t removed = 0;
  for (const fs::path& p : earlier) {
    if (std::find(written.begin(), written.end(), p.string()) != written.end()) continue;
    std::error_code ec;
    if (fs::remove(p, ec)) ++removed;
  }
  if (removed > 0) {
    std::cerr << fmt::format("tokenize: removed {} shard(s) of an earlier run from {} ({}_*.bin)\n",
                             removed, o.out, o.name);
  }
}

std::vector<std::string> documents_of(const Options& o) {
  if (o.brown) {
    const char* env = std::getenv("DDP_BROWN_DIR");
    return ddp::load_brown_documents(env != nullptr && *env != '\0' ? env : ddp::kBrownCorpusDir);
  }
  std::vector<std::string> documents;
  for (const std::string& input : o.inputs) {
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
      for (const fs::path& f : folder_documents(input)) documents.push_back(read_text(f));
      continue;
    }
    DDP_CHECK(fs::exists(input, ec), "{} does not exist", input);
    if (is_token_shard(input)) {  // a shard named among the inputs (`--out t t/*`)
      std::cerr << fmt::format("tokenize: left out {}: a token shard, not text\n", input);
      continue;
    }
    documents.push_back(read_text(input));
  }
  return documents;
}

// Appends tokens to the current shard of a split, writing full shards out.
constexpr const char* kPartial = ".partial";
int shards_written = 0;  // by either writer, for DDP_TEST_TOKENIZE_FAIL_AFTER

class ShardWriter {
 public:
  ShardWriter(const Options& o, std::string split, int64_t& next_index)
      : o_(o), split_(std::move(split)), next_index_(next_index) {}
  void add(const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens) {
      buffer_.push_back(t);
      if (static_cast<int64_t>(buffer_.size()) == o_.shard_tokens) flush();
    }
  }
  void flush() {
    if (buffer_.empty()) return;
    const std::string path =
        (fs::path(o_.out) / fmt::format("{}_{}_{:06d}.bin", o_.name, split_, next_index_++))
            .string();
    // DDP_TEST_TOKENIZE_FAIL_AFTER=N: a testing aid, the run fails after N shards.
    if (const char* fail = std::getenv("DDP_TEST_TOKENIZE_FAIL_AFTER");
        fail != nullptr && *fail != '\0' && std::atoi(fail) == shards_written) {
      throw std::runtime_error(
          fmt::format("DDP_TEST_TOKENIZE_FAIL_AFTER={}: failing before {}", fail, path));
    }
    ddp::write_token_shard(path + kPartial, buffer_);
    ++shards_written;
    written_.push_back(path);
    std::cout << fmt::format("tokenize: wrote {} ({} tokens)\n", path, buffer_.size());
    total_ += static_cast<int64_t>(buffer_.size());
    buffer_.clear();
  }
  int64_t total() const { return total_; }
  const std::vector<std::string>& written() const { return written_; }

 private:
  const Options& o_;
  std::string split_;
  int64_t& next_index_;
  std::vector<int32_t> buffer_;
  std::vector<std::string> written_;
  int64_t total_ = 0;
};

int run(const Options& o) {
  const ddp::Gpt2Tokenizer tokenizer = ddp::Gpt2Tokenizer::load(o.vocab);
  if (!o.decode.empty()) {
    const ddp::TokenStream s = ddp::TokenStream::open_shards({o.decode});
    std::vector<int64_t> wide(static_cast<size_t>(s.size()));
    s.read(0, s.size(), wide.data());
    const std::vector<int32_t> ids(wide.begin(), wide.end());
    std::cout << tokenizer.decode(ids);
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> documents = documents_of(o);
  DDP_CHECK(!documents.empty(), "no documents to tokenize: {} hold(s) no text files",
            fmt::join(o.inputs, ", "));
  fs::create_directories(o.out);
  const std::vector<fs::path> earlier = earlier_shards(o);
  // The unfinished shards (.bin.partial) a failed run left under this --name.
  for (std::error_code ec; const auto& e : fs::directory_iterator(o.out, ec)) {
    const std::string file = e.path().filename().string();
    for (const char* split : {"_train_", "_val_"}) {
      const std::string prefix = o.name + split;
      const std::string tail = std::string(".bin") + kPartial;
      const bool numbered =
          file.size() == prefix.size() + 6 + tail.size() && file.starts_with(prefix) &&
          file.ends_with(tail) &&
          std::all_of(file.begin() + static_cast<std::ptrdiff_t>(prefix.size()),
                      file.begin() + static_cast<std::ptrdiff_t>(prefix.size() + 6),
                      [](char c) { return c >= '0' && c <= '9'; });
      if (numbered) fs::remove(e.path(), ec);
    }
  }
  // llm.c numbers the validation shard 0 and train shards from 1.
  int64_t val_index = 0, train_index = 1;
  ShardWriter train(o, "train", train_index), validation(o, "val", val_index);
  int64_t bytes = 0, val_documents = 0;
  for (size_t i = 0; i < documents.size(); ++i) {
    std::vector<int32_t> tokens = {tokenizer.end_of_text()};
    const std::vector<int32_t> body = tokenizer.encode(documents[i]);
    tokens.insert(tokens.end(), body.begin(), body.end());
    bytes += static_cast<int64_t>(documents[i].size());
    const bool val = o.val_every > 0 && static_cast<int64_t>(i) % o.val_every == o.val_every - 1;
    val_documents += val ? 1 : 0;
    (val ? validation : train).add(tokens);
    if ((i + 1) % 100 == 0 || i + 1 == documents.size()) {
      std::cerr << fmt::format("tokenize: {}/{} documents\n", i + 1, documents.size());
    }
  }
  train.flush();
  validation.flush();
  std::vector<std::string> written = train.written();
  written.insert(written.end(), validation.written().begin(), validation.written().end());
  for (const std::string& path : written) {
    std::error_code ec;
    fs::rename(path + kPartial, path, ec);
    DDP_CHECK(!ec, "cannot rename {}{} to {}: {}", path, kPartial, path, ec.message());
  }
  remove_earlier_shards(o, earlier, written);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t tokens = train.total() + validation.total();
  std::cout << fmt::format(
      "summary: {} documents ({} validation), {} bytes -> {} tokens ({:.2f} bytes/token; {} "
      "train, {} validation) in {:.1f} s; {}\n",
      documents.size(), val_documents, bytes, tokens,
      tokens > 0 ? static_cast<double>(bytes) / static_cast<double>(tokens) : 0.0, train.total(),
      validation.total(), s,
      train.total() > 0
          ? fmt::format("train with `train --model gpt2 --data {}`", o.out)
          : fmt::format("no training shard: every document went to validation (--val-every {}); "
                        "give these to train as --test-data",
                        o.val_every));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::optional<Options> o = parse(argc, argv);
    if (!o) {
      std::cout << kUsage;
      return 0;
    }
    return run(*o);
  } catch (const ddp::ValueError& e) {
    std::cerr << "tokenize: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tokenize: " << e.what() << "\n";
    return 1;
  }
}
