#include "launcher/flight_watch.h"

#include "collectives/flight/flight_dump.h"
#include "collectives/flight/flight_recorder.h"
#include "collectives/flight/straggler.h"
#include "launcher/process.h"
#include "runtime/env.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

namespace ddp::launcher {
namespace {

constexpr const char* kRegionDirPrefix = "ddprun-flight-";

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Clock::time_point time_of(int64_t ns) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

std::string temp_dir() {
  const auto tmp = env::get("TMPDIR");
  return tmp ? *tmp : std::string("/tmp");
}

// /dev/shm when ddprun can write there (memory), else the temporary directory.
std::string region_parent() {
  return ::access("/dev/shm", W_OK | X_OK) == 0 ? std::string("/dev/shm") : temp_dir();
}

flight::ProcessState process_state(const RankRecord& r, std::string& detail) {
  if (r.wait_status) {
    detail = describe_status(*r.wait_status);
    return flight::ProcessState::exited;
  }
  if (r.stopped_since) {
    detail = signal_name(r.stop_signal);
    return flight::ProcessState::stopped;
  }
  return flight::ProcessState::running;
}

}  // namespace

FlightOptions flight_options(const std::string& run_id, int restart, const std::string& log_dir,
                             std::chrono::milliseconds hang_timeout) {
  FlightOptions o;
  o.hang_timeout = hang_timeout;
  o.shm_dir = fmt::format("{}/{}{}-{}", region_parent(), kRegionDirPrefix, ::getpid(), restart);
  if (auto dir = env::get(env::kFlightDir)) {
    o.dump_dir = *dir;
  } else if (!log_dir.empty()) {
    o.dump_dir = log_dir;
  } else {
    o.dump_dir = fmt::format("{}/ddp_flight/{}", temp_dir(), run_id);
  }
  if (restart > 0) o.dump_dir += fmt::format("/restart_{}", restart);
  return o;
}

void set_flight_environment(std::vector<std::string>& env, const FlightOptions& o) {
  if (o.shm_dir.empty()) return;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{env::kFlightShm, o.shm_dir},
                                   {env::kFlightDir, o.dump_dir}}) {
    std::erase_if(env, [&](const std::string& e) { return e.starts_with(key + "="); });
    env.push_back(key + "=" + value);
  }
}

void remove_stale_region_dirs() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(region_parent(), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kRegionDirPrefix)) continue;
    const long pid = std::strtol(name.c_str() + std::strlen(kRegionDirPrefix), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
      continue;
    std::filesystem::remove_all(entry.path(), ec);
  }
}

std::optional<Hang> find_hang(const std::vector<WatchedRank>& ranks, int64_t now_ns,
                              int64_t timeout_ns, int64_t clock_restart_ns) {
  if (timeout_ns <= 0 || ranks.empty()) return std::nullopt;
  int64_t latest = clock_restart_ns;
  Hang hang;
  for (const WatchedRank& r : ranks) {
    latest = std::max(latest, r.status.last_progress_ns);
    if (!r.exited && r.status.waiters > 0) hang.waiting.push_back(r.rank);
  }
  if (hang.waiting.empty() || latest <= 0 || now_ns - latest < timeout_ns) return std::nullopt;
  hang.silent_s = static_cast<double>(now_ns - latest) / 1e9;
  return hang;
}

FlightWatch::FlightWatch(FlightOptions options, std::vector<int> ranks)
    : options_(std::move(options)), ranks_(std::move(ranks)), regions_(ranks_.size()) {
  if (!enabled()) return;
  std::error_code ec;
  std::filesystem::create_directories(options_.shm_dir, ec);
  if (ec) {
    say(
        fmt::format("cannot make {} for the ranks' flight recorders ({}): no hang detection or "
                    "diagnosis in this attempt",
                    options_.shm_dir, ec.message()));
    options_.shm_dir.clear();
  }
}

FlightWatch::~FlightWatch() {
  for (Region& r : regions_) {
    if (r.base != nullptr) ::munmap(const_cast<void*>(r.base), r.bytes);
  }
  if (!options_.shm_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(options_.shm_dir, ec);
  }
}

