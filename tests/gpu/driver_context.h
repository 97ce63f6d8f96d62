// The CUDA driver's view of primary contexts, for tests that check where a
// process created them. The driver library (libcuda.so.1) is opened with dlopen
// rather than linked: the test binary must start on machines without a driver,
// where every gpu test skips.
#pragma once

#include <optional>
#include <string>

namespace ddp::gpu_test {

// Whether CUDA device `ordinal` has an active primary context in this process
// (cuDevicePrimaryCtxGetState). nullopt, with the reason in *why, when the driver
// cannot be loaded or the query fails. Asking creates no context.
std::optional<bool> primary_context_active(int ordinal, std::string* why);

}  // namespace ddp::gpu_test
