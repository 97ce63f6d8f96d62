// NCCL, opened on first use (Note [vendor libraries on first use] in
// runtime/dynamic_library.h): the functions the nccl backend calls, as pointers
// with NCCL's own signatures. Internal to the nccl backend: it includes <nccl.h>,
// but nothing links libnccl.
#pragma once

#include <nccl.h>

namespace ddp::nccl {

struct Library {
  decltype(&ncclGetVersion) get_version;
  decltype(&ncclGetErrorString) get_error_string;
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRank) comm_init_rank;
  decltype(&ncclCommDestroy) comm_destroy;
  decltype(&ncclCommAbort) comm_abort;
  decltype(&ncclCommGetAsyncError) comm_get_async_error;
  decltype(&ncclAllReduce) all_reduce;
  decltype(&ncclBroadcast) broadcast;
  decltype(&ncclAllGather) all_gather;
  decltype(&ncclReduceScatter) reduce_scatter;
  decltype(&ncclReduce) reduce;
};

// Loads libnccl.so.<NCCL_MAJOR> once per process; throws DeviceError naming the
// library, where it was looked for and how to get it.
const Library& library();

}  // namespace ddp::nccl
