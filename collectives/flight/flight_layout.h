// The flight recorder's memory: one region per rank, a status header and a ring
// of the rank's last N collectives, laid out so that another process (ddprun)
// can read it while the rank runs, after it stopped (SIGSTOP, a deadlock) or
// after it died, without the rank's cooperation.
//
// Note [flight region]
// Under ddprun the region is a file, <DDPRUN_FLIGHT_SHM>/rank_<R>, that the rank
// creates and maps MAP_SHARED (on /dev/shm: memory, not disk); elsewhere it is
// anonymous memory. Every field is a 64-bit atomic, written with relaxed stores,
// so the writer's cost is a few stores per moment of a collective and a reader
// in another process (or in a thread of the rank) sees no torn word.
//
// A record is guarded by a seqlock: writers make `lock` odd (a CAS, which also
// keeps two writer threads of the rank apart), write, and make it even again
// with release order; a reader copies the record between two acquire reads of
// `lock` and keeps the copy only if both are the same even value. A rank
// stopped in the middle of a write leaves one record odd: the reader gives up
// on it after a few tries and counts it as torn (never blocks). The header's
// wait section (who waits in which collective, since when) has its own seqlock;
// its other fields are independent counters.
//
// `index` is the record's place in the sequence of records ever written
// (header.recorded counts them); the record of index i lives in slot i mod N. A
// reader keeps a slot only if its index is one of the last N, so a slot being
// reused is never mistaken for the collective it held before.
#pragma once

#include "collectives/communicator.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::flight {

inline constexpr uint64_t kMagic = 0x3130544C'46504444ULL;  // "DDPFLT01" little-endian
inline constexpr uint64_t kVersion = 1;
inline constexpr size_t kLabelWords = 6;  // 48 bytes: kMaxLabelBytes (47) and a NUL
inline constexpr size_t kNameWords = 4;   // 32 bytes for the backend and the job

using Word = std::atomic<uint64_t>;
static_assert(Word::is_always_lock_free, "the region needs lock-free 64-bit atomics");

enum class RecordState : uint8_t { enqueued = 0, started = 1, completed = 2, failed = 3 };
std::string_view record_state_name(RecordState state);

// Bits of SharedRecord::shape's flags byte.
inline constexpr uint8_t kFlagTimedOut = 1;  // a wait on it gave up (CommTimeoutError)

struct SharedRecord {
  Word lock;      // seqlock: odd while written
  Word index;     // records written before this one (Note [flight region])
  Word sequence;  // the communicator's sequence number
  Word ident;     // comm id (low 32 bits) | root (high 32 bits)
  Word shape;     // kind | op << 8 | dtype << 16 | state << 24 | flags << 32
  Word count, bytes;
  Word enqueued_ns, started_ns, finished_ns;  // steady clock; 0: not yet
  Word wait_begin_ns;                         // the first wait on it; 0: none
  Word wait_ns;                               // time threads spent waiting on it, waits ended
  Word label[kLabelWords];                    // NUL-terminated
};

struct SharedHeader {
  Word magic;  // written last when the region is ready
  Word version, capacity, header_bytes, record_bytes;
  Word pid, rank, world_size;
  Word backend[kNameWords];  // NUL-terminated
  Word job[kNameWords];      // DDPRUN_RUN_ID, SLURM_JOB_ID, ... ("" when none)
  Word created_ns;
  Word recorded;          // records written so far
  Word last_progress_ns;  // the latest enqueue, completion or step mark
  Word first_ns;          // the first collective's enqueue
  Word last_ns;           // the latest moment of any collective
  // The wait section (its own seqlock): threads blocked in Work::wait.
  Word wait_lock;
  Word waiters;                   // threads blocked now
  Word wait_since_ns;             // since when at least one is (0: none)
  Word wait_comm, wait_sequence;  // the collective the first of them waits on
  Word blocked_ns;                // cumulative time with a thread blocked, waits ended
  // The trainer's step marks (Note [straggler report] in straggler.h).
  Word steps, step_ns, step_blocked_ns;
  // The longest collective timeout of the rank's communicators (CommOptions::
  // timeout, ns; 0: not known): ddprun's default --hang-timeout derives from it.
  Word collective_timeout_ns;
  // The first marked step's share of step_ns and step_blocked_ns (its warm-up: Note
  // [straggler report]); 0 until it ends.
  Word first_step_ns, first_step_blocked_ns;
  Word reserved[5];
};

size_t region_bytes(size_t capacity);

// ---- What a reader gets ------------------------------------------------------------------

struct CollectiveRecord {
  int comm = 0;
  int64_t sequence = 0;
  CollectiveKind kind = CollectiveKind::barrier;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  DType dtype = DType::u8;
  int64_t count = 0, bytes = 0;
  std::string label;
  RecordState state = RecordState::enqueued;
  bool timed_out = false;
  int64_t enqueued_ns = 0, started_ns = 0, finished_ns = 0, wait_begin_ns = 0, wait_ns = 0;
};

struct RankStatus {
  int64_t last_progress_ns = 0, first_ns = 0, last_ns = 0;
  int64_t waiters = 0, wait_since_ns = 0, wait_comm = -1, wait_sequence = -1;
  int64_t blocked_ns = 0;
  int64_t steps = 0, step_ns = 0, step_blocked_ns = 0;
  int64_t first_step_ns = 0, first_step_blocked_ns = 0;  // 0: not known
  int64_t collective_timeout_ns = 0;                     // 0: not known
  // The wait section was being written on every try (a rank stopped inside
  // Work::wait's bookkeeping): waiters and wait_* are the last, maybe torn, copy.
  bool wait_torn = false;
};

// What a launcher knows of the process that a dump's records come from.
enum class ProcessState { unknown, running, stopped, exited };
std::string_view process_state_name(ProcessState state);

// One rank's recorder as read at one moment (taken_ns), from its region or
// from a dump.
struct RankSnapshot {
  int rank = 0;
  int world_size = 1;
  int64_t pid = 0;
  std::string backend, job, host;
  int64_t taken_ns = 0;  // steady clock of the rank's node
  ProcessState process = ProcessState::unknown;
  std::string process_detail;  // "SIGSTOP", "exit code 1", ...
  std::string reason;          // why the dump was written
  int64_t capacity = 0, recorded = 0;
  int64_t torn = 0;  // records being written when read (skipped)
  RankStatus status;
  std::vector<CollectiveRecord> records;  // oldest first
};

// Reads a region (Note [flight region]); `bytes` is the mapping's size. Throws
// ValueError when it is not a flight recorder region of this version (or still
// being set up). Never blocks on a writer.
RankSnapshot read_region(const void* region, size_t bytes, int64_t now_ns);
// Only the status of a region read_region() accepts.
RankStatus read_region_status(const void* region, size_t bytes);

// Packs and unpacks strings in words (NUL-terminated, cut to fit).
void store_string(Word* words, size_t n, std::string_view s);
std::string load_string(const Word* words, size_t n);

}  // namespace ddp::flight
