#include "collectives/flight/diagnosis.h"

#include <fmt/ranges.h>
#include "runtime/fmt.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

namespace ddp::flight {
namespace {

std::string duration(double s) {
  return s < 100 ? fmt::format("{:.1f} s", s) : fmt::format("{:.0f} s", s);
}

// The records of one communicator on one rank, by sequence (Note [hang diagnosis]).
struct View {
  const RankSnapshot* snap = nullptr;
  std::map<int64_t, const CollectiveRecord*> by_sequence;
  int64_t lo() const { return by_sequence.begin()->first; }
  int64_t hi() const { return by_sequence.rbegin()->first; }
  const CollectiveRecord* at(int64_t s) const {
    const auto it = by_sequence.find(s);
    return it == by_sequence.end() ? nullptr : it->second;
  }
};

bool same_shape(const CollectiveRecord& a, const CollectiveRecord& b) {
  return a.kind == b.kind && a.op == b.op && a.root == b.root && a.dtype == b.dtype &&
         a.count == b.count;
}

bool same_collective(const CollectiveRecord& a, const CollectiveRecord& b) {
  return same_shape(a, b) && a.label == b.label;
}

std::string signature(const CollectiveRecord& r) {
  return r.label.empty() ? describe_shape(r) : fmt::format("{} ('{}')", describe_shape(r), r.label);
}

// "all_reduce #1234 (ddp bucket 3, 1.2 MB)"
std::string named(const CollectiveRecord& r, bool multi_comm) {
  std::string details = r.label;
  if (r.kind != CollectiveKind::barrier)
    details += (details.empty() ? "" : ", ") + human_bytes(r.bytes);
  return fmt::format("{} #{}{}{}", collective_name(r.kind), r.sequence,
                     multi_comm ? fmt::format(" of comm {}", r.comm) : "",
                     details.empty() ? "" : fmt::format(" ({})", details));
}

std::string process_note(const RankSnapshot& s) {
  switch (s.process) {
    case ProcessState::stopped:
      return s.process_detail.empty() ? " (stopped)"
                                      : fmt::format(" (stopped by {})", s.process_detail);
    case ProcessState::exited:
      return s.process_detail.empty() ? " (exited)"
                                      : fmt::format(" (exited: {})", s.process_detail);
    default:
      return "";
  }
}

std::string waited_text(const std::vector<double>& waits) {
  const auto [lo, hi] = std::minmax_element(waits.begin(), waits.end());
  return *hi - *lo < 1.0 ? duration(*hi) : fmt::format("{} to {}", duration(*lo), duration(*hi));
}

struct Finding {
  std::vector<std::string> lines;
  std::vector<int> suspects;
  std::set<int> named;  // ranks whose process state was said
  // A collective every rank in view entered and none completed or skipped.
  std::string entered_by_all;
  // The view is one node's of a larger world (DiagnosisOptions::other_ranks_elsewhere).
  bool partial = false;
};

// 1. The first sequence number two ranks used for different collectives.
void find_mismatch(const std::vector<View>& views, Finding& out) {
  std::set<int64_t> sequences;
  for (const View& v : views) {
    for (const auto& [s, r] : v.by_sequence) sequences.insert(s);
  }
  for (const int64_t s : sequences) {
    std::vector<std::pair<const CollectiveRecord*, std::vector<int>>> groups;
    for (const View& v : views) {
      const CollectiveRecord* r = v.at(s);
      if (r == nullptr) continue;
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const auto& g) { return same_collective(*g.first, *r); });
      if (g == groups.end()) groups.push_back({r, {}}), g = groups.end() - 1;
      g->second.push_back(v.snap->rank);
    }
    if (groups.size() < 2) continue;
    std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
      return a.second.size() < b.second.size();
    });
    // Labels are the callers' words: the same shape under other labels may be
    // the same collective, or (equal bucket sizes) a skipped one. Said so.
    const bool labels_only = std::all_of(groups.begin(), groups.end(), [&](const auto& g) {
      return same_shape(*g.first, *groups.front().first);
    });
    std::string text = fmt::format("collective mismatch at #{}{}{}: ", s,
                                   groups.front().first->comm != 0
                                       ? fmt::format(" of comm {}", groups.front().first->comm)
                                       : "",
                                   labels_only ? " (same shape, different labels)" : "");
    for (size_t i = 0; i < groups.size(); ++i) {
      text += fmt::format("{}{} {}{}", i == 0 ? "" : ", ", rank_list(groups[i].second),
                          i == 0 ? "called " : "", signature(*groups[i].first));
    }
    out.lines.push_back(text);
    if (groups[0].second.size() < groups[1].second.size()) {
      for (int r : groups[0].second) out.suspects.push_back(r);
    }
    return;
  }
}

