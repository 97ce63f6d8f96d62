#include "runtime/trace.h"

#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/trace_file.h"
#include "runtime/trace_gpu.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

namespace ddp::trace {

namespace detail {
std::atomic<bool> g_on{false};
}  // namespace detail

namespace {

// One record as a thread writes it: fixed size, no allocation. Left uninitialised
// until written (a chunk is not cleared first).
struct Record {
  int64_t ts;
  int64_t extra;  // X: the duration; s/t/f: the flow id
  const char* category;
  Arg args[kMaxArgs];
  Track track;
  char phase;  // B, E, X, i, s, t, f
  uint8_t name_bytes;
  char name[kMaxNameBytes];
};

constexpr size_t kChunkRecords = 1024;
struct Chunk {
  Record records[kChunkRecords];
};

// One thread's records. Only its thread writes; snapshot() reads the published
// prefix (Note [timeline]).
struct Buffer {
  Track track = 0;
  int64_t max_records = 0;
  std::atomic<size_t> published{0};
  std::atomic<int64_t> dropped{0};
  std::mutex mutex;            // guards chunks (growth vs. snapshot)
  std::vector<Chunk*> chunks;  // never freed: a snapshot may read them at exit
  size_t written = 0;          // the writer's own count
  Chunk* current = nullptr;    // the writer's chunk
};

struct Registry {
  std::mutex mutex;
  std::vector<Buffer*> buffers;  // this generation's (older ones are leaked, never freed)
  std::vector<TrackInfo> tracks;
  std::map<std::string, Track, std::less<>> stream_tracks;
  Track next_track = 1;
  std::atomic<uint64_t> generation{1};
  std::atomic<uint64_t> next_flow{1};
  StartOptions options;
  RankInfo rank;
  std::vector<ClockSample> clock;
  std::mutex write_mutex;  // one write_file() at a time
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: threads may record at exit
  return *r;
}

int64_t os_tid() {
  return static_cast<int64_t>(::gettid());
}

Buffer* register_thread() {
  Registry& r = registry();
  auto* buffer = new Buffer();
  std::lock_guard<std::mutex> lock(r.mutex);
  buffer->track = r.next_track++;
  buffer->max_records = r.options.max_events;
  const int64_t tid = os_tid();
  const std::string name = tid == ::getpid() ? "main" : fmt::format("thread {}", tid);
  r.tracks.push_back({buffer->track, name, tid});
  r.buffers.push_back(buffer);
  return buffer;
}

thread_local Buffer* t_buffer = nullptr;
thread_local uint64_t t_generation = 0;
thread_local bool t_named = false;

Buffer& my_buffer() {
  const uint64_t generation = registry().generation.load(std::memory_order_acquire);
  if (t_buffer == nullptr || t_generation != generation) {
    t_buffer = register_thread();
    t_generation = generation;
    t_named = false;
  }
  return *t_buffer;
}

// The slot for the next record of this thread, or null when the thread has
// recorded its maximum (counted as dropped).
Record* claim(Buffer& b) {
  if (static_cast<int64_t>(b.written) >= b.max_records) {
    b.dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  if (b.written % kChunkRecords == 0) {
    auto* chunk = static_cast<Chunk*>(::operator new(sizeof(Chunk)));
    std::lock_guard<std::mutex> lock(b.mutex);
    b.chunks.push_back(chunk);
    b.current = chunk;
  }
  return &b.current->records[b.written % kChunkRecords];
}

void publish(Buffer& b) {
  b.published.store(++b.written, std::memory_order_release);
}

void record(char phase, std::string_view name, const char* category, const Arg* args,
            size_t arg_count, int64_t ts, int64_t extra, Track track) noexcept {
  if (!enabled()) return;
  Buffer& b = my_buffer();
  Record* r = claim(b);
  if (r == nullptr) return;
  r->ts = ts != 0 ? ts : now_ns();
  r->extra = extra;
  r->category = category;
  size_t i = 0;
  for (; i < std::min(arg_count, kMaxArgs); ++i) r->args[i] = args[i];
  for (; i < kMaxArgs; ++i) r->args[i] = Arg{};
  r->track = track != 0 ? track : b.track;
  r->phase = phase;
  size_t bytes = std::min(name.size(), kMaxNameBytes);
  if (bytes < name.size()) {  // cut at a character boundary: the file must be valid UTF-8
    while (bytes > 0 && (static_cast<unsigned char>(name[bytes]) & 0xC0) == 0x80) --bytes;
  }
  std::memcpy(r->name, name.data(), bytes);
  r->name_bytes = static_cast<uint8_t>(bytes);
  publish(b);
}

// ---- writing at exit and on signals ---------------------------------------------------

void write_quietly(const char* why) noexcept {
  try {
    write_file();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: DDP_TRACE: could not write the trace %s: %s\n", why, e.what());
  }
}

// The records published when the file was last written: at exit it is written
// again only when there are more (train writes it at the end of its run).
std::atomic<int64_t> g_written_records{-1};

int64_t published_records() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  int64_t n = 0;
  for (Buffer* b : r.buffers)
    n += static_cast<int64_t>(b->published.load(std::memory_order_acquire));
  return n;
}

void at_exit() {
  if (registry().options.dir.empty()) return;
  if (g_written_records.load() == published_records()) return;
  write_quietly("at exit");
}

// Note [trace on signals]: the handler only writes the signal's number into a
// pipe (async-signal-safe); a thread of ours writes the file, puts the previous
// action back and raises the signal again, which then does what it did before.
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
int g_pipe[2] = {-1, -1};
pid_t g_signal_pid = 0;
struct sigaction g_previous[3];

void on_signal(int sig) {
  const int saved = errno;
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &byte, 1);
  errno = saved;
}

void signal_thread(int read_fd) {
  for (;;) {
    char byte = 0;
    const ssize_t n = ::read(read_fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const int sig = static_cast<unsigned char>(byte);
    write_quietly(fmt::format("on signal {}", sig).c_str());
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      if (kSignals[i] == sig) ::sigaction(sig, &g_previous[i], nullptr);
    }
    ::kill(::getpid(), sig);
  }
}

void handle_signals() {
  if (g_signal_pid == ::getpid()) return;  // once per process (a forked child starts its own)
  if (::pipe2(g_pipe, O_CLOEXEC) != 0) return;
  g_signal_pid = ::getpid();
  std::thread(signal_thread, g_pipe[0]).detach();
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(kSignals[i], &action, &g_previous[i]);
  }
}

