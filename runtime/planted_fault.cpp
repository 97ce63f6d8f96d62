// Note [planted faults] in planted_fault.h.
#include "runtime/planted_fault.h"

#include "runtime/cuda_graph.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/ops/ops.h"
#include "runtime/stream.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
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
  bool parsed = false;
  std::string pending;     // the variable's spec, parsed at the first op
  bool malformed = false;  // it did not parse
  Fault fault;
  std::atomic<int64_t> applied{0};
  ~State() {
    if (malformed) {
      std::fprintf(stderr, "ddp: planted fault %s is malformed: applied 0 time(s)\n",
                   pending.c_str());
    } else if (!fault.spec.empty()) {
      std::fprintf(stderr, "ddp: planted fault %s applied %lld time(s)\n", fault.spec.c_str(),
                   static_cast<long long>(applied.load()));
    }
  }
};

State& state() {
  static State s;
  return s;
}

// Reads the variable once, as the process starts (a malformed value is reported at
// the first op, where a ValueError can reach the caller).
[[maybe_unused]] const bool g_from_env = [] {
  const char* value = std::getenv(env::kTestPlantFault);
  if (value == nullptr || *value == '\0') return false;
  state().pending = value;
  detail::g_armed.store(true, std::memory_order_relaxed);
  return true;
}();

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

// v + 1 + |v| for the element at `index` of t's logical order, or every element times
// `factor`; through the host, in f32 for the 16-bit types.
void corrupt(const Tensor& t, const Fault& f) {
  if (!t.defined() || t.numel() == 0) return;
  const Tensor host = t.cpu();
  const int64_t n = host.numel();
  const int64_t at = f.mode == Mode::first ? 0 : n - 1;
  Tensor changed;
  if (is_floating(t.dtype())) {
    std::vector<float> v = cast(host, DType::f32).to_vector<float>();
    if (f.mode == Mode::scale) {
      for (float& x : v) x = static_cast<float>(x * f.factor);
    } else {
      v[static_cast<size_t>(at)] += 1.0f + std::fabs(v[static_cast<size_t>(at)]);
    }
    changed = cast(from_vector(v, host.shape()), t.dtype());
  } else {
    Tensor wide = cast(host, DType::i64);
    std::vector<int64_t> v = wide.to_vector<int64_t>();
    if (f.mode == Mode::scale) {
      for (int64_t& x : v) x = static_cast<int64_t>(static_cast<double>(x) * f.factor);
    } else {
      v[static_cast<size_t>(at)] += 1;
    }
    changed = cast(from_vector(v, host.shape()), t.dtype());
  }
  Tensor dst = t;
  copy_(dst, changed.to(t.device()));
  synchronize(t.device());
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
    if (!s.parsed) {
      s.parsed = true;
      try {
        s.fault = parse(s.pending);
      } catch (...) {  // reported once, here and at exit; the process runs on without it
        s.malformed = true;
        detail::g_armed.store(false, std::memory_order_relaxed);
        throw;
      }
    }
    f = s.fault;
  }
  if (f.spec.empty() || device.type != f.device || f.op != op || f.arg >= tensors.size()) return;
  if (is_capturing(device)) return;
  t_inside = true;
  try {
    const std::vector<Tensor>& target = tensors[f.arg];
    if (f.mode == Mode::scale) {
      for (const Tensor& t : target) corrupt(t, f);
    } else if (!target.empty()) {
      // A list: its first tensor's first element, or its last tensor's last.
      corrupt(f.mode == Mode::first ? target.front() : target.back(), f);
    }
  } catch (...) {
    t_inside = false;
    throw;
  }
  t_inside = false;
  s.applied.fetch_add(1);
}

}  // namespace detail

void set(const std::string& spec) {
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.fault = spec.empty() ? Fault{} : parse(spec);
  s.parsed = true;
  s.applied.store(0);
  detail::g_armed.store(!spec.empty(), std::memory_order_relaxed);
}

int64_t applied() {
  return state().applied.load();
}

}  // namespace ddp::planted_fault