// How long `s` has waited in the collective `r`, or nullopt when it is not
// blocked in a wait for it (or a later one of the same communicator).
std::optional<double> waiting_in(const RankSnapshot& s, const CollectiveRecord& r) {
  const RankStatus& st = s.status;
  if (st.waiters > 0 && st.wait_comm == r.comm && st.wait_sequence >= r.sequence &&
      st.wait_since_ns > 0) {
    return seconds(s.taken_ns - st.wait_since_ns);
  }
  return std::nullopt;
}

bool halted(const RankSnapshot& s) {
  return s.process == ProcessState::stopped || s.process == ProcessState::exited;
}

// Where each rank stands in the stuck collective.
struct StuckRanks {
  std::vector<int> never, completed, open;  // never issued it; completed it; issued, not completed
  std::vector<int> waiting;                 // open, running, blocked in a wait for it
  std::vector<double> waits;                // how long, by `waiting`
  std::vector<int> busy;                    // open, running, not blocked
  std::vector<int> failed;                  // open: it failed there
  std::vector<int> timed_out;               // open: the rank's timeout ended it there
  std::vector<const RankSnapshot*> halted;  // open, stopped or exited
};

StuckRanks classify(int64_t stuck, const std::map<int, const View*>& views,
                    const std::vector<const RankSnapshot*>& all) {
  StuckRanks k;
  for (const RankSnapshot* s : all) {
    const auto it = views.find(s->rank);
    const View* v = it == views.end() ? nullptr : it->second;
    const CollectiveRecord* r = v == nullptr ? nullptr : v->at(stuck);
    if (v == nullptr || stuck > v->hi()) {
      k.never.push_back(s->rank);
    } else if (r == nullptr) {
      continue;  // before its window: too old to say
    } else if (r->state == RecordState::completed) {
      k.completed.push_back(s->rank);
    } else {
      k.open.push_back(s->rank);
      const auto w = waiting_in(*s, *r);
      if (r->state == RecordState::failed) {
        (r->timed_out ? k.timed_out : k.failed).push_back(s->rank);
      } else if (halted(*s)) {
        k.halted.push_back(s);
      } else if (w) {
        k.waiting.push_back(s->rank);
        k.waits.push_back(*w);
      } else {
        k.busy.push_back(s->rank);
      }
    }
  }
  return k;
}

