#include "launcher/flight_watch.h"

#include "collectives/flight/flight_dump.h"
#include "collectives/flight/flight_recorder.h"
#include "collectives/flight/straggler.h"
#include "launcher/process.h"
#include "runtime/env.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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
                             std::optional<std::chrono::milliseconds> hang_timeout) {
  FlightOptions o;
  o.hang_timeout = hang_timeout;
  o.shm_parent = region_parent();
  o.restart = restart;
  if (auto dir = env::get(env::kFlightDir)) {
    o.dump_dir = *dir;
  } else if (!log_dir.empty()) {
    o.dump_dir = log_dir;
  } else {
    o.dump_dir = fmt::format("{}/{}", flight::private_dump_base(), run_id);
  }
  if (restart > 0) o.dump_dir += fmt::format("/restart_{}", restart);
  return o;
}

void set_flight_environment(std::vector<std::string>& env, const std::string& shm_dir,
                            const std::string& dump_dir) {
  if (shm_dir.empty()) return;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{env::kFlightShm, shm_dir},
                                   {env::kFlightDir, dump_dir}}) {
    std::erase_if(env, [&](const std::string& e) { return e.starts_with(key + "="); });
    env.push_back(key + "=" + value);
  }
}

void remove_stale_region_dirs(const std::string& parent) {
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator(parent.empty() ? region_parent() : parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kRegionDirPrefix)) continue;
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    // Note [region directory]: its ddprun's pid is gone here and nobody holds its lock.
    const long pid = std::strtol(name.c_str() + std::strlen(kRegionDirPrefix), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
      continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) std::filesystem::remove_all(entry.path(), ec);
    ::close(fd);
  }
}

std::chrono::milliseconds default_hang_timeout(int64_t longest_collective_timeout_ns) {
  if (longest_collective_timeout_ns <= 0) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::nanoseconds(longest_collective_timeout_ns)) +
         kHangTimeoutMargin;
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

std::vector<int> find_stalled(const std::vector<WatchedRank>& ranks, int64_t now_ns,
                              int64_t timeout_ns, int64_t clock_restart_ns, int64_t started_ns) {
  std::vector<int> out;
  if (timeout_ns <= 0) return out;
  for (const WatchedRank& r : ranks) {
    const int64_t progress = r.status.last_progress_ns > 0 ? r.status.last_progress_ns : started_ns;
    const int64_t latest = std::max(clock_restart_ns, progress);
    if (!r.exited && r.status.waiters == 0 && latest > 0 && now_ns - latest >= timeout_ns)
      out.push_back(r.rank);
  }
  return out;
}

FlightWatch::FlightWatch(FlightOptions options, std::vector<int> ranks)
    : options_(std::move(options)), ranks_(std::move(ranks)), regions_(ranks_.size()) {
  if (options_.shm_parent.empty()) return;
  std::string dir = fmt::format("{}/{}{}-{}-XXXXXX", options_.shm_parent, kRegionDirPrefix,
                                ::getpid(), options_.restart);
  if (::mkdtemp(dir.data()) == nullptr) {
    say(
        fmt::format("cannot make {} for the ranks' flight recorders ({}): no hang detection or "
                    "diagnosis in this attempt",
                    dir, std::strerror(errno)));
    return;
  }
  shm_dir_ = dir;
  lock_fd_ = ::open(shm_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_fd_ >= 0) ::flock(lock_fd_, LOCK_EX | LOCK_NB);  // Note [region directory]
}

FlightWatch::~FlightWatch() {
  for (Region& r : regions_) unmap(r);
  if (!shm_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(shm_dir_, ec);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void FlightWatch::set_environment(std::vector<std::string>& env) const {
  set_flight_environment(env, shm_dir_, options_.dump_dir);
}

void FlightWatch::unmap(Region& r) {
  if (r.base != nullptr) ::munmap(const_cast<void*>(r.base), r.bytes);
  r = {};
}

// Note [region file]: a rank_<R> present is a region ready to read that ddprun
// has not mapped yet (it unlinks those it mapped).
void FlightWatch::refresh() {
  if (!enabled()) return;
  for (size_t i = 0; i < regions_.size(); ++i) {
    const std::string path = fmt::format("{}/rank_{}", shm_dir_, ranks_[i]);
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_size >= static_cast<off_t>(sizeof(flight::SharedHeader))) {
      const auto bytes = static_cast<size_t>(st.st_size);
      void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        try {
          (void)flight::read_region_status(p, bytes);
          unmap(regions_[i]);  // the region of the rank's previous program
          regions_[i] = {p, bytes};
          ::unlink(path.c_str());
        } catch (const Error&) {
          ::munmap(p, bytes);  // not a region this build reads: left alone
        }
      }
    }
    ::close(fd);
  }
}

