#include "bench/scale/cli.h"

#include "runtime/device.h"
#include "runtime/error.h"

#include <unistd.h>

#include "runtime/fmt.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#ifndef DDP_SOURCE_DIR
#define DDP_SOURCE_DIR "."
#endif

namespace ddp::scaling {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage = R"usage(usage: scale [options]

Runs data-parallel training over a list of world sizes and records its
throughput: ours as `ddprun --standalone -n W train ...`, PyTorch DDP (gloo) as W
processes of bench/peer/torch_train.py. Writes a CSV (one row per run) and an
SVG plot of samples/s and scaling efficiency against world size, with the ideal
lines. Resumable: points already in the CSV are skipped, so an interrupted or
extended sweep runs only what is missing. docs/scaling.md explains the method.

sweep (LIST: comma-separated):
  --world-sizes LIST     ranks per run (default 1,2,4)
  --models LIST          mlp, cnn, gpt-tiny, gpt-mini, gpt2,
                         gpt:layers=L,d=D,heads=H,ctx=T (default mlp); a gpt
                         model's batch is sequences of its context, and
                         tokens_per_s goes to the CSV next to samples_per_s
  --scaling LIST         strong: fixed --global-batch split over the ranks;
                         weak: fixed --batch per rank (default strong,weak)
  --impls LIST           ours, torch (default ours)
  --backends LIST        ours' backend: auto, shm, gloo (default auto: shm on one
                         node); torch always runs gloo, once per point
  --bucket-caps LIST     DDP bucket caps in MiB, both implementations (default 25)
  --global-batch N       strong scaling: samples per step over all ranks; every
                         world size must divide it (default 256)
  --batch N              weak scaling: samples per step per rank (default 64)
  --steps N              timed steps per run (default 100). Ours: train --epochs 2
                         --max-steps N, the second epoch's samples_per_s; torch:
                         N untimed warmup steps, then N timed
  --repeats R            runs per point; the plot shows the median (default 1)
  --threads T            BLAS/OpenMP threads per rank, both implementations
                         (default 1; W x T beyond the cores oversubscribes)
  --data synthetic|DIR   train's data (default synthetic, sized for N steps per
                         epoch: max(10000, N x global batch) samples)
  --device D             ours: train's --device (default cpu)
files:
  --csv FILE             measurements; existing rows are kept (default scale.csv)
  --svg FILE             the plot (default: FILE of --csv with .svg)
  --title TEXT           the plot's title (default "Data-parallel scaling")
  --subtitle TEXT        the line under it (default: the batches, steps, threads
                         and load averages found in the CSV)
  --plot-only            run nothing: recompute efficiencies, rewrite the CSV
                         and redraw the SVG from it
  --dry-run              print the points still to run and their commands
programs:
  --ddprun PATH          default: ddprun next to this program
  --train PATH           default: train next to this program
  --program PATH -- ARGS sweep a program of one's own in place of train: run as
                         ddprun -n W PATH ARGS --batch-size N --epochs 2
                         --max-steps S --metrics FILE; it must take those flags
                         and write samples_per_s rows (docs/scaling.md; a
                         program built on train_main does); the CSV's model
                         column is its file name
  --python PATH          for the torch peer (default /usr/bin/python3, which
                         needs python3-torch)
  --torch-script PATH    default: <prefix>/share/ddp/bench/peer/torch_train.py for an
                         installed scale, else bench/peer/torch_train.py of the source tree
  --timeout S            seconds per run before it is stopped (default 900)
  -h, --help             this text

Output: a progress line per run on stderr ("[3/24] ours mlp strong ... 41250
samples/s, efficiency 0.93 (load 1.8, 12s; ~3m left)"), then a table of the
series on stdout. Efficiency = (samples/s / W) / (samples/s / W0), W0 the
series' smallest world size. A failed run is reported and left out of the CSV
(the next invocation retries it); exit 1 then. Exit 2: bad flags.
)usage";

int parse_int(const std::string& flag, const std::string& text, int minimum) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  DDP_CHECK(ec == std::errc() && end == text.data() + text.size(),
            "{} '{}': expected a whole number", flag, text);
  DDP_CHECK(value >= minimum, "{} {}: must be at least {}", flag, value, minimum);
  return value;
}

