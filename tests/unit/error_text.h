// The message of the error a function throws: the usage-error tests check what a
// message names. Shared by the unit test files, which a unity build compiles
// several to a translation unit (Note [unity test builds] in tests/CMakeLists.txt).
#pragma once

#include "runtime/error.h"

#include <functional>
#include <string>

namespace ddp::test_util {

// The message of the ValueError `fn` throws, or "(no error)".
inline std::string error_text(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

// The message of the ValueError `f` throws, or "" when it throws none.
template <typename Fn>
std::string value_error(Fn&& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

// The message of the E `fn` throws, or "no exception of the expected type".
template <typename E, typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "no exception of the expected type";
}

}  // namespace ddp::test_util
