// scale: the scaling-sweep driver. Runs `ddprun -n W train` (and the PyTorch
// DDP peer) over world sizes, models, bucket caps and backends, in strong and
// weak scaling; writes a CSV (resumable: points already in it are skipped) and
// an SVG plot of samples/s and scaling efficiency. docs/scaling.md.
//
// Exit codes: 0 every point measured, 1 a run failed (the others still ran and
// are saved), 2 a usage error.
#include "bench/scale/cli.h"
#include "bench/scale/csv.h"
#include "bench/scale/runner.h"
#include "bench/scale/svg_plot.h"
#include "runtime/error.h"

#include <unistd.h>

#include "runtime/fmt.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace ddp::scaling {
namespace {

namespace fs = std::filesystem;

std::vector<Measurement> load_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  try {
    return parse_csv(text.str());
  } catch (const ValueError& e) {
    throw ValueError(
        fmt::format("{}: {} (move the file away to start a new sweep)", path, e.what()));
  }
}

// Writes `text` to a temporary file next to `path`, then renames it: a reader
// (or an interrupted sweep) never sees half a file.
// `flag` names the file in the error (--csv, --svg).
void write_atomically(const char* flag, const std::string& path, const std::string& text) {
  std::error_code ec;
  DDP_CHECK(!fs::is_directory(path, ec), "{} {}: is a directory; pass a file path", flag, path);
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    const int open_errno = errno;
    DDP_CHECK(out.is_open(), "{} {}: cannot write {} ({}); pass a path in a writable directory",
              flag, path, tmp, std::strerror(open_errno));
    out << text;
    out.close();
    DDP_CHECK(out.good(), "{} {}: writing {} failed; is the disk full?", flag, path, tmp);
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw ValueError(
        fmt::format("{} {}: cannot replace it ({}); pass another path", flag, path, ec.message()));
  }
}

// What write_atomically() will need: a file path whose directory takes a new file.
void check_writable(const char* flag, const std::string& path) {
  std::error_code ec;
  DDP_CHECK(!fs::is_directory(path, ec), "{} {}: is a directory; pass a file path", flag, path);
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  const bool ok = std::ofstream(tmp, std::ios::trunc).is_open();
  const int open_errno = errno;
  fs::remove(tmp, ec);
  DDP_CHECK(ok, "{} {}: cannot create a file there ({}); pass a path in a writable directory", flag,
            path, std::strerror(open_errno));
}

// Note [sweep setup]: the rows of this sweep's setup, the ones its table shows.
std::vector<Measurement> of_setup(const std::vector<Measurement>& all, const SweepOptions& o) {
  std::vector<Measurement> out;
  for (const auto& m : all) {
    if (m.spec.setup == (m.spec.impl == "torch" ? o.torch_setup : o.setup)) out.push_back(m);
  }
  return out;
}

// The CSV keeps every row; the plot shows `shown`'s.
void save(const Config& c, std::vector<Measurement>& measurements,
          const std::vector<Measurement>& shown) {
  fill_efficiency(measurements);
  write_atomically("--csv", c.csv, csv_text(measurements));
  const std::string subtitle = c.subtitle.empty() ? describe_measurements(shown) : c.subtitle;
  write_atomically("--svg", c.svg,
                   render_svg(series_of(shown), {.title = c.title, .subtitle = subtitle}));
}

std::string duration_text(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02d}s", s / 60, s % 60) : fmt::format("{}s", s);
}

void print_summary(const std::vector<Measurement>& measurements) {
  std::cout << markdown_table(series_of(measurements)) << std::flush;
}

int sweep(const Config& c) {
  std::vector<Measurement> measurements = load_csv(c.csv);
  const auto plan = plan_sweep(c.sweep);
  const auto todo = remaining_points(plan, measurements);
  const size_t other = measurements.size() - of_setup(measurements, c.sweep).size();
  std::cerr << fmt::format("scale: {} points planned, {} already in {}, {} to run{}\n", plan.size(),
                           plan.size() - todo.size(), c.csv, todo.size(),
                           other == 0 ? ""
                                      : fmt::format("; its {} rows of another setup (--device, "
                                                    "--data or program arguments) are kept, not "
                                                    "shown",
                                                    other));
  if (c.dry_run) {
    for (const auto& p : todo) {
      const auto argv = p.impl == "torch" ? torch_command(p, c.run.programs)
                                          : ours_command(p, c.run.programs, "METRICS");
      std::cout << fmt::format("{}\n  $ {}\n", p.describe(), fmt::join(argv, " "));
    }
    return 0;
  }
  // A path that cannot be written is found before minutes of measuring, not after.
  check_writable("--csv", c.csv);
  check_writable("--svg", c.svg);
  const std::string work = fs::temp_directory_path() / fmt::format("ddp-scale-{}", getpid());
  fs::create_directories(work);
  RunOptions run = c.run;
  run.work_dir = work;
  const bool tty = isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  int failed = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    const std::string head =
        fmt::format("scale: [{}/{}] {}", i + 1, todo.size(), todo[i].describe());
    if (tty) std::cerr << "\r\033[K" << head << " ..." << std::flush;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      measurements.push_back(run_point(todo[i], run));
      save(c, measurements, of_setup(measurements, c.sweep));
      const Measurement& m = measurements.back();
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double total =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double left =
          total / static_cast<double>(i + 1) * static_cast<double>(todo.size() - i - 1);
      std::cerr << (tty ? "\r\033[K" : "")
                << fmt::format(
                       "{}: {:.0f} samples/s{}, efficiency {:.2f} (load {:.1f}, {}; ~{} left)\n",
                       head, m.samples_per_s,
                       m.tokens_per_s > 0 ? fmt::format(" ({:.0f} tokens/s)", m.tokens_per_s) : "",
                       m.efficiency, m.load1, duration_text(took), duration_text(left));
    } catch (const Error& e) {
      ++failed;
      std::cerr << (tty ? "\r\033[K" : "") << "scale: FAILED " << e.what() << "\n";
    }
  }
  fs::remove_all(work);
  if (measurements.empty()) return failed > 0 ? 1 : 0;
  const auto shown = of_setup(measurements, c.sweep);
  save(c, measurements, shown);
  print_summary(shown);
  std::cerr << fmt::format(
      "scale: wrote {} and {}{}\n", c.csv, c.svg,
      failed > 0 ? fmt::format("; {} points failed (run again to retry them)", failed) : "");
  return failed > 0 ? 1 : 0;
}

int plot_only(const Config& c) {
  std::vector<Measurement> measurements = load_csv(c.csv);
  DDP_CHECK(!measurements.empty(), "--plot-only: {} holds no measurements", c.csv);
  save(c, measurements, measurements);
  print_summary(measurements);
  std::cerr << fmt::format("scale: wrote {} and {} from {} rows\n", c.csv, c.svg,
                           measurements.size());
  return 0;
}

}  // namespace
}  // namespace ddp::scaling

int main(int argc, char** argv) {
  using namespace ddp::scaling;
  Config config;
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    const auto parsed = parse_cli(args);
    if (!parsed) {
      std::cout << usage();
      return 0;
    }
    config = *parsed;
    validate(config.sweep);
    check_programs(config);
  } catch (const ddp::ValueError& e) {
    std::cerr << "scale: " << e.what() << "\n(run `scale --help` for usage)\n";
    return 2;
  }
  try {
    return config.plot_only ? plot_only(config) : sweep(config);
  } catch (const std::exception& e) {
    std::cerr << "scale: error: " << e.what() << "\n";
    return 1;
  }
}