// "ranks 0,1,3 have waited 5.0 s in it; rank 2 is stopped by SIGSTOP inside it"
std::string open_text(const StuckRanks& k) {
  std::vector<std::string> parts;
  if (!k.waiting.empty()) {
    parts.push_back(fmt::format("{} {} waited {} in it", rank_list(k.waiting),
                                k.waiting.size() == 1 ? "has" : "have", waited_text(k.waits)));
  }
  if (!k.busy.empty()) {
    parts.push_back(fmt::format("{} entered it and {} not waiting for it yet", rank_list(k.busy),
                                k.busy.size() == 1 ? "is" : "are"));
  }
  if (!k.timed_out.empty())
    parts.push_back(fmt::format("{} timed out in it", rank_list(k.timed_out)));
  if (!k.failed.empty()) parts.push_back(fmt::format("{} failed in it", rank_list(k.failed)));
  for (const RankSnapshot* s : k.halted) {
    parts.push_back(
        s->process == ProcessState::stopped
            ? fmt::format("rank {} is stopped{} inside it", s->rank,
                          s->process_detail.empty() ? "" : " by " + s->process_detail)
            : fmt::format("rank {} exited{} inside it", s->rank,
                          s->process_detail.empty() ? "" : " (" + s->process_detail + ")"));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

// "rank 2 (stopped by SIGSTOP): its last collective is ...; it is in no collective"
std::string never_text(const RankSnapshot& s, const View* v, bool multi_comm) {
  std::string last = "it issued no collective on this communicator";
  if (v != nullptr) {
    const CollectiveRecord& r = *v->by_sequence.rbegin()->second;
    const int64_t at = r.finished_ns > 0 ? r.finished_ns : r.enqueued_ns;
    last = fmt::format("its last collective is {}, {} {} before this report", named(r, multi_comm),
                       record_state_name(r.state), duration(seconds(s.taken_ns - at)));
  }
  const std::string doing =
      s.status.waiters > 0
          ? fmt::format("it waits in #{}{} since {}", s.status.wait_sequence,
                        multi_comm ? fmt::format(" of comm {}", s.status.wait_comm) : "",
                        duration(seconds(s.taken_ns - s.status.wait_since_ns)))
          : "it is in no collective";
  return fmt::format("rank {}{}: {}; {}", s.rank, process_note(s), last, doing);
}

// 2. The lowest sequence number some rank issued and did not complete.
void find_stuck(const std::vector<View>& views, const std::vector<const RankSnapshot*>& all,
                bool multi_comm, const std::string& every, Finding& out) {
  std::optional<int64_t> stuck;
  const CollectiveRecord* example = nullptr;
  for (const View& v : views) {
    const auto open = std::find_if(v.by_sequence.begin(), v.by_sequence.end(), [](const auto& e) {
      return e.second->state != RecordState::completed;
    });
    if (open != v.by_sequence.end() && (!stuck || open->first < *stuck))
      stuck = open->first, example = open->second;
  }
  if (!stuck) return;
  std::map<int, const View*> by_rank;
  for (const View& v : views) by_rank[v.snap->rank] = &v;
  const StuckRanks k = classify(*stuck, by_rank, all);
  for (const RankSnapshot* s : k.halted) out.named.insert(s->rank);
  const std::string what = named(*example, multi_comm), open = open_text(k);
  if (!k.never.empty()) {
    out.lines.push_back(fmt::format("{} never entered {}{}{}", rank_list(k.never), what,
                                    open.empty() ? "" : "; ", open));
    for (const RankSnapshot* s : all) {
      if (std::find(k.never.begin(), k.never.end(), s->rank) == k.never.end()) continue;
      const auto it = by_rank.find(s->rank);
      out.lines.push_back(never_text(*s, it == by_rank.end() ? nullptr : it->second, multi_comm));
      out.named.insert(s->rank);
      out.suspects.push_back(s->rank);
    }
  } else if (!k.completed.empty()) {
    if (out.entered_by_all.empty()) out.entered_by_all = what;
    out.lines.push_back(fmt::format("{} entered {}; {} completed it, {} did not{}", every, what,
                                    rank_list(k.completed), rank_list(k.open),
                                    open.empty() ? "" : fmt::format(" ({})", open)));
    // Of those that did not, the stopped or dead ones hold the others back;
    // without such a rank, those that did not. In one node's view of a larger
    // world, a rank waiting in it waits for ranks elsewhere: no suspect.
    for (const RankSnapshot* s : k.halted) out.suspects.push_back(s->rank);
    if (k.halted.empty()) {
      for (const int r : k.open) {
        const bool waits = std::find(k.waiting.begin(), k.waiting.end(), r) != k.waiting.end();
        if (!out.partial || !waits) out.suspects.push_back(r);
      }
    }
  } else {
    if (out.entered_by_all.empty()) out.entered_by_all = what;
    out.lines.push_back(fmt::format("{} entered {} and none completed it{}", every, what,
                                    open.empty() ? "" : ": " + open));
    for (const RankSnapshot* s : k.halted) out.suspects.push_back(s->rank);
  }
}

}  // namespace

std::string describe_shape(const CollectiveRecord& r) {
  std::string args;
  switch (r.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter:
      args = fmt::format("({})", reduce_op_name(r.op));
      break;
    case CollectiveKind::reduce:
      args = fmt::format("({}, root {})", reduce_op_name(r.op), r.root);
      break;
    case CollectiveKind::broadcast:
      args = fmt::format("(root {})", r.root);
      break;
    case CollectiveKind::all_gather:
    case CollectiveKind::barrier:
      break;
  }
  if (r.kind == CollectiveKind::barrier) return "barrier";
  return fmt::format("{}{} of {} {}", collective_name(r.kind), args, r.count, dtype_name(r.dtype));
}

std::string human_bytes(int64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes < 1000) return fmt::format("{} B", bytes);
  if (b < 1e6) return fmt::format("{:.1f} KB", b / 1e3);
  if (b < 1e9) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.1f} GB", b / 1e9);
}

