#include "bench/scale/sweep.h"

#include "models/gpt_config.h"
#include "runtime/error.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

namespace ddp::scaling {
namespace {

bool contains(std::initializer_list<std::string_view> valid, std::string_view value) {
  return std::find(valid.begin(), valid.end(), value) != valid.end();
}

void check_choices(std::string_view flag, const std::vector<std::string>& values,
                   std::initializer_list<std::string_view> valid) {
  DDP_CHECK(!values.empty(), "{}: the list is empty", flag);
  for (const auto& v : values) {
    DDP_CHECK(contains(valid, v), "{} '{}': valid values are {}", flag, v, fmt::join(valid, ", "));
  }
}

// The batch that stays fixed along a series: global (strong) or per rank (weak).
int fixed_batch(const PointSpec& p) {
  return p.scaling == "strong" ? p.global_batch() : p.batch_per_rank;
}

// Everything but world size and repeat: the points of one series share it.
auto series_key(const PointSpec& p) {
  return std::make_tuple(p.impl, p.model, p.scaling, p.backend, std::llround(p.bucket_cap_mb * 1e6),
                         fixed_batch(p), p.steps, p.threads, p.setup);
}

}  // namespace

// A list that names one item twice would measure the point twice as two runs of
// one repeat (and take its median over both): refused, naming the item.
template <typename T>
void check_no_repeats(const char* flag, const std::vector<T>& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      DDP_CHECK(!(items[j] == items[i]),
                "{}: {} is listed twice; list each once (--repeats measures a point again)", flag,
                items[i]);
    }
  }
}

void validate(const SweepOptions& o) {
  DDP_CHECK(!o.world_sizes.empty(), "--world-sizes: the list is empty");
  check_no_repeats("--world-sizes", o.world_sizes);
  check_no_repeats("--models", o.models);
  check_no_repeats("--scaling", o.scalings);
  check_no_repeats("--impls", o.impls);
  check_no_repeats("--backends", o.backends);
  check_no_repeats("--bucket-caps", o.bucket_caps_mb);
  for (int w : o.world_sizes) {
    DDP_CHECK(w >= 1 && w <= 1024, "--world-sizes: {} is not a world size (1 to 1024)", w);
  }
  if (!o.program.empty()) {
    DDP_CHECK(o.impls == std::vector<std::string>{"ours"},
              "--program runs your program under ddprun; --impls must be ours (the torch peer "
              "runs train's models)");
    DDP_CHECK(o.bucket_caps_mb == std::vector<double>{25.0},
              "--bucket-caps sets train's --bucket-cap-mb; with --program pass the flag your "
              "program takes after --");
  }
  for (const auto& model : o.program.empty() ? o.models : std::vector<std::string>{}) {
    if (models::is_gpt_model(model)) {
      models::gpt_config(model);  // names a bad spec now, not after the first runs
      DDP_CHECK(std::find(o.impls.begin(), o.impls.end(), "torch") == o.impls.end(),
                "--models {} with --impls torch: the torch peer (bench/peer/torch_train.py) runs "
                "mlp and cnn only; sweep the gpt models with --impls ours",
                model);
    } else {
      check_choices(
          "--models", {model},
          {"mlp", "cnn", "gpt-tiny", "gpt-mini", "gpt2", "gpt:layers=..,d=..,heads=..,ctx=.."});
    }
  }
  check_choices("--scaling", o.scalings, {"strong", "weak"});
  check_choices("--impls", o.impls, {"ours", "torch"});
  check_choices("--backends", o.backends, {"auto", "shm", "gloo"});
  DDP_CHECK(!o.bucket_caps_mb.empty(), "--bucket-caps: the list is empty");
  for (double cap : o.bucket_caps_mb) {
    DDP_CHECK(cap > 0 && std::isfinite(cap), "--bucket-caps: {} is not a positive size in MiB",
              cap);
  }
  DDP_CHECK(o.global_batch >= 1 && o.batch >= 1 && o.steps >= 1 && o.repeats >= 1 && o.threads >= 1,
            "--global-batch, --batch, --steps, --repeats and --threads must be at least 1");
  if (std::find(o.scalings.begin(), o.scalings.end(), "strong") != o.scalings.end()) {
    for (int w : o.world_sizes) {
      DDP_CHECK(
          o.global_batch % w == 0,
          "strong scaling splits --global-batch {} over the ranks, but world size {} does not "
          "divide it; choose a global batch that every world size divides (e.g. {})",
          o.global_batch, w, o.global_batch / w * w + w);
    }
  }
}

