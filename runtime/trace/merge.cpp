// The merge of a run's rank files into one Chrome trace (Note [trace files]).
#include "runtime/checkpoint/json.h"
#include "runtime/error.h"
#include "runtime/trace/clock.h"
#include "runtime/trace/file.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

namespace ddp::trace {
namespace {

namespace fs = std::filesystem;

// Perfetto takes pid 0 for the idle process (google/perfetto#394): rank R is R + 1.
int pid_of(const Snapshot& s) {
  return s.rank.rank + 1;
}

// One rank as the merge writes it: its clock map (samples sorted once) and the
// merged ids of its flow arrows.
struct RankView {
  const Snapshot& s;
  ClockMap clock;
  std::map<uint64_t, uint64_t>& flow_ids;  // (this rank's id) -> merged id
  uint64_t& next_flow_id;

  // A record time on the reference clock (Note [trace clocks]).
  int64_t aligned(int64_t ts) const { return ts + clock.offset_at(ts); }
  uint64_t merged_flow(uint64_t id) {
    auto [it, added] = flow_ids.emplace(id, next_flow_id);
    if (added) ++next_flow_id;
    return it->second;
  }
};

// Nanoseconds as microseconds with 3 decimals, exactly (no rounding through a double).
std::string micros(int64_t ns) {
  const char* sign = ns < 0 ? "-" : "";
  const uint64_t magnitude = ns < 0 ? -static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  return fmt::format("{}{}.{:03}", sign, magnitude / 1000, magnitude % 1000);
}

void write_metadata(std::ostream& out, const Snapshot& s, const std::set<Track>& used) {
  const int pid = pid_of(s);
  out << fmt::format(
      "{{\"ph\": \"M\", \"pid\": {0}, \"tid\": 0, \"name\": \"process_name\", \"args\": "
      "{{\"name\": \"rank {1}\"}}}},\n"
      "{{\"ph\": \"M\", \"pid\": {0}, \"tid\": 0, \"name\": \"process_sort_index\", \"args\": "
      "{{\"sort_index\": {1}}}}},\n",
      pid, s.rank.rank);
  const std::string labels = fmt::format("{} pid {}{}{}", s.host, s.pid,
                                         s.rank.backend.empty() ? "" : ", ", s.rank.backend);
  out << fmt::format(
      "{{\"ph\": \"M\", \"pid\": {}, \"tid\": 0, \"name\": \"process_labels\", \"args\": "
      "{{\"labels\": {}}}}},\n",
      pid, json_string(labels));
  for (const TrackInfo& t : s.tracks) {
    if (used.count(t.id) == 0) continue;
    out << fmt::format(
        "{{\"ph\": \"M\", \"pid\": {0}, \"tid\": {1}, \"name\": \"thread_name\", \"args\": "
        "{{\"name\": {2}}}}},\n"
        "{{\"ph\": \"M\", \"pid\": {0}, \"tid\": {1}, \"name\": \"thread_sort_index\", "
        "\"args\": {{\"sort_index\": {1}}}}},\n",
        pid, t.id, json_string(t.name));
  }
}

void write_event(std::ostream& out, RankView& rank, const TraceEvent& e, int64_t zero) {
  out << fmt::format("{{\"ph\": \"{}\", \"pid\": {}, \"tid\": {}, \"ts\": {}", e.phase,
                     pid_of(rank.s), e.track, micros(rank.aligned(e.ts) - zero));
  // Both ends mapped: a span that ends where the next begins still does once
  // the offset is interpolated between samples.
  if (e.phase == 'X') {  // a slice of non-zero length stays one (a flow's enqueue: 1 ns)
    const int64_t dur = rank.aligned(e.ts + e.duration_ns) - rank.aligned(e.ts);
    out << ", \"dur\": " << micros(e.duration_ns > 0 ? std::max<int64_t>(1, dur) : dur);
  }
  if (e.phase == 'i') out << ", \"s\": \"t\"";
  if (e.phase == 'X' && e.flow.id != 0 && (e.flow.out || e.flow.in)) {
    // Bound to this slice (Note [trace files]); ids are per rank in the files.
    out << ", \"bind_id\": " << rank.merged_flow(e.flow.id);
    if (e.flow.out) out << ", \"flow_out\": true";
    if (e.flow.in) out << ", \"flow_in\": true";
  }
  out << ", \"name\": " << json_string(e.name) << ", \"cat\": " << json_string(e.category);
  if (!e.args.empty() || e.unfinished) {
    out << ", \"args\": {";
    const char* separator = "";
    for (const Arg& a : e.args) {
      out << separator << json_string(a.key) << ": " << a.value;
      separator = ", ";
    }
    if (e.unfinished) out << separator << "\"unfinished\": 1";
    out << "}";
  }
  out << "}";
}

void write_other_data(std::ostream& out, const std::vector<Snapshot>& ranks, int64_t zero) {
  out << "\"otherData\": {\"generator\": \"ddp trace merge\", \"run_id\": "
      << json_string(ranks.empty() ? "" : ranks.front().rank.run_id)
      << ", \"zero_ns\": " << json::quote(std::to_string(zero)) << ", \"clocks\": {";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const Snapshot& s = ranks[i];
    std::string text = "no clock sample: the rank's own clock as it is";
    if (!s.clock.empty()) {
      int64_t worst = 0;
      for (const ClockSample& c : s.clock) worst = std::max(worst, c.error_ns);
      text = fmt::format("offset {} ns to {} (+-{} ns, {} sample(s))", s.clock.front().offset_ns,
                         s.clock.front().reference, worst, s.clock.size());
    }
    out << (i == 0 ? "" : ", ") << json_string(fmt::format("rank {}", s.rank.rank)) << ": "
        << json_string(text);
  }
  out << "}},\n";
}

}  // namespace

