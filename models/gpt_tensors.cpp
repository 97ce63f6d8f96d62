// gpt_tensors MODEL: prints a GPT config's parameter count and tensor names and shapes
// as JSON (models/gpt_config.h), the C++ side that tests/e2e/torch_gpt_test.sh compares
// with models/torch_gpt.py's model. Exit 2 on a usage error or a bad model.
#include "models/gpt_config.h"
#include "runtime/error.h"

#include <iostream>
#include <string>

namespace {
constexpr const char* kUsage =
    "usage: gpt_tensors MODEL\n"
    "  MODEL: gpt-tiny, gpt-mini, gpt2 or gpt:layers=..,d=..,heads=..,ctx=..[,vocab=..]\n";
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    (argc == 2 ? std::cout : std::cerr) << kUsage;
    return argc == 2 ? 0 : 2;
  }
  try {
    std::cout << ddp::models::tensors_json(ddp::models::gpt_config(argv[1]));
  } catch (const ddp::Error& e) {
    std::cerr << "gpt_tensors: " << e.what() << "\n\n" << kUsage;
    return 2;
  }
  return 0;
}
