// Note [planted faults] in planted_fault.h.
#include "runtime/planted_fault.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda_graph.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"

#include "runtime/fmt.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>

namespace ddp::planted_fault {

namespace detail {
std::atomic<bool> g_armed{false};
}  // namespace detail

namespace {

constexpr const char* kForm =
    "DEVICE:OP:ARG:MODE, like cuda:layer_norm:3:last (DEVICE cpu or cuda; ARG a whole number; "
    "MODE first, last or scale=X): Note [planted faults] in runtime/planted_fault.h";

enum class Mode { first, last, scale };

struct Fault {
  std::string spec;
  DeviceType device = DeviceType::cpu;
  std::string op;
  size_t arg = 0;
  Mode mode = Mode::last;
  double factor = 1.0;
};

struct State {
  std::mutex mutex;
  std::string from_env;    // the variable's value ("" when unset)
  bool malformed = false;  // it did not parse (reported at startup)
  Fault fault;
  std::atomic<int64_t> applied{0};
};

// Never destroyed: an op may still run while static objects are being destroyed.
State& state() {
  static State* s = new State();
  return *s;
}

void report_at_exit() {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (s.malformed) {
    std::fprintf(stderr, "ddp: planted fault %s is malformed: applied 0 time(s)\n",
                 s.from_env.c_str());
  } else if (!s.fault.spec.empty()) {
    std::fprintf(stderr, "ddp: planted fault %s applied %lld time(s)\n", s.fault.spec.c_str(),
                 static_cast<long long>(s.applied.load()));
  }
}

Fault parse(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= spec.size(); ++i) {
    if (i == spec.size() || spec[i] == ':') {
      parts.push_back(spec.substr(start, i - start));
      start = i + 1;
    }
  }
  DDP_CHECK(parts.size() == 4, "{}='{}': expected {}", env::kTestPlantFault, spec, kForm);
  Fault f;
  f.spec = spec;
  DDP_CHECK(parts[0] == "cpu" || parts[0] == "cuda", "{}='{}': device '{}'; expected {}",
            env::kTestPlantFault, spec, parts[0], kForm);
  f.device = parts[0] == "cpu" ? DeviceType::cpu : DeviceType::cuda;
  DDP_CHECK(!parts[1].empty(), "{}='{}': no op; expected {}", env::kTestPlantFault, spec, kForm);
  f.op = parts[1];
  char* end = nullptr;
  const long long arg = std::strtoll(parts[2].c_str(), &end, 10);
  DDP_CHECK(!parts[2].empty() && *end == '\0' && arg >= 0, "{}='{}': argument '{}'; expected {}",
            env::kTestPlantFault, spec, parts[2], kForm);
  f.arg = static_cast<size_t>(arg);
  if (parts[3] == "first" || parts[3] == "last") {
    f.mode = parts[3] == "first" ? Mode::first : Mode::last;
  } else {
    const std::string prefix = "scale=";
    DDP_CHECK(parts[3].starts_with(prefix), "{}='{}': mode '{}'; expected {}", env::kTestPlantFault,
              spec, parts[3], kForm);
    const std::string x = parts[3].substr(prefix.size());
    f.factor = std::strtod(x.c_str(), &end);
    DDP_CHECK(!x.empty() && *end == '\0' && std::isfinite(f.factor),
              "{}='{}': scale '{}'; expected {}", env::kTestPlantFault, spec, x, kForm);
    f.mode = Mode::scale;
  }
  return f;
}

// Reads and parses the variable once, as the process starts. A malformed value is
// reported there (a ValueError from an op could end a thread that cannot take one)
// and leaves the process without a fault.
[[maybe_unused]] const bool g_from_env = [] {
  const char* value = std::getenv(env::kTestPlantFault);
  if (value == nullptr || *value == '\0') return false;
  State& s = state();
  s.from_env = value;
  std::atexit(report_at_exit);
  try {
    s.fault = parse(value);
  } catch (const std::exception& e) {
    s.malformed = true;
    std::fprintf(stderr, "ddp: %s\n", e.what());
    return false;
  }
  detail::g_armed.store(true, std::memory_order_relaxed);
  return true;
}();

// host's values in T (f32 for the float dtypes, i64 for the integers) with the fault
// applied: v + 1 + |v| at the first or last element, or every element times `factor`;
// back in host's dtype. Undefined when that changes nothing (an infinity or a NaN at
// the end, integers a scale keeps, a rounding back to 16 bits).
template <typename T>
Tensor corrupted(const Tensor& host, DType wide, const Fault& f) {
  const std::vector<T> before = cast(host, wide).to_vector<T>();
  std::vector<T> v = before;
  if (f.mode == Mode::scale) {
    for (T& x : v) x = static_cast<T>(static_cast<double>(x) * f.factor);
  } else {
    T& x = f.mode == Mode::first ? v.front() : v.back();
    x += static_cast<T>(1) + static_cast<T>(std::abs(x));
  }
  Tensor out = cast(from_vector(v, host.shape()), host.dtype());
  const std::vector<T> after = cast(out, wide).to_vector<T>();
  return std::memcmp(after.data(), before.data(), before.size() * sizeof(T)) == 0 ? Tensor() : out;
}

// Applies the fault to t through the host, on the current stream; whether anything
// changed (nothing does for an empty tensor).
bool corrupt(const Tensor& t, const Fault& f) {
  if (!t.defined() || t.numel() == 0) return false;
  const Tensor host = t.cpu();
  const Tensor out = is_floating(t.dtype()) ? corrupted<float>(host, DType::f32, f)
                                            : corrupted<int64_t>(host, DType::i64, f);
  if (!out.defined()) return false;
  Tensor dst = t;
  copy_(dst, out.to(t.device()));
  current_stream(t.device()).synchronize();
  return true;
}

thread_local bool t_inside = false;  // the fault's own copies are ops too

}  // namespace

namespace detail {

void apply(const char* op, const Device& device, const std::vector<std::vector<Tensor>>& tensors) {
  if (t_inside) return;
  State& s = state();
  Fault f;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    f = s.fault;
  }
  if (f.spec.empty() || device.type != f.device || f.op != op || f.arg >= tensors.size()) return;
  if (is_capturing(device)) return;
  t_inside = true;
  const cuda_api::UncountedSyncs uncounted;  // the fault's syncs are not the op's
  bool changed = false;
  try {
    const std::vector<Tensor>& target = tensors[f.arg];
    if (f.mode == Mode::scale) {
      for (const Tensor& t : target) changed = corrupt(t, f) || changed;
    } else if (f.mode == Mode::first) {  // a list: its first non-empty tensor's first
      for (auto it = target.begin(); it != target.end() && !changed; ++it)
        changed = corrupt(*it, f);
    } else {  // its last non-empty tensor's last
      for (auto it = target.rbegin(); it != target.rend() && !changed; ++it)
        changed = corrupt(*it, f);
    }
  } catch (...) {
    t_inside = false;
    throw;
  }
  t_inside = false;
  if (changed && s.applied.fetch_add(1) == 0) {
    // At once too: a run that crashes or times out never reaches the line at exit.
    std::fprintf(stderr, "ddp: planted fault %s applied for the first time\n", f.spec.c_str());
    std::fflush(stderr);
  }
}

}  // namespace detail

void set(const std::string& spec) {
  Fault f = spec.empty() ? Fault{} : parse(spec);  // throws before changing anything
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.fault = std::move(f);
  s.malformed = false;
  s.applied.store(0);
  detail::g_armed.store(!spec.empty(), std::memory_order_relaxed);
}

int64_t applied() {
  return state().applied.load();
}

}  // namespace ddp::planted_fault
