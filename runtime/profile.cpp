// The op profile (Note [op profile] in profile.h).
#include "runtime/profile.h"

#include "runtime/cuda_graph.h"
#include "runtime/error.h"
#include "runtime/stream.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

namespace ddp::profile {
namespace detail {
std::atomic<bool> g_on{false};
}  // namespace detail

namespace {

// Finished pairs are added up once this many more wait, from the oldest, as far as the
// devices have passed them (never waiting).
constexpr size_t kResolveEvery = 4096;

struct Pending {
  size_t key;  // index into State::ops
  Event start, end;
};

// Everything behind the mutex. No CUDA call that can wait for a device is made while
// holding it (Note [op profile]): events are recorded and waited for outside; under
// it only cudaEventQuery and cudaEventElapsedTime, which return at once.
struct State {
  std::mutex mutex;
  uint64_t generation = 0;  // one per start() and stop(): older pairs are dropped
  std::chrono::steady_clock::time_point started;
  std::vector<OpTime> ops;
  std::map<std::tuple<std::string, std::string, std::string>, size_t> index;
  std::deque<Pending> pending;
  size_t resolve_at = kResolveEvery;  // add up finished pairs when pending reaches it
  std::map<std::string, std::vector<Event>> free_events;  // by device
  int64_t dropped = 0;
  std::string first_error;
};

State& state() {
  static State* s = new State();  // never destroyed: ops may run during exit
  return *s;
}

// The op this thread has open (only the outermost is recorded), and how deep it is.
struct Open {
  size_t key = 0;
  uint64_t generation = 0;
  Stream stream;
  std::optional<Event> start;
};
thread_local int t_depth = 0;
thread_local int t_capturing = 0;  // CudaGraph::capture is running in this thread
thread_local Open t_open;

// The message of the exception being handled.
std::string current_error() noexcept {
  try {
    throw;
  } catch (const std::exception& e) {
    try {
      return e.what();
    } catch (...) {
    }
  } catch (...) {
  }
  return {};
}

// Counts a pair that could not be recorded (under the mutex).
void drop_locked(State& s, const std::string& why) noexcept {
  if (s.dropped++ > 0) return;
  try {
    s.first_error = why.empty() ? "an unknown error" : why;
  } catch (...) {
  }
}

// The same from outside the mutex, for a pair of profile `generation` (0: the current
// one; start() makes generations from 1).
void drop(State& s, uint64_t generation, const std::string& why) noexcept {
  try {
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (enabled() && (generation == 0 || generation == s.generation)) drop_locked(s, why);
  } catch (...) {
  }
}

// A timing event of `device` (its str()) from the pool, under the mutex; none when the
// pool is empty (the caller makes one outside it: cudaEventCreate).
std::optional<Event> pooled_event(State& s, const std::string& device) {
  std::vector<Event>& pool = s.free_events[device];
  if (pool.empty()) return std::nullopt;
  std::optional<Event> e(std::move(pool.back()));
  pool.pop_back();
  return e;
}

void add(OpTime& t, double ms) {
  ++t.calls;
  t.total_ms += ms;
  t.max_ms = std::max(t.max_ms, ms);
}

void give_back(State& s, Event e) {
  const std::string device = e.device().str();
  s.free_events[device].push_back(std::move(e));
}

// Under the mutex: adds up the oldest pairs as far as the devices have passed them.
void resolve_ready(State& s) {
  while (!s.pending.empty()) {
    Pending& p = s.pending.front();
    try {
      if (!p.end.query()) break;
      add(s.ops[p.key], p.start.elapsed_ms(p.end));
      give_back(s, std::move(p.start));
      give_back(s, std::move(p.end));
    } catch (...) {
      drop_locked(s, current_error());
    }
    s.pending.pop_front();
  }
  s.resolve_at = s.pending.size() + kResolveEvery;
}

}  // namespace

double Report::ops_ms() const {
  double sum = 0.0;
  for (const OpTime& t : ops) sum += t.total_ms;
  return sum;
}

std::vector<OpTime> Report::by_op() const {
  std::vector<OpTime> out;
  for (const OpTime& t : ops) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const OpTime& o) { return o.op == t.op && o.device == t.device; });
    if (it == out.end()) {
      out.push_back({.op = t.op, .device = t.device});
      it = std::prev(out.end());
    }
    it->calls += t.calls;
    it->total_ms += t.total_ms;
    it->max_ms = std::max(it->max_ms, t.max_ms);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const OpTime& a, const OpTime& b) { return a.total_ms > b.total_ms; });
  return out;
}

void start() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  DDP_CHECK(!enabled(),
            "profile::start: the op profile is already on (call profile::stop() "
            "first)");
  ++s.generation;
  s.ops.clear();
  s.index.clear();
  s.pending.clear();
  s.resolve_at = kResolveEvery;
  s.dropped = 0;
  s.first_error.clear();
  s.started = std::chrono::steady_clock::now();
  detail::g_on.store(true, std::memory_order_relaxed);
}

