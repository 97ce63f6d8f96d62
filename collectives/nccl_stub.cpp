// Built when the build has no CUDA or CMake did not find NCCL: the factory says
// how to get it.
#include "collectives/backends.h"

namespace ddp {

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store>, const NcclOptions&) {
  throw ValueError(
      "the nccl backend is not built: it needs a CUDA build (DDP_CUDA=AUTO|ON with nvcc found) and "
      "NCCL (cmake/FindNCCL.cmake looks in NCCL_ROOT, the CUDA toolkit and the system paths; "
      "e.g. apt-get install libnccl-dev, or pip install nvidia-nccl-cu12). Reconfigure after "
      "installing; without GPUs use gloo, shm or mpi");
}

}  // namespace ddp
