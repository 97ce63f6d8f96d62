// The op profile (Note [op profile] in profile.h).
#include "runtime/profile.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda_graph.h"
#include "runtime/error.h"
#include "runtime/stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
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

// Finished pairs are added up once this many wait, from the oldest, as far as the
// devices have passed them (never waiting).
constexpr size_t kResolveEvery = 4096;

struct Pending {
  size_t key;  // index into State::ops
  Event start, end;
};

// Everything behind the mutex. No CUDA call is made while holding it (Note [op
// profile]): events are taken from the pool under it and recorded, queried or
// waited for outside.
struct State {
  std::mutex mutex;
  uint64_t generation = 0;  // one per start(): a pair begun before a stop() is dropped
  std::chrono::steady_clock::time_point started;
  std::vector<OpTime> ops;
  std::map<std::tuple<std::string, std::string, std::string>, size_t> index;
  std::deque<Pending> pending;
  bool resolving = false;            // a thread is adding up pairs outside the mutex
  std::condition_variable resolved;  // resolving became false
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

// Under the mutex.
Event take_event(State& s, const Device& device) {
  std::vector<Event>& pool = s.free_events[device.str()];
  if (pool.empty()) return Event(device, /*enable_timing=*/true);  // outside: CUDA
  Event e = std::move(pool.back());
  pool.pop_back();
  return e;
}

// Under the mutex.
void drop(State& s, const char* what) {
  if (s.dropped++ == 0) s.first_error = what;
}

// Whether `stream` is capturing now (an op's stream that joined a capture).
bool capturing(const Stream& stream) {
  return stream.device().is_cuda() && stream.handle() != nullptr &&
         cuda_api::stream_is_capturing(stream.device().index, stream.handle());
}

// Adds up pairs from the front of `batch` (all of them with `wait`, else as far as
// the devices have passed them); the rest stay in `batch`. Outside the mutex: `adds`
// collects (key, ms), the events go to `done`.
void measure(std::deque<Pending>& batch, bool wait, std::vector<std::pair<size_t, double>>& adds,
             std::vector<Event>& done, std::string& error) {
  while (!batch.empty()) {
    Pending& p = batch.front();
    try {
      if (wait) {
        p.end.synchronize();
      } else if (!p.end.query()) {
        return;
      }
      adds.emplace_back(p.key, p.start.elapsed_ms(p.end));
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
      adds.emplace_back(p.key, -1.0);  // dropped
    }
    done.push_back(std::move(p.start));
    done.push_back(std::move(p.end));
    batch.pop_front();
  }
}

// Under the mutex: the measured pairs into their keys, their events back to the pool.
void settle(State& s, const std::vector<std::pair<size_t, double>>& adds, std::vector<Event>& done,
            const std::string& error) {
  for (const auto& [key, ms] : adds) {
    if (ms < 0) {
      drop(s, error.c_str());
      continue;
    }
    OpTime& t = s.ops[key];
    ++t.calls;
    t.total_ms += ms;
    t.max_ms = std::max(t.max_ms, ms);
  }
  for (Event& e : done) {
    const std::string device = e.device().str();
    s.free_events[device].push_back(std::move(e));
  }
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
  s.dropped = 0;
  s.first_error.clear();
  s.started = std::chrono::steady_clock::now();
  detail::g_on.store(true, std::memory_order_relaxed);
}

Report stop() {
  State& s = state();
  std::deque<Pending> batch;
  std::vector<OpTime> ops;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    DDP_CHECK(enabled(), "profile::stop: the op profile is not on (call profile::start() first)");
    detail::g_on.store(false, std::memory_order_relaxed);
    // A thread adding up a batch outside the mutex puts what is left back first.
    s.resolved.wait(lock, [&] { return !s.resolving; });
    ++s.generation;  // an op still open in another thread is dropped when it ends
    batch.swap(s.pending);
  }
  std::vector<std::pair<size_t, double>> adds;
  std::vector<Event> done;
  std::string error;
  measure(batch, /*wait=*/true, adds, done, error);
  Report r;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    settle(s, adds, done, error);
    r.wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.started)
            .count();
    for (const OpTime& t : s.ops) {
      if (t.calls > 0) r.ops.push_back(t);
    }
    r.dropped = s.dropped;
    r.first_error = s.first_error;
    s.ops.clear();
    s.index.clear();
  }
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
  try {
    if (is_capturing(device)) return false;
    const Stream stream = current_stream(device);
    auto key = std::make_tuple(std::string(op), device.str(), std::move(shapes));
    std::optional<Event> start;
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      if (!enabled()) return false;  // stopped meanwhile
      auto it = s.index.find(key);
      if (it == s.index.end()) {
        s.ops.push_back(
            {.op = std::get<0>(key), .device = std::get<1>(key), .shapes = std::get<2>(key)});
        it = s.index.emplace(std::move(key), s.ops.size() - 1).first;
      }
      std::vector<Event>& pool = s.free_events[device.str()];
      if (!pool.empty()) {
        start.emplace(std::move(pool.back()));
        pool.pop_back();
      }
      t_open.key = it->second;
      t_open.generation = s.generation;
    }
    if (!start) start.emplace(device, /*enable_timing=*/true);
    start->record(stream);
    t_open.stream = stream;
    t_open.start = std::move(start);
    return true;
  } catch (const std::exception& e) {
    const std::lock_guard<std::mutex> lock(s.mutex);
    drop(s, e.what());
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
  try {
    if (threw || capturing(stream)) return;  // the op failed, or its stream joined a capture
    std::optional<Event> end;
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      if (t_open.generation != s.generation || !enabled()) return;  // stopped meanwhile
      end.emplace(take_event(s, start->device()));
    }
    end->record(stream);
    std::deque<Pending> batch;
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      if (t_open.generation != s.generation || !enabled()) return;
      s.pending.push_back({t_open.key, std::move(*start), std::move(*end)});
      if (s.pending.size() < kResolveEvery || s.resolving) return;
      s.resolving = true;
      batch.swap(s.pending);
    }
    // Adds up what the devices have passed, outside the mutex; the rest goes back to the
    // front of the queue, older than what other threads added meanwhile.
    std::vector<std::pair<size_t, double>> adds;
    std::vector<Event> done;
    std::string error;
    measure(batch, /*wait=*/false, adds, done, error);
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.resolving = false;
    s.resolved.notify_all();
    settle(s, adds, done, error);  // stop() waited for this: still the same profile
    s.pending.insert(s.pending.begin(), std::make_move_iterator(batch.begin()),
                     std::make_move_iterator(batch.end()));
  } catch (const std::exception& e) {
    try {
      const std::lock_guard<std::mutex> lock(s.mutex);
      drop(s, e.what());
    } catch (...) {
    }
  }
}

}  // namespace detail
}  // namespace ddp::profile
