// Built when CMake did not find MPI: the factory says how to get it.
#include "collectives/backends.h"

namespace ddp {

bool mpi_built() {
  return false;
}

std::shared_ptr<Communicator> make_mpi_communicator(CommOptions) {
  throw ValueError(
      "the mpi backend is not built: CMake did not find MPI (find_package(MPI COMPONENTS CXX)). "
      "Install an MPI (Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin) and reconfigure; "
      "or launch with ddprun and use the shm or gloo backend");
}

}  // namespace ddp