void write_chrome_trace(std::ostream& out, const std::vector<Snapshot>& ranks) {
  std::vector<std::map<uint64_t, uint64_t>> flow_ids(ranks.size());
  uint64_t next_flow_id = 1;
  std::vector<RankView> views;
  views.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i)
    views.push_back({ranks[i], ClockMap(ranks[i].clock), flow_ids[i], next_flow_id});
  int64_t zero = std::numeric_limits<int64_t>::max();
  for (const RankView& v : views) {
    for (const TraceEvent& e : v.s.events) zero = std::min(zero, v.aligned(e.ts));
  }
  if (zero == std::numeric_limits<int64_t>::max()) zero = 0;
  out << "{\"displayTimeUnit\": \"ms\",\n";
  write_other_data(out, ranks, zero);
  out << "\"traceEvents\": [\n";
  const char* separator = "";
  for (RankView& v : views) {
    std::set<Track> used;
    for (const TraceEvent& e : v.s.events) used.insert(e.track);
    std::ostringstream meta;
    write_metadata(meta, v.s, used);
    std::string text = meta.str();
    text.resize(text.size() - 2);  // the last ",\n"
    out << separator << text;
    separator = ",\n";
    for (const TraceEvent& e : v.s.events) {
      out << separator;
      write_event(out, v, e, zero);
    }
  }
  out << "\n]}\n";
}

namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct RankFileId {
  int rank = 0, restart = 0;
};

// rank_<R>.json or rank_<R>_restart<K>.json (rank_file_name): R and K; nullopt
// for any other name.
std::optional<RankFileId> rank_file_id(const fs::path& p) {
  const std::string name = p.filename().string();
  if (!name.starts_with("rank_") || !name.ends_with(".json")) return std::nullopt;
  std::string_view middle = std::string_view(name).substr(5, name.size() - 10);
  std::string_view restart = "0";
  if (const size_t r = middle.find("_restart"); r != std::string_view::npos) {
    restart = middle.substr(r + 8);
    middle = middle.substr(0, r);
  }
  if (!all_digits(middle) || !all_digits(restart) || middle.size() > 9 || restart.size() > 9)
    return std::nullopt;
  return RankFileId{std::stoi(std::string(middle)), std::stoi(std::string(restart))};
}

struct Found {
  std::string path;
  fs::file_time_type mtime;
  Snapshot trace;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), "{}: cannot read", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