std::string PointSpec::describe() const {
  return fmt::format("{} {} {} {} {}MiB W={} {}/rank #{}", impl, model, scaling, backend,
                     bucket_cap_mb, world_size, batch_per_rank, repeat);
}

bool same_point(const PointSpec& a, const PointSpec& b) {
  return a.impl == b.impl && a.model == b.model && a.scaling == b.scaling &&
         a.backend == b.backend && std::abs(a.bucket_cap_mb - b.bucket_cap_mb) < 1e-9 &&
         a.world_size == b.world_size && a.batch_per_rank == b.batch_per_rank &&
         a.steps == b.steps && a.threads == b.threads && a.repeat == b.repeat && a.setup == b.setup;
}

std::string setup_id(std::string_view text) {
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a, 64 bits
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;
  }
  return fmt::format("{:016x}", hash);
}

std::vector<PointSpec> plan_sweep(const SweepOptions& o) {
  validate(o);
  std::vector<PointSpec> plan;
  for (int repeat = 0; repeat < o.repeats; ++repeat) {
    for (const auto& model : o.models) {
      for (const auto& scaling : o.scalings) {
        for (int w : o.world_sizes) {
          for (double cap : o.bucket_caps_mb) {
            for (const auto& impl : o.impls) {
              // torch has one backend here (gloo): one point, whatever --backends lists.
              const std::vector<std::string> torch_backend{"gloo"};
              for (const auto& backend : impl == "torch" ? torch_backend : o.backends) {
                plan.push_back(
                    {.impl = impl,
                     .model = model,
                     .scaling = scaling,
                     .backend = backend,
                     .bucket_cap_mb = cap,
                     .world_size = w,
                     .batch_per_rank = scaling == "strong" ? o.global_batch / w : o.batch,
                     .steps = o.steps,
                     .threads = o.threads,
                     .repeat = repeat,
                     .setup = impl == "torch" ? o.torch_setup : o.setup});
              }
            }
          }
        }
      }
    }
  }
  return plan;
}

std::vector<PointSpec> remaining_points(const std::vector<PointSpec>& plan,
                                        const std::vector<Measurement>& done) {
  std::vector<PointSpec> left;
  for (const auto& p : plan) {
    const bool measured = std::any_of(done.begin(), done.end(),
                                      [&](const Measurement& m) { return same_point(m.spec, p); });
    if (!measured) left.push_back(p);
  }
  return left;
}