std::string rank_list(std::vector<int> ranks) {
  return id_list(std::move(ranks), "rank", "ranks");
}

std::string id_list(std::vector<int> ids, std::string_view one, std::string_view many) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::string out = fmt::format("{} ", ids.size() == 1 ? one : many);
  constexpr int kMaxRuns = 12;  // then "... (N in all)": one line for 65536 nodes too
  int runs = 0;
  for (size_t i = 0; i < ids.size(); ++runs) {
    if (runs == kMaxRuns) {
      out += fmt::format(",... ({} in all)", ids.size());
      break;
    }
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (i > 0) out += ",";
    out += j >= i + 2
               ? fmt::format("{}-{}", ids[i], ids[j])
               : (j == i + 1 ? fmt::format("{},{}", ids[i], ids[j]) : fmt::format("{}", ids[i]));
    i = j + 1;
  }
  return out;
}

namespace {

// The ranks the view should cover and does not.
std::vector<int> missing_ranks(const std::vector<const RankSnapshot*>& all,
                               const std::vector<int>& expected) {
  std::vector<int> missing;
  for (int r : expected) {
    if (std::none_of(all.begin(), all.end(), [&](auto* s) { return s->rank == r; }))
      missing.push_back(r);
  }
  return missing;
}

// The running ranks in view that wait in no collective.
std::vector<int> outside_collectives(const std::vector<const RankSnapshot*>& all) {
  std::vector<int> out;
  for (const RankSnapshot* s : all) {
    if (!halted(*s) && s->status.waiters == 0) out.push_back(s->rank);
  }
  return out;
}

// A hang (DiagnosisOptions::hang) that this view sees no collective hold up:
// the ranks here hold the others back from outside any collective (Note [hang
// on several nodes] in launcher/group.cpp). `pending`: some collective of the
// view is pending, just not waited in.
std::string stalled_outside(const std::vector<const RankSnapshot*>& all, const DiagnosisOptions& o,
                            bool pending, Finding& f) {
  const std::vector<int> idle = outside_collectives(all);
  const std::string others =
      o.other_ranks_elsewhere ? " while ranks on other nodes wait in one for them" : "";
  const std::string here = o.other_ranks_elsewhere ? " of this node" : "";
  for (const RankSnapshot* s : all) {  // a stopped or exited one too
    if (s->status.waiters == 0) f.suspects.push_back(s->rank);
  }
  const std::string lead =
      pending ? fmt::format("a hang, yet no rank{} has waited 1 s or more in a collective", here)
              : fmt::format("a hang, yet every rank{} completed every collective it issued", here);
  if (idle.empty()) return fmt::format("{}: none of them is in a collective{}", lead, others);
  return fmt::format("{}: {} {} stalled outside any collective (in compute, data loading or I/O){}",
                     lead, rank_list(idle), idle.size() == 1 ? "is" : "are", others);
}

// Stopped ranks not named yet, ranks out of view, and whether this is a hang at all.
void add_notes(Finding& f, const std::vector<const RankSnapshot*>& all,
               const std::vector<int>& expected, int world, const DiagnosisOptions& o) {
  const std::vector<int> missing = missing_ranks(all, expected);
  const size_t findings = f.lines.size();
  double longest_wait = 0;
  bool halted_any = false;
  for (const RankSnapshot* s : all) {
    if (s->status.waiters > 0 && s->status.wait_since_ns > 0)
      longest_wait = std::max(longest_wait, seconds(s->taken_ns - s->status.wait_since_ns));
    halted_any = halted_any || halted(*s);
    if (s->process != ProcessState::stopped || f.named.count(s->rank) != 0) continue;
    f.lines.push_back(fmt::format("rank {} is stopped{}", s->rank,
                                  s->process_detail.empty() ? "" : " by " + s->process_detail));
  }
  if (!missing.empty() && o.missing_would_have_dumped && !f.entered_by_all.empty()) {
    // Ranks dump when a collective times out on them: one that left no dump
    // was not waiting in one.
    f.lines.push_back(fmt::format(
        "{}: {}; no collective timed out or failed on {}, so {} most likely never entered {} "
        "(stopped, stuck outside collectives, or killed first)",
        rank_list(missing), o.missing_reason, missing.size() == 1 ? "it" : "them",
        missing.size() == 1 ? "it" : "they", f.entered_by_all));
    f.suspects.insert(f.suspects.end(), missing.begin(), missing.end());
  } else if (!missing.empty()) {
    f.lines.push_back(
        fmt::format("{}: {}; not part of this diagnosis", rank_list(missing), o.missing_reason));
  }
  if (o.other_ranks_elsewhere) {
    std::vector<int> elsewhere;
    for (int r = 0; r < world; ++r) {
      if (std::find(expected.begin(), expected.end(), r) == expected.end()) elsewhere.push_back(r);
    }
    f.lines.push_back(fmt::format(
        "{} run on other nodes: their side is in their nodes' dumps (`ddprun analyze` over "
        "every node's dumps covers all ranks)",
        rank_list(elsewhere)));
  }
  if (findings == 0) {
    f.lines.insert(f.lines.begin(),
                   all.empty() ? std::string("no flight recorder data")
                   : o.hang    ? stalled_outside(all, o, false, f)
                               : std::string("no collective is pending or mismatched: every rank "
                                                "completed every collective it issued"));
  } else if (!halted_any && missing.empty() && longest_wait < 1.0 && o.hang) {
    f.lines.push_back(stalled_outside(all, o, true, f));
  } else if (!halted_any && missing.empty() && longest_wait < 1.0) {
    f.lines.push_back(
        "no rank has waited 1 s or more in a collective: a snapshot of a running job (a SIGUSR1 "
        "dump?), not a hang");
  }
}

}  // namespace

