// The flight recorder: each rank keeps its last N collectives (sequence, op,
// dtype, count, bytes, label, state, times) and a status (the collective it
// waits in and since when, its last progress, its time blocked in collectives,
// the trainer's steps) in a region that ddprun reads without the rank's help
// (Note [flight region] in flight_layout.h), and writes them as JSON
// (flight_dump.h) on a collective's timeout or failure and on SIGUSR1.
//
// Note [flight recorder]
// Installed once per process by the first communicator of world size > 1
// (CommunicatorBase), so every program that runs collectives has one, under
// ddprun, mpirun, srun or a test's fork. It is a CollectiveObserver (Note
// [collective events]): each collective's moments become a few relaxed stores
// into a fixed slot (its cost per collective: docs/flight_recorder.md). Knobs:
//   DDP_FLIGHT_RECORDER_SIZE  collectives kept (default 2000; 0: no recorder at
//                             all: no records, no status, no SIGUSR1 handler)
//   DDP_FLIGHT_DIR            where dumps go (default $TMPDIR or /tmp, then
//                             ddp_flight-<uid>/); the file is flight_rank_<R>.json
//   DDPRUN_FLIGHT_SHM         set by ddprun: the directory of the regions
//                             (rank_<R>, Note [region file]); unset: anonymous memory
// Under ddprun the ranks leave the dumps of a failure to ddprun (see
// RecorderOptions::dump_on_failure). SIGUSR1 writes a dump from a thread of the recorder while the
// rank goes on (the handler only wakes that thread); the handler is installed only when SIGUSR1 has
// its default action, so a program's own handler is left alone. A fork()ed child's copy of the
// recorder goes quiet, and a communicator the child makes installs its own (Note [flight recorder
// and fork] in flight_recorder.cpp).
#pragma once

#include "collectives/collective_events.h"
#include "collectives/flight/flight_layout.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::flight {

struct RecorderOptions {
  size_t capacity = 2000;  // 0: no recorder
  std::string shm_dir;     // the region's directory (DDPRUN_FLIGHT_SHM); empty: anonymous
  std::string dump_dir;    // where dumps go
  bool handle_sigusr1 = true;
  // Dump on the first timeout or failure of a collective. Off under ddprun
  // (shm_dir set), which writes every rank's dump from its region when it
  // tears the group down (Note [dumps from the regions] in
  // launcher/flight_watch.h), so a rank's later dump never replaces that one.
  bool dump_on_failure = true;
};

inline constexpr size_t kDefaultCapacity = 2000;
inline constexpr size_t kMaxCapacity = 1'000'000;

// From DDP_FLIGHT_RECORDER_SIZE, DDPRUN_FLIGHT_SHM and DDP_FLIGHT_DIR. Throws
// ValueError naming the variable for a size that is not 0..kMaxCapacity.
RecorderOptions recorder_options_from_env();
// DDP_FLIGHT_DIR, else private_dump_base(): $TMPDIR/ddp_flight-<uid>, /tmp
// when TMPDIR is unset (Note [dump directories] in flight_dump.h).
std::string default_dump_dir();
// "flight_rank_<R>.json"
std::string dump_file_name(int rank);
// Host name and job id (Note [job id]: DDPRUN_RUN_ID, TORCHELASTIC_RUN_ID,
// SLURM_JOB_ID.SLURM_STEP_ID, Open MPI's job id, else set_job_id's; "" when none).
std::string host_name();
std::string job_id_from_env();
// The job id of a job no launcher names (rank 0's, through the store), for the
// recorders made after the call.
void set_job_id(std::string id);

class FlightRecorder : public CollectiveObserver {
 public:
  FlightRecorder(const RecorderOptions& options, int rank, int world_size);
  ~FlightRecorder() override;
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  void on_collective(const CollectiveEvent& event) noexcept override;

  // This rank's records and status now.
  RankSnapshot snapshot(std::string_view reason = {}) const;
  // Writes the snapshot to <dump dir>/flight_rank_<R>.json (replacing it
  // atomically). Returns the path; "" when it could not be written (logged).
  std::string dump(std::string_view reason) const noexcept;

  // The longest collective timeout of the rank's communicators, in the region's
  // header (ddprun's default --hang-timeout derives from it).
  void note_timeout(std::chrono::milliseconds timeout) noexcept;

  // The trainer's step marks (Note [straggler report] in straggler.h): one
  // thread, begin and end in turn.
  void step_begin() noexcept;
  void step_end() noexcept;

  RankStatus status() const;
  int rank() const { return rank_; }
  const std::string& region_path() const { return region_path_; }  // "" when anonymous
  const void* region() const { return base_; }                     // Note [flight region]

 private:
  void enqueued(const CollectiveInfo& info, int64_t t);
  template <typename Update>
  void update(const CollectiveInfo& info, Update&& update);
  void wait_begin(const CollectiveInfo& info, int64_t t);
  void wait_end(const CollectiveInfo& info, int64_t t);
  void dump_once(const CollectiveInfo& info, std::string_view what) noexcept;
  // Made before a fork() of this process (Note [flight recorder and fork]).
  bool forked_away() const noexcept;

  int rank_;
  size_t capacity_;
  std::string dump_dir_;
  bool dump_on_failure_;
  std::string region_path_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  SharedHeader* header_ = nullptr;
  SharedRecord* records_ = nullptr;
  std::atomic<bool> dumped_on_failure_{false};
  int64_t step_begin_ns_ = 0, step_begin_blocked_ns_ = 0;
  uint64_t generation_ = 0;  // the fork generation it was made in
};

// Installs this process's recorder once (the first call with world_size > 1
// wins; options from the environment); every call notes its communicator's
// collective `timeout` in the region (note_timeout). Never throws for a region
// it cannot map (it logs and uses anonymous memory); throws ValueError for a
// bad DDP_FLIGHT_RECORDER_SIZE.
void ensure_recorder(int rank, int world_size,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
// The process's recorder; null before ensure_recorder() or when it is off.
FlightRecorder* recorder();

// The step marks on the process's recorder; nothing without one.
void mark_step_begin() noexcept;
void mark_step_end() noexcept;

}  // namespace ddp::flight
