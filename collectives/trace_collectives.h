// The collectives on the timeline (Note [timeline collectives]) and the clock
// alignment of the ranks' timelines (Note [trace clocks] in runtime/trace/clock.h).
//
// Note [timeline collectives]
// One CollectiveObserver (collectives/collective_events.h) turns every
// collective's moments into records of the tracer (runtime/trace.h):
//   enqueued   a slice "enqueue <op> (<label>)" of 1 ns on the issuing thread,
//              where a flow arrow starts (bound to the slice: Note [timeline]);
//   started .. completed / failed
//              a slice "<op> (<label>)" where the collective ran: the
//              communication thread of shm, gloo and mpi (named "<backend> comm
//              thread (comm N)" on first use), the caller's thread when a waiter
//              or the local backend ran it, or the track "nccl stream (comm N)"
//              with the GPU's times on nccl (Note [nccl events]; written whole
//              when it ends, since the thread that tells its end may differ);
//              the arrow ends there;
//   wait_begin .. wait_end
//              a slice "wait <op> (<label>)" on the waiting thread: the time a
//              thread was blocked by communication (exposed), category "wait";
//   timed_out, failed
//              instants.
// Every slice carries the sequence number, the bytes and the communicator. The
// observer is installed once per process, by the first communicator made while
// tracing is on.
#pragma once

#include "collectives/bootstrap.h"
#include "runtime/trace/clock.h"

#include <string>

namespace ddp {

class TcpStore;

// Installs the timeline's observer when tracing is on (once per process).
void attach_trace_observer();

// After init_process_group: tells the tracer who this rank is, shares the run's
// id and measures the clock's offset (ddprun's store when the launcher hosts
// it, else rank 0 over the communicator). Collective when DDP_TRACE is set
// (Note [trace participation] in trace_collectives.cpp), so every rank calls
// it; nothing when tracing is neither requested nor on. Never throws: what
// fails costs a warning and the sample.
void trace_process_group(const ProcessGroup& pg);

// At the end of a run: measures the offset again and writes this rank's file.
// Without ddprun (mpirun, srun) rank 0 then merges every rank's file into
// DIR/trace.json after a barrier (collective when DDP_TRACE is set: every rank
// calls it). pg null: a single process, which merges its own file. Returns what
// the merge did, for the caller to print ("" where none was done here: ddprun
// merges, or the rank is not 0, or tracing is off). Never throws: a file that
// cannot be written, a failed measurement or merge is a warning or the returned
// text; the run's result stands.
std::string finish_trace(const ProcessGroup* pg);

// The measurements (Note [trace clocks]): `requests` TIME requests to the store's
// server, or `rounds` all_gather rounds against rank 0 (collective).
trace::OffsetEstimate measure_offset_with_store(TcpStore& store, int requests = 16);
trace::OffsetEstimate measure_offset_with_comm(Communicator& comm, int rounds = 8);

}  // namespace ddp
