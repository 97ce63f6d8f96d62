#include "runtime/error.h"

namespace ddp::detail {

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(fmt::format(
      "internal error in ddp at {}:{}: expected {} ({}). This is a bug in ddp; please report it "
      "with the command that triggered it.",
      file, line, cond, msg));
}

}  // namespace ddp::detail