Diagnosis diagnose(const std::vector<RankSnapshot>& ranks, const DiagnosisOptions& options) {
  std::vector<const RankSnapshot*> all;
  int world = 0;
  std::set<int> comms;
  for (const RankSnapshot& s : ranks) {
    all.push_back(&s);
    world = std::max(world, s.world_size);
    for (const CollectiveRecord& r : s.records) comms.insert(r.comm);
  }
  std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
  std::vector<int> expected = options.expected_ranks;
  if (expected.empty()) {
    for (int r = 0; r < world; ++r) expected.push_back(r);
  }
  const std::string every = options.other_ranks_elsewhere          ? "every rank of this node"
                            : missing_ranks(all, expected).empty() ? "every rank"
                                                                   : "every rank with a dump";
  Finding f;
  f.partial = options.other_ranks_elsewhere;
  for (const int comm : comms) {
    std::vector<View> views;
    for (const RankSnapshot* s : all) {
      View v{s, {}};
      for (const CollectiveRecord& r : s->records) {
        if (r.comm == comm) v.by_sequence[r.sequence] = &r;
      }
      if (!v.by_sequence.empty()) views.push_back(std::move(v));
    }
    find_mismatch(views, f);
    find_stuck(views, all, comms.size() > 1, every, f);
  }
  add_notes(f, all, expected, world, options);
  std::sort(f.suspects.begin(), f.suspects.end());
  f.suspects.erase(std::unique(f.suspects.begin(), f.suspects.end()), f.suspects.end());
  return {std::move(f.lines), std::move(f.suspects)};
}

std::vector<std::string> rank_lines(const std::vector<RankSnapshot>& ranks) {
  std::vector<std::string> out;
  for (const RankSnapshot& s : ranks) {
    std::string state = std::string(process_state_name(s.process)) +
                        (s.process_detail.empty() ? "" : " (" + s.process_detail + ")");
    std::string doing = "in no collective";
    if (s.status.waiters > 0) {
      doing = fmt::format("waiting in #{} for {}", s.status.wait_sequence,
                          duration(seconds(s.taken_ns - s.status.wait_since_ns)));
    }
    const CollectiveRecord* last_done = nullptr;
    for (const CollectiveRecord& r : s.records) {
      if (r.state == RecordState::completed) last_done = &r;
    }
    out.push_back(fmt::format(
        "rank {:<3} pid {:<8} {:<18} {}; {} collectives issued{}{}{}", s.rank, s.pid, state, doing,
        s.recorded, last_done ? fmt::format(", last completed {}", named(*last_done, false)) : "",
        s.torn > 0 ? fmt::format(", {} record(s) being written", s.torn) : "",
        s.status.wait_torn ? ", its wait status being written (stopped inside a wait?)" : ""));
  }
  return out;
}

}  // namespace ddp::flight
