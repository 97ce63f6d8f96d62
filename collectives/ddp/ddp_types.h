// Small types shared by DistributedDataParallel and its reducer.
#pragma once

#include "runtime/error.h"

#include <cstdint>
#include <string>

namespace ddp {

// The built-in comm hooks (Note [comm hooks] in collectives/ddp/comm_hook.h):
// DdpOptions::comm_hook registers one of them.
enum class CommHook { none, bf16, fp16 };

inline const char* comm_hook_name(CommHook hook) {
  switch (hook) {
    case CommHook::none:
      return "none";
    case CommHook::bf16:
      return "bf16";
    case CommHook::fp16:
      return "fp16";
  }
  return "?";
}

inline CommHook parse_comm_hook(const std::string& text) {
  if (text == "none") return CommHook::none;
  if (text == "bf16") return CommHook::bf16;
  if (text == "fp16") return CommHook::fp16;
  throw ValueError("comm hook '" + text + "': valid values are none, bf16, fp16");
}

// Timing of the last synchronized backward, for benchmarks (bench train).
struct CommStats {
  double comm_s = 0;         // the backend's time running the buckets' all_reduces
                             // (Work::duration; 0 where the backend does not measure)
  double exposed_s = 0;      // time waited for them, not hidden by backward: in finish_backward(),
                             // plus in_backward_s
  double in_backward_s = 0;  // of exposed_s, the wait for the last bucket at its launch, inside
                             // the backward (Note [last bucket on the caller] in reducer.cpp)
  int64_t buckets = 0;
  int64_t bytes = 0;  // bytes this rank passed to the comm hook's collectives
                      // (after compression; all_gather: its input)
};

}  // namespace ddp
