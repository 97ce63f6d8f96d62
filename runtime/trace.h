// The timeline: every rank records what its threads (and its GPU streams) do, as
// spans, instants and flow arrows, and writes them to a file at exit; ddprun
// merges the ranks' files into one Chrome trace (docs/observability.md).
//
//   trace::Span span("forward", "train", {{"step", 12}});  // RAII: begin now, end at scope exit
//   trace::instant("bucket ready", "ddp", {{"bucket", 3}});
//
// Note [timeline]
// Tracing is on once start() ran: start_from_env() does when DDP_TRACE=DIR is set
// (init_process_group, train and bench call it; ddprun never does, so the
// launcher does not record itself). Every thread records into a buffer of its
// own (no lock, no shared cache line: the writer publishes each record with one
// release store), so recording costs a clock read and ~180 bytes of copying;
// off, every entry point is one relaxed load of a global flag and a predictable
// branch, and nothing else runs. Recording never throws and never ends the
// process: a record that cannot get memory is counted as dropped.
// Records are begin/end pairs (a Span), instants and complete spans with a
// known duration (device spans, resolved later). A slice may start or end a
// flow arrow (FlowBinding): the arrow is bound to that slice itself, so every
// viewer draws it between the right slices whatever the order of the file.
// Each record belongs to a track: the recording thread's own (0), or a named
// track that is no thread (a GPU stream: trace::stream_track()); the begin/end
// records of one track must come from one thread. Times are steady_clock
// nanoseconds; the file records the offsets of this clock to the reference clock
// (Note [trace clocks] in runtime/trace/clock.h) and the merge aligns the ranks
// with them.
//
// The file, DIR/rank_<R>.json (runtime/trace/file.h; restarts of a ddprun group
// get names of their own), is written at exit when anything was recorded, on
// SIGTERM, SIGINT and SIGHUP (Note [trace on signals]), and when the program
// calls write_file() (train does at the end of a run). Spans still open then end
// at the moment of writing and say `unfinished`. Each thread keeps at most
// DDP_TRACE_MAX_EVENTS records (default 1,000,000, about 180 MB); later ones are
// counted as dropped. A process forked from a tracing one (without exec) does
// not record, write or handle signals for its parent (Note [trace and fork]).
#pragma once