std::optional<flight::RankStatus> FlightWatch::status(size_t index) const {
  const Region& r = regions_.at(index);
  if (r.base == nullptr) return std::nullopt;
  try {
    return flight::read_region_status(r.base, r.bytes);
  } catch (const Error&) {
    return std::nullopt;  // the rank wrote over its header
  }
}

void FlightWatch::restart_clock(Clock::time_point now) {
  clock_restart_ns_ = ns_of(now);
}

std::chrono::milliseconds FlightWatch::hang_timeout() const {
  if (options_.hang_timeout) return *options_.hang_timeout;
  int64_t longest = 0;
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (const auto s = status(i)) longest = std::max(longest, s->collective_timeout_ns);
  }
  return default_hang_timeout(longest);
}

std::optional<Hang> FlightWatch::check_hang(const std::vector<RankRecord>& records,
                                            Clock::time_point now) {
  if (!enabled()) return std::nullopt;
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(hang_timeout());
  if (timeout.count() <= 0) return std::nullopt;
  return find_hang(watched(records), ns_of(now), timeout.count(), clock_restart_ns_);
}

std::vector<int> FlightWatch::stalled_ranks(const std::vector<RankRecord>& records,
                                            Clock::time_point now, Clock::time_point started) {
  if (!enabled()) return {};
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(hang_timeout());
  return find_stalled(watched(records), ns_of(now), timeout.count(), clock_restart_ns_,
                      ns_of(started));
}

std::vector<WatchedRank> FlightWatch::watched(const std::vector<RankRecord>& records) const {
  std::vector<WatchedRank> out;
  for (size_t i = 0; i < regions_.size(); ++i) {
    const auto s = status(i);
    if (!s) continue;
    out.push_back({.rank = ranks_[i], .exited = records[i].wait_status.has_value(), .status = *s});
  }
  return out;
}

std::optional<Clock::time_point> FlightWatch::last_progress(size_t index) const {
  const auto s = status(index);
  if (!s || s->last_progress_ns <= 0) return std::nullopt;
  return time_of(s->last_progress_ns);
}

std::optional<int64_t> FlightWatch::recorder_pid(size_t index) const {
  const Region& r = regions_.at(index);
  if (r.base == nullptr) return std::nullopt;
  try {
    return flight::read_region(r.base, r.bytes, 0).pid;
  } catch (const Error&) {
    return std::nullopt;  // the rank wrote over its header
  }
}

std::vector<flight::RankSnapshot> FlightWatch::snapshots(
    const std::vector<RankRecord>& records) const {
  std::vector<flight::RankSnapshot> out;
  const int64_t now = ns_of(Clock::now());
  const std::string host = flight::host_name();
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].base == nullptr) continue;
    try {
      flight::RankSnapshot s = flight::read_region(regions_[i].base, regions_[i].bytes, now);
      s.host = host;
      s.process = process_state(records[i], s.process_detail);
      out.push_back(std::move(s));
    } catch (const Error&) {
      // The rank wrote over its header: no snapshot (the diagnosis says so).
    }
  }
  return out;
}

void FlightWatch::capture(const std::vector<RankRecord>& records, const std::string& why,
                          Occasion occasion) {
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
  d.hang = occasion == Occasion::hang;
  if (!snaps.empty() && snaps.front().world_size > static_cast<int>(ranks_.size())) {
    d.other_ranks_elsewhere = partial_view_ = true;
  }
  if (!snaps.empty()) diagnosis_ = flight::diagnose(snaps, d);  // none: not ddp programs
  captured_snapshots_ = std::move(snaps);
}

bool FlightWatch::failed_in_collective(int rank) const {
  for (const flight::RankSnapshot& s : captured_snapshots_) {
    if (s.rank != rank) continue;
    return std::any_of(s.records.begin(), s.records.end(), [](const flight::CollectiveRecord& r) {
      return r.state == flight::RecordState::failed || r.timed_out;
    });
  }
  return false;
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

std::string FlightWatch::straggler_line(const std::vector<int>& left_out,
                                        const flight::StragglerOptions& options) const {
  std::vector<flight::RankActivity> ranks;
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (std::find(left_out.begin(), left_out.end(), ranks_[i]) != left_out.end()) continue;
    if (const auto s = status(i)) ranks.push_back(flight::activity_of(ranks_[i], *s));
  }
  return flight::straggler_report(std::move(ranks), options).text;
}

}  // namespace ddp::launcher