double parse_double(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  DDP_CHECK(!text.empty() && end == text.c_str() + text.size(), "{} '{}': expected a number", flag,
            text);
  return value;
}

std::vector<std::string> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    DDP_CHECK(!item.empty(), "{} '{}': empty item in the list", flag, text);
    items.push_back(item);
    start = comma + 1;
  }
  return items;
}

// A gpt spec holds commas itself (gpt:layers=4,d=128,heads=4,ctx=128): an item
// that is a key=value without a model name continues the spec before it.
std::vector<std::string> parse_models(const std::string& flag, const std::string& text) {
  std::vector<std::string> models;
  for (auto& item : parse_list(flag, text)) {
    const bool continues = item.find('=') != std::string::npos &&
                           item.find(':') == std::string::npos && !models.empty() &&
                           models.back().starts_with("gpt:");
    if (continues) {
      models.back() += "," + item;
    } else {
      models.push_back(item);
    }
  }
  return models;
}

template <typename T, typename F>
std::vector<T> parse_list_of(const std::string& flag, const std::string& text, F parse) {
  std::vector<T> out;
  for (const auto& item : parse_list(flag, text)) out.push_back(parse(flag, item));
  return out;
}

using Setter = std::function<void(Config&, const std::string& flag, const std::string& value)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"--world-sizes",
       [](Config& c, auto& f, auto& v) {
         c.sweep.world_sizes =
             parse_list_of<int>(f, v, [](auto& fl, auto& t) { return parse_int(fl, t, 1); });
       }},
      {"--models", [](Config& c, auto& f, auto& v) { c.sweep.models = parse_models(f, v); }},
      {"--scaling", [](Config& c, auto& f, auto& v) { c.sweep.scalings = parse_list(f, v); }},
      {"--impls", [](Config& c, auto& f, auto& v) { c.sweep.impls = parse_list(f, v); }},
      {"--backends", [](Config& c, auto& f, auto& v) { c.sweep.backends = parse_list(f, v); }},
      {"--bucket-caps",
       [](Config& c, auto& f, auto& v) {
         c.sweep.bucket_caps_mb = parse_list_of<double>(f, v, parse_double);
       }},
      {"--global-batch",
       [](Config& c, auto& f, auto& v) { c.sweep.global_batch = parse_int(f, v, 1); }},
      {"--batch", [](Config& c, auto& f, auto& v) { c.sweep.batch = parse_int(f, v, 1); }},
      {"--steps", [](Config& c, auto& f, auto& v) { c.sweep.steps = parse_int(f, v, 1); }},
      {"--repeats", [](Config& c, auto& f, auto& v) { c.sweep.repeats = parse_int(f, v, 1); }},
      {"--threads", [](Config& c, auto& f, auto& v) { c.sweep.threads = parse_int(f, v, 1); }},
      {"--data", [](Config& c, auto&, auto& v) { c.run.programs.data = v; }},
      {"--device",
       [](Config& c, auto&, auto& v) {
         Device::parse(v);  // a misspelled device is a usage error here, not a failed run
         c.run.programs.device = v;
       }},
      {"--csv", [](Config& c, auto&, auto& v) { c.csv = v; }},
      {"--svg", [](Config& c, auto&, auto& v) { c.svg = v; }},
      {"--title", [](Config& c, auto&, auto& v) { c.title = v; }},
      {"--subtitle", [](Config& c, auto&, auto& v) { c.subtitle = v; }},
      {"--ddprun", [](Config& c, auto&, auto& v) { c.run.programs.ddprun = v; }},
      {"--train", [](Config& c, auto&, auto& v) { c.run.programs.train = v; }},
      {"--program", [](Config& c, auto&, auto& v) { c.run.programs.program = v; }},
      {"--python", [](Config& c, auto&, auto& v) { c.run.programs.python = v; }},
      {"--torch-script", [](Config& c, auto&, auto& v) { c.run.programs.torch_script = v; }},
      {"--timeout", [](Config& c, auto& f,
                       auto& v) { c.run.timeout = std::chrono::seconds(parse_int(f, v, 1)); }},
  };
  return table;
}

std::string self_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

