// MPS (Apple Metal) support for builds without Metal: every Linux build. The
// device type exists so that "mps" parses and gets a clear error, not "unknown".
#include "runtime/mps/mps.h"

namespace ddp::mps {

bool compiled() {
  return false;
}
int device_count() {
  return 0;
}
std::string unavailable_reason() {
  return "this build of ddp has no Metal support (MPS exists only in builds for Apple "
         "platforms); use cpu or cuda";
}

}  // namespace ddp::mps
