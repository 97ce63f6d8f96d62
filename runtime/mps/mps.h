// MPS backend queries. Compiled from mps_stub.cpp on builds without Metal.
#pragma once

#include <string>

namespace ddp::mps {

bool compiled();
int device_count();
std::string unavailable_reason();

}  // namespace ddp::mps
