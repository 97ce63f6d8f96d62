// Errors: typed exceptions and the two checks of STYLE.md.
//
//   DDP_CHECK(cond, fmt, args...)             user or configuration error -> ddp::ValueError
//   DDP_CHECK_T(Type, cond, fmt, args...)     same, with a chosen exception type
//   DDP_ASSERT(cond, fmt, args...)            broken invariant -> ddp::InternalError
//
// Messages are formatted only when the check fails. Library code never exits.
#pragma once

#include "runtime/fmt.h"

#include <stdexcept>
#include <string>

namespace ddp {

// Base of every exception ddp throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Bad value from the user: a shape, a dtype, an option, an environment variable.
class ValueError : public Error {
  using Error::Error;
};
// A device that does not exist, is not available, or does not match.
class DeviceError : public Error {
  using Error::Error;
};
// A device allocation that could not be satisfied.
class OutOfMemoryError : public Error {
  using Error::Error;
};
// A CUDA, cuBLAS or other vendor call that failed.
class CudaError : public Error {
  using Error::Error;
};
// An invariant of ddp itself is broken: a bug to report.
class InternalError : public Error {
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_internal(const char* file, int line, const char* cond,
                                 const std::string& msg);
}  // namespace detail

}  // namespace ddp

#define DDP_LIKELY(x) __builtin_expect(!!(x), 1)

#define DDP_CHECK_T(Type, cond, ...)          \
  do {                                        \
    if (!DDP_LIKELY(cond)) {                  \
      throw Type(::fmt::format(__VA_ARGS__)); \
    }                                         \
  } while (0)

#define DDP_CHECK(cond, ...) DDP_CHECK_T(::ddp::ValueError, cond, __VA_ARGS__)

#define DDP_ASSERT(cond, ...)                                                               \
  do {                                                                                      \
    if (!DDP_LIKELY(cond)) {                                                                \
      ::ddp::detail::throw_internal(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
    }                                                                                       \
  } while (0)
