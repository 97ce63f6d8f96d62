// The pure half of the `scale` sweep driver: which runs a sweep consists of, the
// measurements it keeps, and the series and scaling efficiencies derived from
// them. Nothing here starts a process or touches a file (runner.h does), so the
// plan, the resume logic and the efficiency arithmetic are unit-tested alone.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::scaling {

// What the user asked for (the flags of `scale`, docs/scaling.md).
struct SweepOptions {
  std::vector<int> world_sizes{1, 2, 4};
  std::vector<std::string> models{"mlp"};
  std::vector<std::string> scalings{"strong", "weak"};
  std::vector<std::string> impls{"ours"};     // ours: ddprun + train; torch: torch_train.py
  std::vector<std::string> backends{"auto"};  // ours only; torch always uses gloo
  std::vector<double> bucket_caps_mb{25.0};
  int global_batch = 256;  // strong scaling: samples per step over all ranks
  int batch = 64;          // weak scaling: samples per step per rank
  int steps = 100;         // timed steps per run
  int repeats = 1;         // measurements per point
  int threads = 1;         // BLAS/OpenMP threads per rank
  // --program: the series' name (the program's file name), the only "model" of the
  // sweep; empty: models are train's (Note [program contract] in runner.h).
  std::string program = {};
  // What else decides a measurement: train's --device and --data, or --program's
  // path and arguments, as setup_id() hashes them. Points of another setup in the
  // CSV are not this sweep's (Note [sweep setup]).
  std::string setup = {};
  std::string torch_setup = {};  // the torch peer's: its data alone (it runs on the CPU)
};

// Note [sweep setup]: a CSV row's "setup" column is a 16-digit hex FNV-1a hash of
// `text` (the device, data, program and its arguments): a sweep resumed with
// another --device, --data or program arguments measures its points again instead
// of taking the rows of the earlier setup for its own, and a series never mixes
// setups. Rows of an older scale have no setup ("") and count as another setup.
std::string setup_id(std::string_view text);

// Throws ValueError naming the flag, the value and the valid values.
void validate(const SweepOptions& options);

// One run of the sweep: everything that identifies a measurement.
struct PointSpec {
  std::string impl;     // ours|torch
  std::string model;    // mlp|cnn
  std::string scaling;  // strong|weak
  std::string backend;  // ours: auto|shm|gloo; torch: gloo
  double bucket_cap_mb = 25.0;
  int world_size = 1;
  int batch_per_rank = 64;
  int steps = 100;
  int threads = 1;
  int repeat = 0;          // 0 .. repeats-1
  std::string setup = {};  // Note [sweep setup]

  int global_batch() const { return batch_per_rank * world_size; }
  // "ours mlp strong auto 25MiB W=2 128/rank #0": for progress lines and errors.
  std::string describe() const;
};

// Two specs name the same point (every field equal, setup included; bucket caps
// within 1e-9).
bool same_point(const PointSpec& a, const PointSpec& b);

// Every point of the sweep, in run order: for each model, scaling and world
// size, the implementations run back to back (ours, then torch), so their
// points see the same machine conditions. Throws like validate().
std::vector<PointSpec> plan_sweep(const SweepOptions& options);

// A finished run: the spec and what it measured.
struct Measurement {
  PointSpec spec;
  double samples_per_s = 0.0;    // all ranks together, the timed steps only
  double tokens_per_s = 0.0;     // gpt models: samples_per_s x the context; others 0
  double step_ms = 0.0;          // per step (rank 0)
  double comm_exposed_ms = 0.0;  // ours: all_reduce time not hidden by backward; torch: 0
  double load1 = 0.0;            // /proc/loadavg when the run started: how busy the machine was
  std::string timestamp;         // UTC, ISO 8601, when the run finished
  double efficiency = 0.0;       // derived (series_of), stored in the CSV for readers
};

// The points of `plan` that `done` does not hold yet (resuming a sweep).
std::vector<PointSpec> remaining_points(const std::vector<PointSpec>& plan,
                                        const std::vector<Measurement>& done);

// One line of the plot: the points that differ only in world size (and repeat).
struct SeriesPoint {
  int world_size = 1;
  int batch_per_rank = 1;
  double samples_per_s = 0.0;                               // median over repeats
  double min_samples_per_s = 0.0, max_samples_per_s = 0.0;  // their spread
  double comm_exposed_ms = 0.0;                             // median over repeats
  double efficiency = 0.0;  // (sps(W) / W) / (sps(W0) / W0), W0 the series' smallest W
  int repeats = 0;
};
struct Series {
  std::string label;  // "ours mlp strong" plus backend/bucket when the sweep varies them
  std::string group;  // the label without the scaling: strong and weak share a colour
  std::string impl, model, scaling;
  std::vector<SeriesPoint> points;  // by world size
};

// Groups measurements into series (first-seen order) and computes the medians
// and efficiencies; labels name backend and bucket cap only where they vary.
std::vector<Series> series_of(const std::vector<Measurement>& measurements);

// The series as a Markdown table (model, scaling, impl, W, batch per rank,
// samples/s, min..max, efficiency, exposed communication, runs), one row per point, for
// the console and docs/benchmarks.md.
std::string markdown_table(const std::vector<Series>& series);

// Sets every measurement's `efficiency` from its series (repeats share the median's).
void fill_efficiency(std::vector<Measurement>& measurements);

// One line about the fixed parameters of the measurements, for the plot:
// "strong: global batch 256; weak: 64 per rank; 100 timed steps; 1 thread per
// rank; load average 1.2-3.4".
std::string describe_measurements(const std::vector<Measurement>& measurements);

// The value of a number field in one JSON object line ("samples_per_s": 123.4),
// as train's --metrics and torch_train.py print them; nullopt when absent.
std::optional<double> json_number(std::string_view line, std::string_view key);

// Median of a non-empty list.
double median(std::vector<double> values);

}  // namespace ddp::scaling
