// bpe_encode: GPT-2 token ids of files with ddp's tokenizer (runtime/data/bpe.h),
// for tests/e2e/bpe_js.sh, which compares them with Encoder.js's.
//
//   bpe_encode [--dir DIR] [--time] FILE...
//
//   --dir DIR   the vocabulary (default: $DDP_GPT2_BPE_DIR or /usr/share/datasets/gpt2-bpe)
//   --time      on stderr: bytes, tokens, seconds and MB/s of encode alone
//
// Prints one line a file: its ids separated by spaces (empty for an empty file).
// Exits 1 with the message on any error, 2 on a usage error.
#include "runtime/data/bpe.h"
#include "runtime/error.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), "bpe_encode: cannot read '{}'", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = ddp::gpt2_bpe_dir();
  bool time = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (arg == "--time") {
      time = true;
    } else if (!arg.empty() && arg[0] == '-') {
      std::cerr << "bpe_encode: unknown option '" << arg
                << "'\nusage: bpe_encode [--dir DIR] [--time] FILE...\n";
      return 2;
    } else {
      files.push_back(arg);
    }
  }
  try {
    const ddp::Gpt2Tokenizer tokenizer = ddp::Gpt2Tokenizer::load(dir);
    double seconds = 0;
    int64_t bytes = 0, tokens = 0;
    std::string out;
    for (const std::string& file : files) {
      const std::string text = read_bytes(file);
      const auto start = std::chrono::steady_clock::now();
      const std::vector<int32_t> ids = tokenizer.encode(text);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      bytes += static_cast<int64_t>(text.size());
      tokens += static_cast<int64_t>(ids.size());
      out.clear();
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k > 0) out += ' ';
        out += std::to_string(ids[k]);
      }
      out += '\n';
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
    if (time) {
      std::fprintf(stderr, "bpe_encode: %lld bytes, %lld tokens in %.3f s: %.2f MB/s\n",
                   static_cast<long long>(bytes), static_cast<long long>(tokens), seconds,
                   seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0);
    }
    return std::fflush(stdout) == 0 ? 0 : 1;
  } catch (const ddp::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