// Who this process is before a process group says so: the launcher's variables
// (runtime/env.h), so that ranks of a program without one still write their own
// files, rank_<R>.json, of one run.
RankInfo rank_from_env() {
  RankInfo info;
  for (const auto& [rank, size, launcher] :
       {std::tuple{env::kRank, env::kWorldSize, "ddprun"},
        std::tuple{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"},
        std::tuple{"PMI_RANK", "PMI_SIZE", "pmi"},
        std::tuple{"SLURM_PROCID", "SLURM_NTASKS", "slurm"}}) {
    const std::optional<std::string> r = env::get(rank);
    if (!r) continue;
    info.rank = static_cast<int>(std::strtol(r->c_str(), nullptr, 10));
    info.world_size =
        static_cast<int>(std::strtol(env::get(size).value_or("1").c_str(), nullptr, 10));
    info.launcher = launcher;
    break;
  }
  info.run_id = env::get(env::kRunId).value_or("");
  info.restart = static_cast<int>(
      std::strtol(env::get(env::kRestartCount).value_or("0").c_str(), nullptr, 10));
  return info;
}

// DDP_TRACE=DIR at start-up (Note [timeline]); a bad value is reported, not thrown
// (this runs before main).
bool start_from_env() {
  try {
    const std::optional<std::string> dir = env::get(env::kTrace);
    if (!dir) return false;
    StartOptions options;
    options.dir = *dir;
    set_rank_info(rank_from_env());
    if (auto max = env::get_int(env::kTraceMaxEvents)) {
      DDP_CHECK(*max > 0, "{}={} must be a positive number of records", env::kTraceMaxEvents, *max);
      options.max_events = *max;
    }
    start(options);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: tracing is off: %s\n", e.what());
    return false;
  }
}

[[maybe_unused]] const bool g_started_from_env = start_from_env();

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

}  // namespace