double median(std::vector<double> values) {
  DDP_ASSERT(!values.empty(), "median of an empty list");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

namespace {

// The point of one world size: medians over its repeats.
SeriesPoint point_of(const std::vector<const Measurement*>& runs) {
  std::vector<double> sps, comm;
  for (const Measurement* m : runs) {
    sps.push_back(m->samples_per_s);
    comm.push_back(m->comm_exposed_ms);
  }
  return {.world_size = runs.front()->spec.world_size,
          .batch_per_rank = runs.front()->spec.batch_per_rank,
          .samples_per_s = median(sps),
          .min_samples_per_s = *std::min_element(sps.begin(), sps.end()),
          .max_samples_per_s = *std::max_element(sps.begin(), sps.end()),
          .comm_exposed_ms = median(comm),
          .efficiency = 0.0,
          .repeats = static_cast<int>(runs.size())};
}

}  // namespace

std::vector<Series> series_of(const std::vector<Measurement>& measurements) {
  using Key = decltype(series_key(PointSpec{}));
  std::vector<Key> order;
  std::map<Key, std::map<int, std::vector<const Measurement*>>> runs;  // key -> W -> runs
  std::set<std::string> backends;
  std::set<double> caps;
  for (const auto& m : measurements) {
    const Key key = series_key(m.spec);
    if (!runs.contains(key)) order.push_back(key);
    runs[key][m.spec.world_size].push_back(&m);
    if (m.spec.impl != "torch") backends.insert(m.spec.backend);
    caps.insert(m.spec.bucket_cap_mb);
  }
  std::vector<Series> out;
  for (const auto& key : order) {
    const PointSpec& p = runs[key].begin()->second.front()->spec;
    std::string suffix;
    if (backends.size() > 1) suffix += " " + p.backend;
    if (caps.size() > 1) suffix += fmt::format(" {}MiB", p.bucket_cap_mb);
    Series s{.label = fmt::format("{} {} {}{}", p.impl, p.model, p.scaling, suffix),
             .group = fmt::format("{} {}{}", p.impl, p.model, suffix),
             .impl = p.impl,
             .model = p.model,
             .scaling = p.scaling,
             .points = {}};
    for (const auto& [w, of_w] : runs[key]) s.points.push_back(point_of(of_w));
    // The baseline: the smallest world size (std::map order).
    const double base_per_rank = s.points.front().samples_per_s / s.points.front().world_size;
    for (auto& point : s.points) {
      point.efficiency =
          base_per_rank > 0 ? point.samples_per_s / point.world_size / base_per_rank : 0.0;
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string markdown_table(const std::vector<Series>& series) {
  std::string out =
      "| model | scaling | impl | W | batch/rank | samples/s | min..max | efficiency | exposed "
      "comm "
      "ms | runs |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& s : series) {
    // What the label adds after "impl model" (a backend or bucket cap that varies).
    const std::string extra =
        s.group.substr(std::min(s.group.size(), s.impl.size() + s.model.size() + 1));
    for (const auto& p : s.points) {
      const std::string comm = s.impl == "torch" ? "-" : fmt::format("{:.2f}", p.comm_exposed_ms);
      out += fmt::format(
          "| {} | {} | {}{} | {} | {} | {:.0f} | {:.0f}..{:.0f} | {:.2f} | {} | {} |\n", s.model,
          s.scaling, s.impl, extra, p.world_size, p.batch_per_rank, p.samples_per_s,
          p.min_samples_per_s, p.max_samples_per_s, p.efficiency, comm, p.repeats);
    }
  }
  return out;
}

void fill_efficiency(std::vector<Measurement>& measurements) {
  // Each row against the median of its series' smallest world size, as series_of does.
  using Key = decltype(series_key(PointSpec{}));
  std::map<Key, std::map<int, std::vector<double>>> samples;
  for (const auto& m : measurements) {
    samples[series_key(m.spec)][m.spec.world_size].push_back(m.samples_per_s);
  }
  for (auto& m : measurements) {
    const auto& [w0, base_values] = *samples[series_key(m.spec)].begin();
    const double base_per_rank = median(base_values) / w0;
    m.efficiency = base_per_rank > 0 ? (m.samples_per_s / m.spec.world_size) / base_per_rank : 0.0;
  }
}

std::string describe_measurements(const std::vector<Measurement>& measurements) {
  std::set<int> strong, weak, steps, threads;
  double load_lo = 1e300, load_hi = 0;
  for (const auto& m : measurements) {
    (m.spec.scaling == "strong" ? strong : weak).insert(fixed_batch(m.spec));
    steps.insert(m.spec.steps);
    threads.insert(m.spec.threads);
    load_lo = std::min(load_lo, m.load1);
    load_hi = std::max(load_hi, m.load1);
  }
  std::vector<std::string> parts;
  if (!strong.empty())
    parts.push_back(fmt::format("strong: global batch {}", fmt::join(strong, "/")));
  if (!weak.empty()) parts.push_back(fmt::format("weak: {} per rank", fmt::join(weak, "/")));
  if (!steps.empty()) parts.push_back(fmt::format("{} timed steps", fmt::join(steps, "/")));
  if (!threads.empty())
    parts.push_back(fmt::format("{} thread(s) per rank", fmt::join(threads, "/")));
  if (!measurements.empty())
    parts.push_back(fmt::format("load average {:.1f}-{:.1f}", load_lo, load_hi));
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::optional<double> json_number(std::string_view line, std::string_view key) {
  const std::string quoted = fmt::format("\"{}\"", key);
  size_t at = line.find(quoted);
  if (at == std::string_view::npos) return std::nullopt;
  at += quoted.size();
  while (at < line.size() && (line[at] == ' ' || line[at] == ':')) ++at;
  const std::string rest(line.substr(at, 64));
  char* end = nullptr;
  const double value = std::strtod(rest.c_str(), &end);
  if (end == rest.c_str()) return std::nullopt;
  return value;
}

}  // namespace ddp::scaling
