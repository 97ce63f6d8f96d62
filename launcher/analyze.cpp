#include "launcher/analyze.h"

#include "collectives/flight/diagnosis.h"
#include "collectives/flight/flight_dump.h"
#include "collectives/flight/straggler.h"
#include "runtime/error.h"

#include <fmt/ranges.h>

#include "runtime/fmt.h"

#include <set>

namespace ddp::launcher {
namespace {

constexpr const char* kAnalyzeUsage =
    "usage: ddprun analyze DIR\n"
    "  DIR holds flight recorder dumps, flight_rank_<R>.json (docs/flight_recorder.md)\n";

// "job 3fa2 (world size 4, backend shm)", with a warning when the dumps disagree.
void describe_job(const std::vector<flight::RankSnapshot>& dumps, std::ostream& out) {
  std::set<std::string> jobs;
  std::set<int> worlds;
  for (const auto& d : dumps) {
    jobs.insert(d.job);
    worlds.insert(d.world_size);
  }
  const auto& first = dumps.front();
  out << fmt::format("{} dump{} of job {} (world size {}, backend {})\n", dumps.size(),
                     dumps.size() == 1 ? "" : "s", first.job.empty() ? "?" : first.job,
                     first.world_size, first.backend.empty() ? "?" : first.backend);
  if (jobs.size() > 1 || worlds.size() > 1) {
    out << fmt::format(
        "warning: the dumps come from {} jobs and {} world sizes: a later job's dumps replaced "
        "only some of an earlier one's; give each job its own DDP_FLIGHT_DIR\n",
        jobs.size(), worlds.size());
  }
}

}  // namespace

int run_analyze(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    out << kAnalyzeUsage;
    return 0;
  }
  if (args.size() != 1 || args[0].starts_with("-")) {
    err << "ddprun analyze: expected one directory, got "
        << (args.empty() ? std::string("none") : fmt::format("'{}'", fmt::join(args, " ")))
        << "\n\n"
        << kAnalyzeUsage;
    return 2;
  }
  std::vector<flight::RankSnapshot> dumps;
  try {
    dumps = flight::read_dumps(args[0]);
  } catch (const Error& e) {
    err << "ddprun analyze: " << e.what() << "\n";
    return 1;
  }
  describe_job(dumps, out);
  for (const std::string& line : flight::rank_lines(dumps)) out << "  " << line << "\n";
  out << "diagnosis:\n";
  for (const std::string& line : flight::diagnose(dumps).lines) out << "  " << line << "\n";
  std::vector<flight::RankActivity> activity;
  for (const auto& d : dumps) activity.push_back(flight::activity_of(d.rank, d.status));
  const std::string straggler = flight::straggler_report(activity).text;
  if (!straggler.empty()) out << straggler << "\n";
  return 0;
}

}  // namespace ddp::launcher