// An installed scale (<prefix>/bin) finds the peer script installed beside it
// (<prefix>/share/ddp/bench/peer, with models/ next to bench/ as in the source
// tree, which the script imports from); a build tree's scale uses the source tree.
std::string default_torch_script(const std::string& program_dir) {
  const fs::path installed =
      fs::path(program_dir) / ".." / "share" / "ddp" / "bench" / "peer" / "torch_train.py";
  std::error_code ec;
  if (fs::exists(installed, ec)) return fs::weakly_canonical(installed, ec).string();
  return std::string(DDP_SOURCE_DIR) + "/bench/peer/torch_train.py";
}

void fill_defaults(Config& c) {
  Programs& p = c.run.programs;
  if (p.ddprun.empty()) p.ddprun = self_dir() + "/ddprun";
  if (p.train.empty()) p.train = self_dir() + "/train";
  if (p.torch_script.empty()) p.torch_script = default_torch_script(self_dir());
  if (c.svg.empty()) c.svg = fs::path(c.csv).replace_extension(".svg").string();
}

}  // namespace

std::string usage() {
  return kUsage;
}

std::optional<Config> parse_cli(const std::vector<std::string>& args) {
  Config c;
  std::set<std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {  // the rest is --program's
      c.run.programs.program_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                         args.end());
      DDP_CHECK(!c.run.programs.program.empty() || c.run.programs.program_args.empty(),
                "arguments after -- are for --program PATH, which is not given");
      break;
    }
    std::string flag = args[i], value;
    bool has_value = false;
    if (const size_t eq = flag.find('='); flag.starts_with("--") && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    if (flag == "-h" || flag == "--help") return std::nullopt;
    if (flag == "--dry-run" || flag == "--plot-only") {
      DDP_CHECK(!has_value, "{} takes no value", flag);
      (flag == "--dry-run" ? c.dry_run : c.plot_only) = true;
      continue;
    }
    const auto it = setters().find(flag);
    DDP_CHECK(it != setters().end(), "unknown option '{}'", flag);
    if (!has_value) {
      DDP_CHECK(i + 1 < args.size(), "{} needs a value", flag);
      value = args[++i];
    }
    it->second(c, flag, value);
    given.insert(flag);
  }
  if (!c.run.programs.program.empty()) {
    for (const char* flag : {"--models", "--data", "--device", "--train"}) {
      DDP_CHECK(given.count(flag) == 0,
                "{} is train's; with --program pass your program's own flags after --, e.g. "
                "scale --program {} -- --data mine.csv",
                flag, c.run.programs.program);
    }
    c.sweep.program = fs::path(c.run.programs.program).filename().string();
    c.sweep.models = {c.sweep.program};
  }
  fill_defaults(c);
  // Note [sweep setup]: what the points are measured on, besides their own fields.
  const Programs& p = c.run.programs;
  c.sweep.setup =
      setup_id(p.program.empty() ? fmt::format("device={} data={}", p.device, p.data)
                                 : fmt::format("program={} args={}",
                                               fs::absolute(p.program).lexically_normal().string(),
                                               fmt::join(p.program_args, "\x1f")));
  c.sweep.torch_setup = setup_id(fmt::format("data={}", p.data));
  return c;
}

void check_programs(const Config& c) {
  if (c.plot_only) return;
  const auto& impls = c.sweep.impls;
  const bool ours = std::find(impls.begin(), impls.end(), "ours") != impls.end();
  const bool torch = std::find(impls.begin(), impls.end(), "torch") != impls.end();
  const Programs& p = c.run.programs;
  if (ours) {
    for (const auto& [flag, path] :
         {std::pair{"--ddprun", p.ddprun},
          p.program.empty() ? std::pair{"--train", p.train} : std::pair{"--program", p.program}}) {
      DDP_CHECK(::access(path.c_str(), X_OK) == 0, "{} {}: not an executable file; {}", flag, path,
                std::string(flag) == "--program"
                    ? "pass the path of your built program"
                    : fmt::format("build it (cmake --build BUILD --target ddprun train) or pass "
                                  "{} PATH",
                                  flag));
    }
  }
  if (torch) {
    DDP_CHECK(::access(p.torch_script.c_str(), R_OK) == 0,
              "--torch-script {}: no such file; pass the path of bench/peer/torch_train.py",
              p.torch_script);
  }
}

}  // namespace ddp::scaling