void FlightWatch::refresh() {
  if (!enabled()) return;
  for (size_t i = 0; i < regions_.size(); ++i) {
    Region& region = regions_[i];
    if (region.base != nullptr) continue;
    const std::string path = fmt::format("{}/rank_{}", options_.shm_dir, ranks_[i]);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(flight::SharedHeader))) {
      const auto bytes = static_cast<size_t>(st.st_size);
      void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        try {
          (void)flight::read_region_status(p, bytes);  // ready?
          region = {p, bytes};
        } catch (const Error&) {
          ::munmap(p, bytes);  // still being set up: next time
        }
      }
    }
    ::close(fd);
  }
}

void FlightWatch::restart_clock(Clock::time_point now) {
  clock_restart_ns_ = ns_of(now);
}

std::optional<Hang> FlightWatch::check_hang(const std::vector<RankRecord>& records,
                                            Clock::time_point now) {
  if (!enabled() || options_.hang_timeout.count() <= 0) return std::nullopt;
  refresh();
  std::vector<WatchedRank> watched;
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].base == nullptr) continue;
    watched.push_back({.rank = ranks_[i],
                       .exited = records[i].wait_status.has_value(),
                       .status = flight::read_region_status(regions_[i].base, regions_[i].bytes)});
  }
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.hang_timeout);
  return find_hang(watched, ns_of(now), timeout.count(), clock_restart_ns_);
}

std::optional<Clock::time_point> FlightWatch::last_progress(size_t index) const {
  const Region& r = regions_.at(index);
  if (r.base == nullptr) return std::nullopt;
  const int64_t ns = flight::read_region_status(r.base, r.bytes).last_progress_ns;
  if (ns <= 0) return std::nullopt;
  return time_of(ns);
}

std::vector<flight::RankSnapshot> FlightWatch::snapshots(
    const std::vector<RankRecord>& records) const {
  std::vector<flight::RankSnapshot> out;
  const int64_t now = ns_of(Clock::now());
  const std::string host = flight::host_name();
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].base == nullptr) continue;
    flight::RankSnapshot s = flight::read_region(regions_[i].base, regions_[i].bytes, now);
    s.host = host;
    s.process = process_state(records[i], s.process_detail);
    out.push_back(std::move(s));
  }
  return out;
}

void FlightWatch::capture(const std::vector<RankRecord>& records, const std::string& why) {
  if (!enabled() || captured_) return;
  captured_ = true;
  refresh();
  std::vector<flight::RankSnapshot> snaps = snapshots(records);
  for (flight::RankSnapshot& s : snaps) {
    s.reason = "ddprun: " + why;
    try {
      flight::write_dump(options_.dump_dir, s);
      ++dumps_written_;
    } catch (const Error& e) {
      dump_error_ = e.what();
    }
  }
  flight::DiagnosisOptions d;
  d.expected_ranks = ranks_;
  d.missing_reason = "no flight recorder (not started yet, or not a ddp program)";
  d.missing_would_have_dumped = false;  // ddprun reads the regions; the ranks dump nothing
  if (!snaps.empty() && snaps.front().world_size > static_cast<int>(ranks_.size())) {
    d.other_ranks_elsewhere = true;
  }
  if (!snaps.empty()) diagnosis_ = flight::diagnose(snaps, d);  // none: not ddp programs
}

std::vector<std::string> FlightWatch::summary_lines() const {
  std::vector<std::string> out;
  if (!captured_) return out;
  for (const std::string& line : diagnosis_.lines) out.push_back("flight recorder: " + line);
  if (dumps_written_ > 0) {
    out.push_back(fmt::format("flight recorder dumps of {} rank{}: {} (ddprun analyze {})",
                              dumps_written_, dumps_written_ == 1 ? "" : "s", options_.dump_dir,
                              options_.dump_dir));
  }
  if (!dump_error_.empty()) out.push_back("flight recorder: " + dump_error_);
  return out;
}

std::string FlightWatch::straggler_line() const {
  std::vector<flight::RankActivity> ranks;
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].base == nullptr) continue;
    ranks.push_back(flight::activity_of(
        ranks_[i], flight::read_region_status(regions_[i].base, regions_[i].bytes)));
  }
  return flight::straggler_report(std::move(ranks)).text;
}

}  // namespace ddp::launcher
