// The message of the ValueError `fn` throws, or "(no error)": the usage-error
// tests check what a message names (dataset_test.cpp, file_data_test.cpp,
// token_shards_test.cpp).
#pragma once

#include "runtime/error.h"

#include <functional>
#include <string>

namespace ddp::test_util {

inline std::string error_text(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace ddp::test_util