int64_t now_ns() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // steady_clock's clock on Linux
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

void begin(std::string_view name, const char* category, Args args, int64_t ts,
           Track track) noexcept {
  record('B', name, category, args.begin(), args.size(), ts, 0, track);
}

void end(int64_t ts, Track track) noexcept {
  record('E', {}, nullptr, nullptr, 0, ts, 0, track);
}

void complete(std::string_view name, const char* category, int64_t ts, int64_t duration_ns,
              Args args, Track track) noexcept {
  record('X', name, category, args.begin(), args.size(), ts, std::max<int64_t>(0, duration_ns),
         track);
}

void complete(std::string_view name, const char* category, int64_t ts, int64_t duration_ns,
              const std::vector<Arg>& args, Track track) noexcept {
  record('X', name, category, args.data(), args.size(), ts, std::max<int64_t>(0, duration_ns),
         track);
}

void instant(std::string_view name, const char* category, Args args, int64_t ts,
             Track track) noexcept {
  record('i', name, category, args.begin(), args.size(), ts, 0, track);
}

void flow(FlowStep step, uint64_t id, int64_t ts, Track track) noexcept {
  record(static_cast<char>(step), "flow", "flow", nullptr, 0, ts, static_cast<int64_t>(id), track);
}

uint64_t new_flow_id() noexcept {
  return registry().next_flow.fetch_add(1, std::memory_order_relaxed);
}

Track stream_track(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (auto it = r.stream_tracks.find(name); it != r.stream_tracks.end()) return it->second;
  const Track id = r.next_track++;
  r.stream_tracks.emplace(std::string(name), id);
  r.tracks.push_back({id, std::string(name), 0});
  return id;
}

void name_thread(std::string_view name, bool replace) {
  if (!enabled() || (!replace && t_named)) return;
  Buffer& b = my_buffer();
  if (!replace && t_named) return;
  t_named = true;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (TrackInfo& t : r.tracks) {
    if (t.id == b.track && (replace || t.name.starts_with("thread "))) t.name = std::string(name);
  }
}

void set_rank_info(const RankInfo& info) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.rank = info;
}

RankInfo rank_info() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.rank;
}

void add_clock_sample(const ClockSample& sample) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.clock.push_back(sample);
}

void start(const StartOptions& options) {
  DDP_CHECK(options.max_events > 0, "trace::start: max_events {} must be positive",
            options.max_events);
  if (!options.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.dir, ec);
    DDP_CHECK(!ec && std::filesystem::is_directory(options.dir),
              "{}='{}': cannot create the trace directory: {}; set it to a writable directory",
              env::kTrace, options.dir, ec ? ec.message() : "not a directory");
  }
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const bool first = r.options.dir.empty() && r.buffers.empty() && r.tracks.empty();
    r.options = options;
    r.buffers.clear();
    r.tracks.clear();
    r.stream_tracks.clear();
    r.clock.clear();
    r.generation.fetch_add(1, std::memory_order_acq_rel);
    g_written_records.store(-1);
    if (first) std::atexit(at_exit);
  }
  detail::g_on.store(true, std::memory_order_release);
  if (options.handle_signals && !options.dir.empty()) handle_signals();
}

void stop() {
  detail::g_on.store(false, std::memory_order_release);
}

std::string directory() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.options.dir;
}

