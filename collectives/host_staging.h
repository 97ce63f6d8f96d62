// Host staging: how the host backends (shm, gloo, mpi) carry tensors that do not
// live in ordinary host memory, CUDA tensors above all (Note [host staging]).
//
// Note [host staging]: shm, gloo and mpi move bytes between host buffers. A
// tensor on any device other than the host (cpu:0) — a CUDA tensor, or a virtual
// cpu device of the tests (Note [virtual cpu devices]) — is staged through
// pinned host memory, in stream order:
//   1. stage(), on the caller's thread when the collective is issued: each input
//      is copied into a pinned host buffer on the caller's current stream (so
//      after whatever work produced it) and an event is recorded there; the host
//      buffers replace the tensors in the collective. A broadcast's non-root
//      ranks copy nothing: their data is overwritten.
//   2. before_run(), on the thread that runs the collective: waits for that event.
//   3. the backend runs the collective on the host buffers.
//   4. after_run(): copies the result back into the caller's tensor on `stream`
//      (the communicator's staging stream) and waits for that copy, so once the
//      Work is done the result is on the device for every stream.
// The host buffers live in the Collective until it completes; pinned blocks are
// reused only after the copies that read them finished (record_stream).
// Every step but the copies and the events is host code, so the logic runs and
// is tested on a machine without a GPU through virtual cpu devices.
#pragma once

#include "collectives/communicator_base.h"
#include "runtime/stream.h"

#include <memory>

namespace ddp::comm {

// Whether a tensor on `device` must be staged (every device but the host, cpu:0).
bool needs_staging(const Device& device);

struct HostStaging {
  Tensor device_output;           // the caller's tensor that receives the result
  std::shared_ptr<Event> copied;  // recorded after the copies to the host (step 1)
};

// Step 1: when c's tensors need staging, replaces them by pinned host copies and
// sets c.staging; `rank` decides whether a broadcast's input is copied.
void stage(Collective& c, int rank);
// Step 2: waits until the copies of step 1 have landed (no-op without staging).
void before_run(const Collective& c);
// Step 4: the result back into the caller's tensor on `stream`, waited for.
void after_run(const Collective& c, const Stream& stream);

}  // namespace ddp::comm