Report stop() {
  State& s = state();
  std::deque<Pending> batch;
  Report r;
  std::chrono::steady_clock::time_point started;
  {
    // Everything of this profile leaves the state here, so a start() while this waits
    // begins a profile of its own.
    const std::lock_guard<std::mutex> lock(s.mutex);
    DDP_CHECK(enabled(), "profile::stop: the op profile is not on (call profile::start() first)");
    detail::g_on.store(false, std::memory_order_relaxed);
    ++s.generation;  // an op still open in another thread is dropped when it ends
    batch.swap(s.pending);
    r.ops = std::move(s.ops);
    s.ops.clear();
    s.index.clear();
    r.dropped = s.dropped;
    r.first_error = s.first_error;
    started = s.started;
  }
  std::vector<Event> done;  // outside the mutex: waits for the devices
  for (Pending& p : batch) {
    try {
      p.end.synchronize();
      add(r.ops[p.key], p.start.elapsed_ms(p.end));
      done.push_back(std::move(p.start));
      done.push_back(std::move(p.end));
    } catch (...) {
      if (r.dropped++ == 0) r.first_error = current_error();
    }
  }
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    for (Event& e : done) give_back(s, std::move(e));
  }
  r.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  std::erase_if(r.ops, [](const OpTime& t) { return t.calls == 0; });
  std::stable_sort(r.ops.begin(), r.ops.end(),
                   [](const OpTime& a, const OpTime& b) { return a.total_ms > b.total_ms; });
  return r;
}

std::string format_table(const std::vector<OpTime>& ops, double total_ms, size_t top) {
  const size_t shown = top == 0 ? ops.size() : std::min(top, ops.size());
  size_t op_width = 2, shapes_width = 6;
  for (size_t i = 0; i < shown; ++i) {
    op_width = std::max(op_width, ops[i].op.size() + ops[i].device.size() + 3);
    shapes_width = std::max(shapes_width, ops[i].shapes.size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {:>8}  {:>11}  {:>10}  {:>6}\n", "op", op_width,
                                "shapes", shapes_width, "calls", "total ms", "mean us", "share");
  const auto share = [&](double ms) { return total_ms > 0 ? 100.0 * ms / total_ms : 0.0; };
  for (size_t i = 0; i < shown; ++i) {
    const OpTime& t = ops[i];
    out += fmt::format("{:<{}}  {:<{}}  {:>8}  {:>11.3f}  {:>10.1f}  {:>5.1f}%\n",
                       fmt::format("{} ({})", t.op, t.device), op_width, t.shapes, shapes_width,
                       t.calls, t.total_ms, 1e3 * t.total_ms / static_cast<double>(t.calls),
                       share(t.total_ms));
  }
  if (shown < ops.size()) {
    int64_t calls = 0;
    double ms = 0.0;
    for (size_t i = shown; i < ops.size(); ++i) {
      calls += ops[i].calls;
      ms += ops[i].total_ms;
    }
    out += fmt::format("{:<{}}  {:<{}}  {:>8}  {:>11.3f}  {:>10}  {:>5.1f}%\n",
                       fmt::format("({} more)", ops.size() - shown), op_width, "", shapes_width,
                       calls, ms, "", share(ms));
  }
  return out;
}

namespace detail {

void describe(std::string& out, const Tensor& t) {
  if (!out.empty()) out += ' ';
  if (!t.defined()) {
    out += "-";
    return;
  }
  out += fmt::format("{}{}", dtype_name(t.dtype()), shape_str(t.shape()));
}

void describe(std::string& out, const std::vector<Tensor>& ts) {
  if (!out.empty()) out += ' ';
  int64_t numel = 0;
  for (const Tensor& t : ts) numel += t.defined() ? t.numel() : 0;
  out += fmt::format("{} tensors of {} elements", ts.size(), numel);
}

void set_thread_capturing(bool on) noexcept {
  t_capturing += on ? 1 : -1;
}

bool begin(const char* op, const Device& device, std::string shapes) noexcept {
  if (++t_depth > 1 || t_capturing > 0) return false;  // nested, or capturing
  State& s = state();
  uint64_t generation = 0;
  try {
    const Stream stream = current_stream(device);
    if (is_capturing(stream)) return false;
    std::string device_name = device.str();
    auto key = std::make_tuple(std::string(op), device_name, std::move(shapes));
    std::optional<Event> start;
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      if (!enabled()) return false;  // stopped meanwhile
      generation = s.generation;
      auto it = s.index.find(key);
      if (it == s.index.end()) {
        s.ops.push_back(
            {.op = std::get<0>(key), .device = std::get<1>(key), .shapes = std::get<2>(key)});
        it = s.index.emplace(std::move(key), s.ops.size() - 1).first;
      }
      start = pooled_event(s, device_name);
      t_open.key = it->second;
    }
    if (!start) start.emplace(device, /*enable_timing=*/true);
    start->record(stream);
    t_open.generation = generation;
    t_open.stream = stream;
    t_open.start = std::move(start);
    return true;
  } catch (...) {
    drop(s, generation, current_error());
    return false;
  }
}

void leave(bool recorded, bool threw) noexcept {
  --t_depth;
  if (!recorded) return;
  State& s = state();
  std::optional<Event> start = std::move(t_open.start);
  t_open.start.reset();
  const Stream stream = std::exchange(t_open.stream, Stream());
  const uint64_t generation = t_open.generation;
  try {
    if (threw || is_capturing(stream)) return;  // the op failed, or its stream joined a capture
    std::optional<Event> end;
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      if (generation != s.generation) return;  // stopped meanwhile
      end = pooled_event(s, start->device().str());
    }
    if (!end) end.emplace(start->device(), /*enable_timing=*/true);
    end->record(stream);
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (generation != s.generation) return;
    s.pending.push_back({t_open.key, std::move(*start), std::move(*end)});
    if (s.pending.size() >= s.resolve_at) resolve_ready(s);
  } catch (...) {
    drop(s, generation, current_error());
  }
}

}  // namespace detail
}  // namespace ddp::profile