namespace {

// Pairs the begin/end records of each track of one buffer into spans; spans
// still open end at `taken` (Note [timeline]).
void pair_records(const std::vector<const Record*>& records, int64_t taken,
                  std::vector<TraceEvent>& out) {
  std::map<Track, std::vector<size_t>> open;  // per track: indices into `out`
  for (const Record* r : records) {
    if (r->phase == 'E') {
      auto& stack = open[r->track];
      if (stack.empty()) continue;  // an end without its begin (recording began inside it)
      TraceEvent& e = out[stack.back()];
      stack.pop_back();
      e.duration_ns = std::max<int64_t>(0, r->ts - e.ts);
      continue;
    }
    TraceEvent e;
    e.phase = r->phase == 'B' ? 'X' : r->phase;
    e.track = r->track;
    e.ts = r->ts;
    e.name.assign(r->name, r->name_bytes);
    e.category = r->category != nullptr ? r->category : "";
    for (const Arg& a : r->args) {
      if (a.key != nullptr) e.args.push_back(a);
    }
    if (r->phase == 'X') e.duration_ns = r->extra;
    if (r->phase == 's' || r->phase == 't' || r->phase == 'f')
      e.id = static_cast<uint64_t>(r->extra);
    out.push_back(std::move(e));
    if (r->phase == 'B') open[r->track].push_back(out.size() - 1);
  }
  for (auto& [track, stack] : open) {
    for (size_t i : stack) {
      out[i].duration_ns = std::max<int64_t>(0, taken - out[i].ts);
      out[i].unfinished = true;
    }
  }
}

// DDP_TRACE_TEST_SKEW_NS=N: rank R's file reads as if its clock ran R x N ns ahead,
// the view a rank on another node has; its clock samples say so too, so the
// merge must take it back out (the e2e test of the alignment).
void skew_for_testing(Snapshot& s) {
  int64_t skew = 0;
  try {
    skew = env::get_int(env::kTraceTestSkewNs).value_or(0) * s.rank.rank;
  } catch (const std::exception&) {
    return;
  }
  if (skew == 0) return;
  for (TraceEvent& e : s.events) e.ts += skew;
  for (ClockSample& c : s.clock) {
    c.local_ns += skew;
    c.offset_ns -= skew;
  }
  s.taken_ns += skew;
}

}  // namespace

Snapshot snapshot() {
  Registry& r = registry();
  Snapshot s;
  std::vector<Buffer*> buffers;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    buffers = r.buffers;
    s.tracks = r.tracks;
    s.rank = r.rank;
    s.clock = r.clock;
  }
  s.taken_ns = now_ns();
  s.pid = ::getpid();
  s.host = host_name();
  for (Buffer* b : buffers) {
    const size_t n = b->published.load(std::memory_order_acquire);
    std::vector<Chunk*> chunks;
    {
      std::lock_guard<std::mutex> lock(b->mutex);
      chunks = b->chunks;
    }
    std::vector<const Record*> records;
    records.reserve(n);
    for (size_t i = 0; i < n; ++i)
      records.push_back(&chunks[i / kChunkRecords]->records[i % kChunkRecords]);
    pair_records(records, s.taken_ns, s.events);
    s.dropped += b->dropped.load(std::memory_order_relaxed);
  }
  skew_for_testing(s);
  return s;
}

std::string write_file() {
  Registry& r = registry();
  const std::string dir = directory();
  DDP_CHECK(!dir.empty(), "trace::write_file: tracing has no directory; set {}=DIR", env::kTrace);
  std::lock_guard<std::mutex> lock(r.write_mutex);
  poll_device_spans();  // Note [device spans]
  const int64_t published = published_records();
  const Snapshot s = snapshot();
  const std::string path = fmt::format("{}/{}", dir, rank_file_name(s.rank.rank));
  const std::string temporary = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    DDP_CHECK(out.good(), "cannot write the trace file {}: {}", temporary, std::strerror(errno));
    write_rank_file(out, s);
    out.flush();
    DDP_CHECK(out.good(), "cannot write the trace file {}: {}", temporary, std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  DDP_CHECK(!ec, "cannot rename {} to {}: {}", temporary, path, ec.message());
  g_written_records.store(published);
  return path;
}

}  // namespace ddp::trace
