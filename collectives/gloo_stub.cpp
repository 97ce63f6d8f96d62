// Built when CMake did not find gloo: the factory says how to get it.
#include "collectives/backends.h"

namespace ddp {

std::shared_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store>, const GlooOptions&) {
  throw ValueError(
      "the gloo backend is not built: CMake did not find gloo (find_package(Gloo)). Install it "
      "(Debian/Ubuntu: apt-get install libgloo-dev) and reconfigure; or use the shm backend on "
      "one node or mpi under mpirun");
}

}  // namespace ddp
