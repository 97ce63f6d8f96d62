// The recorder (Note [timeline]); the process's side of it (start from the
// environment, exit, signals, fork, the file) is in runtime/trace/process.cpp.
#include "runtime/trace.h"

#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/trace/internal.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <new>

namespace ddp::trace {

namespace detail {
std::atomic<bool> g_on{false};
}  // namespace detail

namespace {

// One record as a thread writes it: fixed size, no allocation. Left uninitialised
// until written (a chunk is not cleared first).
struct Record {
  int64_t ts;
  int64_t duration;  // X
  uint64_t flow_id;  // B, X: FlowBinding::id (0: none)
  const char* category;
  Arg args[kMaxArgs];
  Track track;
  char phase;         // B, E, X, i
  uint8_t flow_ends;  // bit 0: out, bit 1: in
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
  std::vector<Buffer*> buffers;  // this generation's
  // Older generations' buffers: never freed (a thread may still hold one), kept
  // reachable so that leak checkers see them as the process's memory.
  std::vector<Buffer*> retired;
  std::vector<TrackInfo> tracks;
  std::map<std::string, Track, std::less<>> stream_tracks;
  Track next_track = 1;
  std::atomic<uint64_t> generation{1};
  std::atomic<uint64_t> next_flow{1};
  StartOptions options;
  RankInfo rank;
  std::vector<ClockSample> clock;
  std::atomic<int64_t> lost{0};  // records of threads that could not get a buffer
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: threads may record at exit
  return *r;
}

int64_t os_tid() {
  return static_cast<int64_t>(::gettid());
}

// A buffer for the calling thread, or null when there is no memory for one
// (recording never throws: Note [timeline]).
Buffer* register_thread() noexcept {
  Registry& r = registry();
  std::unique_ptr<Buffer> buffer(new (std::nothrow) Buffer());
  if (!buffer) return nullptr;
  try {
    const int64_t tid = os_tid();
    std::string name = tid == ::getpid() ? "main" : fmt::format("thread {}", tid);
    std::lock_guard<std::mutex> lock(r.mutex);
    r.buffers.reserve(r.buffers.size() + 1);  // both may throw: before anything changes
    r.tracks.reserve(r.tracks.size() + 1);
    buffer->track = r.next_track++;
    buffer->max_records = r.options.max_events;
    r.tracks.push_back({buffer->track, std::move(name), tid});
    r.buffers.push_back(buffer.get());
  } catch (...) {
    return nullptr;
  }
  return buffer.release();
}

thread_local Buffer* t_buffer = nullptr;
thread_local uint64_t t_generation = 0;
thread_local bool t_named = false;

Buffer* my_buffer() noexcept {
  const uint64_t generation = registry().generation.load(std::memory_order_acquire);
  if (t_buffer == nullptr || t_generation != generation) {
    t_buffer = register_thread();
    t_generation = generation;
    t_named = false;
  }
  return t_buffer;
}

// The slot for the next record of this thread, or null when the thread has
// recorded its maximum or no memory is left (counted as dropped).
Record* claim(Buffer& b) noexcept {
  if (static_cast<int64_t>(b.written) >= b.max_records) {
    b.dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  if (b.written % kChunkRecords == 0) {
    auto* chunk = static_cast<Chunk*>(::operator new(sizeof(Chunk), std::nothrow));
    if (chunk == nullptr) {
      b.dropped.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(b.mutex);
    try {
      b.chunks.push_back(chunk);
    } catch (...) {
      ::operator delete(chunk);
      b.dropped.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    b.current = chunk;
  }
  return &b.current->records[b.written % kChunkRecords];
}

void publish(Buffer& b) {
  b.published.store(++b.written, std::memory_order_release);
}

void record(char phase, std::string_view name, const char* category, const Arg* args,
            size_t arg_count, int64_t ts, int64_t duration, Track track,
            FlowBinding flow = {}) noexcept {
  if (!enabled()) return;
  Buffer* b = my_buffer();
  if (b == nullptr) {
    registry().lost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Record* r = claim(*b);
  if (r == nullptr) return;
  r->ts = ts != 0 ? ts : now_ns();
  r->duration = duration;
  r->flow_id = flow.id;
  r->flow_ends = static_cast<uint8_t>((flow.out ? 1 : 0) | (flow.in ? 2 : 0));
  r->category = category;
  size_t i = 0;
  for (; i < std::min(arg_count, kMaxArgs); ++i) r->args[i] = args[i];
  for (; i < kMaxArgs; ++i) r->args[i] = Arg{};
  r->track = track != 0 ? track : b->track;
  r->phase = phase;
  size_t bytes = std::min(name.size(), kMaxNameBytes);
  if (bytes < name.size()) {  // cut at a character boundary: the file must be valid UTF-8
    while (bytes > 0 && (static_cast<unsigned char>(name[bytes]) & 0xC0) == 0x80) --bytes;
  }
  if (bytes > 0) std::memcpy(r->name, name.data(), bytes);  // an empty name may have no data
  r->name_bytes = static_cast<uint8_t>(bytes);
  publish(*b);
}

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

void begin(std::string_view name, const char* category, Args args, int64_t ts, Track track,
           FlowBinding flow) noexcept {
  record('B', name, category, args.begin(), args.size(), ts, 0, track, flow);
}

void end(int64_t ts, Track track) noexcept {
  record('E', {}, nullptr, nullptr, 0, ts, 0, track);
}

void complete(std::string_view name, const char* category, int64_t ts, int64_t duration_ns,
              Args args, Track track, FlowBinding flow) noexcept {
  record('X', name, category, args.begin(), args.size(), ts, std::max<int64_t>(0, duration_ns),
         track, flow);
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

uint64_t generation() noexcept {
  return registry().generation.load(std::memory_order_acquire);
}

void name_thread(std::string_view name, bool replace) {
  if (!enabled() || (!replace && t_named)) return;
  Buffer* b = my_buffer();
  if (b == nullptr || (!replace && t_named)) return;
  t_named = true;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (TrackInfo& t : r.tracks) {
    if (t.id == b->track && (replace || t.name.starts_with("thread "))) t.name = std::string(name);
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
    r.options = options;
    r.retired.insert(r.retired.end(), r.buffers.begin(), r.buffers.end());
    r.buffers.clear();
    r.tracks.clear();
    r.stream_tracks.clear();
    r.clock.clear();
    r.lost.store(0);
    r.generation.fetch_add(1, std::memory_order_acq_rel);
  }
  detail::started(options);  // runtime/trace/process.cpp: exit, signals, fork
  detail::g_on.store(true, std::memory_order_release);
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
    if (r->phase == 'B' || r->phase == 'X') {
      e.flow = {.id = r->flow_id, .out = (r->flow_ends & 1) != 0, .in = (r->flow_ends & 2) != 0};
    }
    e.track = r->track;
    e.ts = r->ts;
    e.name.assign(r->name, r->name_bytes);
    e.category = r->category != nullptr ? r->category : "";
    for (const Arg& a : r->args) {
      if (a.key != nullptr) e.args.push_back(a);
    }
    if (r->phase == 'X') e.duration_ns = r->duration;
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
  s.dropped += r.lost.load(std::memory_order_relaxed);
  skew_for_testing(s);
  return s;
}

namespace detail {

int64_t published_records() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  int64_t n = 0;
  for (Buffer* b : r.buffers)
    n += static_cast<int64_t>(b->published.load(std::memory_order_acquire));
  return n;
}

}  // namespace detail

}  // namespace ddp::trace
