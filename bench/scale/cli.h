// The command line of `scale`: flags -> Config, the usage text, and the checks
// that the programs it will start exist. Parsing is pure (unit-tested).
#pragma once

#include "bench/scale/runner.h"
#include "bench/scale/sweep.h"

#include <optional>
#include <string>
#include <vector>

namespace ddp::scaling {

struct Config {
  SweepOptions sweep;
  RunOptions run;
  std::string csv = "scale.csv";
  std::string svg;  // empty: the CSV's path with .svg
  std::string title = "Data-parallel scaling";
  std::string subtitle;  // empty: describe_measurements() of the CSV
  bool dry_run = false;
  bool plot_only = false;
};

std::string usage();

// nullopt for --help. Throws ValueError: "unknown option '--x'", "--steps 'ten':
// expected a whole number", ... Fills the program paths' defaults (next to this
// executable; the torch peer in the source tree) where the flags leave them empty.
std::optional<Config> parse_cli(const std::vector<std::string>& args);

// The programs the planned points need exist and are executable (ValueError otherwise).
void check_programs(const Config& config);

}  // namespace ddp::scaling
