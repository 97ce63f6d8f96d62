// Between the recorder (runtime/trace.cpp) and the process's side of the
// timeline (runtime/trace/process.cpp: the environment, exit, signals, fork, the
// file). Not for other code.
#pragma once

#include "runtime/trace.h"

#include <cstdint>

namespace ddp::trace::detail {

// The records every thread has published so far (this generation).
int64_t published_records();
// start() tells it: the file is due again at exit; handlers and hooks are set up.
void started(const StartOptions& options);

}  // namespace ddp::trace::detail