#include "runtime/device.h"

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::trace {

namespace detail {
extern std::atomic<bool> g_on;
}  // namespace detail

// Whether this process records. Everything below is a no-op while it is false.
inline bool enabled() noexcept {
  return detail::g_on.load(std::memory_order_relaxed);
}

// steady_clock nanoseconds: the clock of every record.
int64_t now_ns() noexcept;

using Track = uint32_t;  // 0: the recording thread's own track

// An integer argument shown with the event; `key` must be a static string.
struct Arg {
  const char* key;  // trivial (records are not cleared before they are written); Arg{} is null
  int64_t value;
};
using Args = std::initializer_list<Arg>;  // at most kMaxArgs are kept
inline constexpr size_t kMaxArgs = 4;

class DeviceSpans;
namespace detail {
// Phases on a CUDA device (Note [device spans] in runtime/trace/gpu.h).
DeviceSpans* device_spans_for(const Device& device) noexcept;
void device_boundary(DeviceSpans* spans, std::string_view name, Args args) noexcept;
}  // namespace detail
inline constexpr size_t kMaxNameBytes = 70;  // longer names are cut

// The flow arrow a slice starts (out), ends (in) or passes (both); id 0: none.
struct FlowBinding {
  uint64_t id = 0;
  bool out = false;
  bool in = false;
  bool operator==(const FlowBinding&) const = default;
};

// ts 0 means now. `category` must be a static string ("train", "ddp", ...).
void begin(std::string_view name, const char* category, Args args = {}, int64_t ts = 0,
           Track track = 0, FlowBinding flow = {}) noexcept;
void end(int64_t ts = 0, Track track = 0) noexcept;
void complete(std::string_view name, const char* category, int64_t ts, int64_t duration_ns,
              Args args = {}, Track track = 0, FlowBinding flow = {}) noexcept;
void complete(std::string_view name, const char* category, int64_t ts, int64_t duration_ns,
              const std::vector<Arg>& args, Track track) noexcept;
void instant(std::string_view name, const char* category, Args args = {}, int64_t ts = 0,
             Track track = 0) noexcept;

// ids from new_flow_id() count up from 1 and stay below 2^63; collectives use
// ids of their own with the top bit set (collectives/trace_collectives.cpp).
uint64_t new_flow_id() noexcept;

// A track that is no thread ("nccl stream (comm 0)"): the same id for the same
// name until the next start(), which forgets every track.
Track stream_track(std::string_view name);
// Counts the start() calls: a cache of tracks is stale once it changed.
uint64_t generation() noexcept;
// Names the calling thread's track ("main" for the process's first thread,
// "thread <tid>" until named). With replace false, only an unnamed track is named.
void name_thread(std::string_view name, bool replace = true);

// Begins a span now and ends it at scope exit (on the thread that made it).
class Span {
 public:
  explicit Span(std::string_view name, const char* category = "ddp", Args args = {}) noexcept {
    if (enabled()) {
      begin(name, category, args);
      open_ = true;
    }
  }
  ~Span() {
    if (open_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool open_ = false;
};

// Consecutive spans on this thread, as the phases of a step: next() ends the
// current one and begins the next at the same moment; the last one ends with
// close() or the object. Given a CUDA device, the phases are also timed on the
// device (Note [device spans] in runtime/trace/gpu.h).
class Phases {
 public:
  explicit Phases(const char* category) noexcept : category_(category) {}
  Phases(const char* category, const Device& device) noexcept : category_(category) {
    if (enabled() && device.is_cuda()) device_ = detail::device_spans_for(device);
  }
  ~Phases() { close(); }
  Phases(const Phases&) = delete;
  Phases& operator=(const Phases&) = delete;
  void next(std::string_view name, Args args = {}) noexcept {
    if (!open_ && !enabled()) return;
    const int64_t ts = now_ns();
    if (open_) end(ts);
    open_ = enabled();
    if (open_) begin(name, category_, args, ts);
    if (device_ != nullptr) detail::device_boundary(device_, open_ ? name : "", args);
  }
  void close() noexcept {
    if (!open_) return;
    end();
    open_ = false;
    if (device_ != nullptr) detail::device_boundary(device_, "", {});
  }

 private:
  const char* category_;
  bool open_ = false;
  DeviceSpans* device_ = nullptr;
};

// Who this process is, for the file's name and the merge (set by the process
// group's bootstrap; rank 0 of 1 until then).
struct RankInfo {
  int rank = 0;
  int world_size = 1;
  std::string run_id;    // the same on every rank of one run
  int restart = 0;       // ddprun's restart count
  std::string launcher;  // ddprun|mpirun|...
  std::string backend;
};
void set_rank_info(const RankInfo& info);
RankInfo rank_info();

// reference clock = local clock + offset_ns, measured around local_ns, within
// +-error_ns (Note [trace clocks] in runtime/trace/clock.h).
struct ClockSample {
  int64_t local_ns = 0;
  int64_t offset_ns = 0;
  int64_t error_ns = 0;
  std::string reference;  // "ddprun store at host:port", "rank 0 (all_gather)"
};
void add_clock_sample(const ClockSample& sample);

struct StartOptions {
  std::string dir;               // where the file goes; created if missing
  int64_t max_events = 1000000;  // per thread
  bool handle_signals = true;    // write on SIGTERM, SIGINT, SIGHUP
};
// Starts recording afresh; throws ValueError when the directory cannot be
// created. stop() ends recording (the records stay).
void start(const StartOptions& options);
void stop();
std::string directory();  // "" when never started

// DDP_TRACE=DIR (with DDP_TRACE_MAX_EVENTS): starts recording into DIR, once per
// process, with the launcher's rank (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK,
// SLURM_PROCID) until a process group says so. A bad value is reported on stderr
// and leaves tracing off: it never fails the program. Returns enabled().
bool start_from_env() noexcept;
// Whether DDP_TRACE is set: what every rank of a run sees alike, so the
// collectives tracing adds (Note [trace clocks]) are run on every rank or on
// none, also on a rank where start_from_env() failed.
bool requested();

// Writes this rank's file in DIR now (atomically: a temporary file, then a
// rename; rank_file_name() in runtime/trace/file.h) with everything recorded so
// far; returns its path. Throws Error when it cannot (the temporary is removed).
std::string write_file();

// Everything recorded so far, spans paired per track (for the file and the tests).
struct TraceEvent {
  char phase = 'X';  // X (span), i (instant)
  Track track = 0;   // never 0 here: a thread's own track has its own id
  int64_t ts = 0;
  int64_t duration_ns = 0;  // X
  FlowBinding flow;         // X
  std::string name;
  std::string category;
  std::vector<Arg> args;
  bool unfinished = false;  // X: still open when taken
};
struct TrackInfo {
  Track id = 0;
  std::string name;
  int64_t os_tid = 0;  // 0 for a stream track
};
struct Snapshot {
  RankInfo rank;
  std::vector<ClockSample> clock;
  std::vector<TrackInfo> tracks;
  std::vector<TraceEvent> events;
  int64_t dropped = 0;
  int64_t taken_ns = 0;
  int64_t pid = 0;
  std::string host;
};
Snapshot snapshot();

}  // namespace ddp::trace