namespace {

// Every readable rank file of DIR; the unreadable ones go to report.skipped (why)
// and `unreadable` (whose).
std::vector<Found> read_rank_files(const std::string& dir, MergeReport& report,
                                   std::vector<RankFileId>& unreadable) {
  std::error_code ec;
  DDP_CHECK(fs::is_directory(dir, ec),
            "trace directory '{}' does not exist; pass the DIR given to --trace or DDP_TRACE", dir);
  std::vector<Found> found;
  // Never throws: a directory that cannot be listed (further) is said, not thrown.
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    std::error_code file_ec;
    const auto id = rank_file_id(entry.path());
    if (!entry.is_regular_file(file_ec) || !id) continue;
    const std::string path = entry.path().string();
    try {
      const fs::file_time_type mtime = entry.last_write_time(file_ec);
      found.push_back({path, mtime, parse_rank_file(read_all(path), path)});
    } catch (const Error& e) {
      report.skipped.push_back(e.what());
      unreadable.push_back(*id);
    }
  }
  if (ec) report.skipped.push_back(fmt::format("{}: cannot list it: {}", dir, ec.message()));
  DDP_CHECK(!found.empty(),
            "{} holds no readable rank trace (rank_<R>.json){}; run the program with DDP_TRACE={} "
            "or ddprun --trace {}",
            dir, report.skipped.empty() ? "" : fmt::format(": {}", fmt::join(report.skipped, "; ")),
            dir, dir);
  return found;
}

// The files of one run and restart (report.run_id, report.restart: chosen here
// when the options leave them open), sorted by rank; the others are skipped.
std::vector<Snapshot> select_run(std::vector<Found>& found, const MergeOptions& options,
                                 MergeReport& report) {
  report.run_id = options.run_id;
  if (report.run_id.empty()) {
    const auto newest = std::max_element(found.begin(), found.end(),
                                         [](auto& a, auto& b) { return a.mtime < b.mtime; });
    report.run_id = newest->trace.rank.run_id;
  }
  report.restart = options.restart;
  for (const Found& f : found) {
    if (f.trace.rank.run_id == report.run_id && options.restart < 0)
      report.restart = std::max(report.restart, f.trace.rank.restart);
  }
  std::vector<Snapshot> ranks;
  for (Found& f : found) {
    if (f.trace.rank.run_id != report.run_id || f.trace.rank.restart != report.restart) {
      report.skipped.push_back(fmt::format("{}: of run '{}' restart {}, not run '{}' restart {}",
                                           f.path, f.trace.rank.run_id, f.trace.rank.restart,
                                           report.run_id, report.restart));
      continue;
    }
    ranks.push_back(std::move(f.trace));
  }
  std::sort(ranks.begin(), ranks.end(),
            [](const Snapshot& a, const Snapshot& b) { return a.rank.rank < b.rank.rank; });
  return ranks;
}

}  // namespace

MergeReport merge_trace_dir(const std::string& dir, const MergeOptions& options) {
  MergeReport report;
  std::vector<RankFileId> unreadable;
  std::vector<Found> found = read_rank_files(dir, report, unreadable);
  const std::vector<Snapshot> ranks = select_run(found, options, report);
  DDP_CHECK(!ranks.empty(), "{} holds no rank trace of run '{}' restart {}", dir, report.run_id,
            report.restart);
  const int expected =
      options.expected_ranks > 0 ? options.expected_ranks : ranks.front().rank.world_size;
  for (int r = 0; r < expected; ++r) {
    const bool have = std::any_of(ranks.begin(), ranks.end(),
                                  [r](const Snapshot& s) { return s.rank.rank == r; });
    // A rank whose file of this restart is there but unreadable is no missing rank.
    const bool cut = std::any_of(unreadable.begin(), unreadable.end(), [&](const RankFileId& u) {
      return u.rank == r && u.restart == report.restart;
    });
    if (!have) (cut ? report.unreadable : report.missing).push_back(r);
  }
  for (const Snapshot& s : ranks) {
    report.ranks.push_back(s.rank.rank);
    report.events += static_cast<int64_t>(s.events.size());
  }
  report.output = options.output.empty() ? (fs::path(dir) / "trace.json").string() : options.output;
  write_atomically(report.output, [&ranks](std::ostream& out) { write_chrome_trace(out, ranks); });
  return report;
}

std::string describe(const MergeReport& report) {
  std::string text = fmt::format("merged {} rank(s) ({} events) into {}", report.ranks.size(),
                                 report.events, report.output);
  if (!report.unreadable.empty()) {
    text += fmt::format(
        "; the trace file of rank(s) {} is unreadable, left out (not valid JSON: cut short, or "
        "written over?)",
        fmt::join(report.unreadable, ","));
  }
  if (!report.missing.empty()) {
    text += fmt::format("; no trace from rank(s) {} (killed before they could write one?)",
                        fmt::join(report.missing, ","));
  }
  return text;
}

}  // namespace ddp::trace
