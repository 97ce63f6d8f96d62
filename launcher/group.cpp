#include "launcher/group.h"

#include "launcher/output.h"

#include "collectives/elastic.h"
#include "runtime/env.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kRemoteCheckInterval{250};
constexpr milliseconds kHangCheckInterval{250};
// Note [hang on several nodes]
// Each node's ddprun sees only its own ranks. When the hang detector fires on
// a node whose diagnosis names none of its ranks (they all entered the stuck
// collective and wait; the rank that holds them back runs elsewhere), that
// node does not blame one of its healthy ranks at once: it waits this long for
// the other nodes' verdict (their detectors see the same hang within a poll
// or two) and ends on it; only without one does it blame locally. And a local
// rank that fails is checked against the other nodes' first failure before it
// is blamed (failed_elsewhere_first()). The other nodes' detectors see the hang
// only where a rank of theirs waits in a collective too; a node whose ranks are all
// busy elsewhere (the culprit alone on its node, stuck in compute) would never give
// a verdict. So the waiting node publishes the hang in the store (publish_hang), and
// every other node, on seeing it, looks at its own ranks for this long: a running
// rank that waits in no collective and made no progress for the hang timeout is the
// one the others wait for (find_stalled), and that node blames it and publishes the
// failure, the verdict the waiting node ends on (answer_remote_hang).
// 5 s: the answering node dumps and diagnoses first (a few seconds on a loaded machine).
constexpr milliseconds kRemoteVerdictWait{5000};
// Note [hang across nodes under continue]
// Under --on-failure continue across nodes no node blames its own ranks for a
// hang its diagnosis does not pin on them: a hung rank elsewhere is its own
// node's ddprun's to remove (its detector sees it), and a node that stopped or
// vanished is node 0's to take out (Note [nodes lost] in launcher/rendezvous.h).
// The ranks here then wait in their collective until it fails (its peers'
// connections close when they are killed) or times out (DDP_TIMEOUT_S: a machine
// gone without closing them), and regroup. A hang no node's diagnosis pins on a
// rank (every rank waits in the same collective: a connection between nodes
// half-open) is then no one's: the collectives time out, no membership comes,
// and the ranks end with their error, as for any failure that is not a
// departure (docs/elastic.md).
constexpr milliseconds kMaxPollWait{250};
// How often ddprun looks for replacements ready to join (--on-failure continue).
constexpr milliseconds kJoinCheckInterval{50};
// How often node 0 looks at the other nodes under continue (Note [nodes lost]):
// a few store round trips each time.
constexpr milliseconds kNodeCheckInterval{100};
// The interval between node 0's checks of the other nodes: kNodeCheckInterval, or
// DDPRUN_TEST_NODE_CHECK_MS, a testing aid (Note [the last events]).
milliseconds node_check_interval() {
  static const milliseconds interval{
      env::get_int("DDPRUN_TEST_NODE_CHECK_MS").value_or(kNodeCheckInterval.count())};
  return interval;
}
// DDPRUN_TEST_STOP_READ_GAP_MS, a testing aid (Note [stop before failure]): a pause
// between reading node 0's failure and its group stop, where node 0 publishes both.
milliseconds stop_read_gap() {
  static const milliseconds gap{env::get_int("DDPRUN_TEST_STOP_READ_GAP_MS").value_or(0)};
  return gap;
}
// After the last rank exited, how long to keep reading pipes that an escaped
// grandchild still holds open.
constexpr milliseconds kDrainAfterExit{500};
// While the console's backlog is full, how often to look whether it drained.
constexpr milliseconds kConsoleRecheck{50};
constexpr size_t kTailLines = 10;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool failed(int wait_status) {
  return !WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0;
}

struct RankProcess {
  int local_rank = 0;
  RankRecord rec;  // what launcher/blame.h judges
  bool running = false;
  bool departed = false;               // --on-failure continue: it left the group (leave_group())
  bool joining = false;                // a replacement not yet in a membership (check_joiners())
  bool died_in_stop = false;           // Note [group stop]: it died at the group's stop
  std::vector<std::string> extra_env;  // a replacement's DDPRUN_JOIN
  std::string err_log;                 // "" without --log-dir
  Fd out_file, err_file;
  std::unique_ptr<RankStream> out, err;
};

class Watcher {
 public:
  Watcher(const GroupSpec& spec, SignalPipe& signals, Rendezvous& rendezvous)
      : spec_(spec), signals_(signals), rendezvous_(rendezvous), flight_(spec.flight, spec.ranks) {}

  GroupResult run();

 private:
  void spawn_all();
  void spawn_one(RankProcess& r);
  void open_logs(RankProcess& r);
  void poll_once();
  void handle_signals();
  void forward_dump_request();
  void reap_exited();
  void note_stop_change(RankProcess& r);
  void judge();
  bool failed_elsewhere_first();
  std::optional<elastic::GroupStop> remote_verdict(std::optional<GroupFailure>& failure);
  void blame_suspects_of_failure(std::vector<RankRecord>& records, Clock::time_point now);
  void carry_out_blame();
  bool leave_group();
  std::vector<int> members_without(const std::vector<int>& leaving) const;
  std::string too_few(const std::vector<int>& left, const std::string& what) const;
  void publish_group(std::vector<int> group, const std::string& what);
  void stop_group(std::vector<int> left, const std::string& why, int exit_code);
  void follow_group_stop(const elastic::GroupStop& stop);
  void wait_for_group_stop();
  void leave_stop(RankProcess& r);
  void stop_without(const std::vector<int>& leaving, const std::string& what);
  bool stop_committed() const;
  void check_nodes();
  bool remote_leave(const std::vector<int>& leaving, const std::string& what, int exit_code);
  void admit_remote(int rank);
  void start_replacement(size_t index);
  void check_joiners();
  void end_unneeded_joiners();
  int node_of(int rank) const;
  bool on_this_node(int rank) const;
  // Node 0, or node 1 once it took over (Note [node 0 lost] in rendezvous.h).
  bool authority() const { return rendezvous_.authority(); }
  void become_authority(const std::string& why);
  bool across_nodes() const { return spec_.elastic && rendezvous_.multi_node(); }
  bool keep_group();
  bool stand_by();
  std::vector<int> members() const;
  BlamePolicy policy() const;
  std::vector<size_t> local_suspects() const;
  std::optional<Clock::time_point> progress_of(size_t index) const;
  std::optional<size_t> region_slot(size_t index) const;
  std::vector<RankRecord> raw_records() const;
  std::vector<RankRecord> by_slot(std::vector<RankRecord> all) const;
  std::optional<size_t> slot_of(int rank) const;
  void check_hang();
  void answer_remote_hang(Clock::time_point now);
  void end_hung_job(const Hang& hang, const std::vector<size_t>& suspects = {});
  std::vector<RankRecord> records() const;
  void check_remote();
  // `killed`: a rank already sent SIGKILL (carry_out_blame), said so and spared `sig`.
  void stop_all(int sig, const std::string& why, std::optional<size_t> killed = std::nullopt);
  void kill_all();
  bool all_exited() const;
  bool streams_open() const;
  GroupResult result() const;
  void print_summary() const;
  void print_flight_summary() const;

  const GroupSpec& spec_;
  SignalPipe& signals_;
  Rendezvous& rendezvous_;
  std::vector<RankProcess> ranks_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_exit_;
  Clock::time_point next_remote_check_ = Clock::now();
  Clock::time_point next_hang_check_ = Clock::now();
  struct PendingHang {
    Hang hang;
    Clock::time_point deadline;
  };
  std::optional<PendingHang> pending_hang_;  // Note [hang on several nodes]
  // Another node's hang request being answered (Note [hang on several nodes]): the
  // requests seen so far, and until when to look for a stalled rank here.
  int64_t hangs_seen_ = 0;
  std::optional<Clock::time_point> answer_until_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_deadline_;
  Clock::time_point last_judged_ = Clock::now();  // Note [stop clocks]
  int stop_signal_ = 0;                           // ddprun's own SIGINT/SIGTERM/SIGHUP
  std::optional<Blame> blame_;                    // the rank that ended the job (Note [blame])
  std::optional<GroupFailure> remote_;            // another node's failure
  FlightWatch flight_;                            // the ranks' flight recorders
  ErrorEcho error_echo_;                          // Note [one error per job] in output.h
  // --on-failure continue (Note [elastic membership] in collectives/elastic.h).
  int64_t membership_ = 0;
  // Node 0 (the authority, Note [nodes lost]): the membership last published
  // (launch ranks, every node's; members() drops the local ranks that exited).
  std::vector<int> group_;
  Clock::time_point next_node_check_ = Clock::now();
  std::vector<std::string> departures_;  // for the summary
  std::vector<int> left_;  // ranks that left the group and were not replaced (ascending)
  int replacements_ = 0;   // started, of spec_.replacements
  Clock::time_point next_join_check_ = Clock::now();
  bool said_done_ = false;           // stand_by()
  bool group_stopping_ = false;      // Note [group stop]: the ranks left save and exit
  bool group_stop_waiting_ = false;  // until kill_deadline_, then SIGTERM as stop_all()
  // The stop as node 0 published it last (stop_without() adds each death at it to
  // the why; the exit code stays the first failure's); another node: the one it
  // followed, with the epoch of the latest it saw.
  elastic::GroupStop stop_;
};

GroupResult Watcher::run() {
  for (int r = 0; r < spec_.world_size; ++r) group_.push_back(r);
  spawn_all();
  while (!all_exited() || streams_open() || keep_group() || stand_by()) {
    poll_once();
    if (all_exited() && Clock::now() - last_exit_ >= kDrainAfterExit) {
      for (auto& r : ranks_) {
        r.out->close();
        r.err->close();
      }
    }
  }
  GroupResult out = result();
  out.group_stopped = group_stopping_;
  out.ranks_left = !left_.empty();
  if (out.outcome != Outcome::success) print_summary();
  if (out.outcome == Outcome::success && !departures_.empty()) {
    // Another node's ranks may still train: the job's end is node 0's to tell.
    say(authority() ? "the job succeeded; its membership changed (--on-failure continue):"
                    : "this node's ranks are done; the changes of the group seen here "
                      "(--on-failure continue):");
    for (const std::string& d : departures_) say("  " + d);
  }
  flight_.refresh();                   // a region published since the last check
  flight::StragglerOptions straggler;  // Note [straggler report after a failure]
  // Only where this node blamed a rank: an interrupted job (Ctrl-C on a slow one) or
  // another node's failure keeps the plain report, which names the slow rank.
  straggler.after_failure = out.outcome != Outcome::success && blame_.has_value();
  if (blame_) straggler.blamed.push_back(ranks_[blame_->index].rec.rank);
  if (const std::string line = flight_.straggler_line(left_, straggler); !line.empty()) {
    say(left_.empty() ? line
                      : fmt::format("{} (not compared: rank{} {}, which left the group)", line,
                                    left_.size() == 1 ? "" : "s", fmt::join(left_, ",")));
  }
  return out;
}

void Watcher::spawn_all() {
  ranks_.resize(spec_.ranks.size());
  try {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      ranks_[i].local_rank = static_cast<int>(i);
      ranks_[i].rec.rank = spec_.ranks[i];
      open_logs(ranks_[i]);
      spawn_one(ranks_[i]);
    }
  } catch (...) {
    for (auto& r : ranks_) {
      if (!r.running) continue;
      signal_group(r.rec.pid, SIGKILL);
      int status = 0;
      ::waitpid(r.rec.pid, &status, 0);
    }
    throw;
  }
}

void Watcher::open_logs(RankProcess& r) {
  const std::string& dir = spec_.output.log_dir;
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const bool append =
      spec_.restart > 0 || r.joining;  // a replacement goes after the rank it replaces
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC);
  const std::string base = fmt::format("{}/rank_{}", dir, r.rec.rank);
  r.out_file = Fd(::open((base + ".out").c_str(), flags, 0644));
  r.err_file = Fd(::open((base + ".err").c_str(), flags, 0644));
  if (!r.out_file || !r.err_file) {
    throw LaunchError(
        fmt::format("cannot write the logs {}.out/.err: {}; pass a writable "
                    "--log-dir",
                    base, std::strerror(errno)));
  }
  r.err_log = base + ".err";
  if (append) {
    const std::string header = r.joining ? fmt::format("ddprun: replacement {}\n", replacements_)
                                         : fmt::format("ddprun: restart {}\n", spec_.restart);
    write_all(r.out_file.get(), header.data(), header.size());
    write_all(r.err_file.get(), header.data(), header.size());
  }
}

void Watcher::spawn_one(RankProcess& r) {
  const OutputOptions& o = spec_.output;
  const bool console = o.quiet ? r.rec.rank == 0 : (o.log_dir.empty() || o.tee);
  const std::string prefix = o.prefix ? fmt::format("[rank {}] ", r.rec.rank) : "";
  Pipe out = make_pipe();
  Pipe err = make_pipe();
  r.out = std::make_unique<RankStream>(std::move(out.read),
                                       StreamSink{.console_fd = console ? STDOUT_FILENO : -1,
                                                  .file_fd = r.out_file.get(),
                                                  .prefix = prefix});
  r.err = std::make_unique<RankStream>(std::move(err.read),
                                       StreamSink{.console_fd = console ? STDERR_FILENO : -1,
                                                  .file_fd = r.err_file.get(),
                                                  .prefix = prefix,
                                                  .tail_lines = kTailLines,
                                                  .rank = r.rec.rank,
                                                  .echo = &error_echo_});
  std::vector<std::string> env = spec_.envs[static_cast<size_t>(r.local_rank)];
  env.insert(env.end(), r.extra_env.begin(), r.extra_env.end());
  flight_.set_environment(env);  // Note [region directory]
  r.rec.start = Clock::now();
  r.rec.pid = spawn({.path = spec_.program_path,
                     .argv = spec_.argv,
                     .env = env,
                     .stdout_fd = out.write.get(),
                     .stderr_fd = err.write.get()});
  r.running = true;
}

void Watcher::poll_once() {
  std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
  std::vector<RankStream*> streams;
  // Note [a console that does not read]: past the backlog, the ranks' pipes wait.
  const bool console_full = console_backlog() > kConsoleBacklog;
  for (auto& r : ranks_) {
    for (RankStream* s : {r.out.get(), r.err.get()}) {
      if (s->fd() < 0 || console_full) continue;
      fds.push_back({s->fd(), POLLIN, 0});
      streams.push_back(s);
    }
  }
  // Node 0 across nodes: a node lost is seen within kNodeCheckInterval, even while
  // the ranks, waiting for the next membership, print nothing; node 1 with the
  // store's backup sees node 0 lost, or finished, as soon (Note [node 0 lost]).
  auto wait =
      across_nodes() && (authority() || rendezvous_.backs_up()) ? kNodeCheckInterval : kMaxPollWait;
  if (stopping_ && !killed_) {
    const auto left = std::chrono::ceil<milliseconds>(kill_deadline_ - Clock::now());
    wait = std::clamp(left, milliseconds(0), kMaxPollWait);
  }
  if (console_full) wait = std::min(wait, kConsoleRecheck);
  const int n = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  if (n > 0) {
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) streams[i - 1]->on_readable();
    }
  }
  handle_signals();
  reap_exited();
  check_hang();
  check_remote();
  check_nodes();
  check_joiners();
  if (stopping_ && !killed_ && Clock::now() >= kill_deadline_) {
    if (std::exchange(group_stop_waiting_, false)) {  // SIGTERM first, as any end
      stop_all(SIGTERM, fmt::format("the ranks left did not stop within {} s of the group's stop",
                                    elastic::kGroupStopWait.count()));
    } else {
      kill_all();
    }
  }
}

void Watcher::handle_signals() {
  for (const int sig : signals_.drain()) {
    if (sig == SIGCHLD) continue;
    if (sig == SIGUSR1) {
      forward_dump_request();
      continue;
    }
    if (stop_signal_ == 0) {
      stop_signal_ = sig;
      // Note [a node interrupted]: before the ranks die under the other nodes' ranks.
      rendezvous_.publish_interrupt(sig);
      stop_all(sig, fmt::format("got {}", signal_name(sig)));
    } else if (!killed_) {
      say(fmt::format("got {} again: SIGKILL to every rank now", signal_name(sig)));
      kill_all();
    }
  }
}

// Note [SIGUSR1 to ddprun]
// `kill -USR1 <ddprun>` asks every rank for its flight recorder dump while the job
// goes on, as `kill -USR1` to each rank would (docs/flight_recorder.md). ddprun's
// handler only writes to the signal pipe; here, in the poll loop, ddprun sends
// SIGUSR1 to the process that writes each running rank's region (the rank, or a
// process of its group that the rank started), and only where that process catches
// SIGUSR1: before its first communicator a rank has no recorder and SIGUSR1 has its
// default action, which would end it. Such a rank, or one without a region, is
// named as left out. While the job ends ddprun has dumped every rank itself (Note
// [dumps from the regions]), and the signal is ignored.
void Watcher::forward_dump_request() {
  if (stopping_) {
    say("got SIGUSR1 while the job ends: ignored (ddprun dumped every rank's flight recorder "
        "when it began to end the job)");
    return;
  }
  flight_.refresh();
  std::vector<int> sent, left_out;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const RankProcess& r = ranks_[i];
    if (!r.running || r.departed) continue;
    const auto slot = region_slot(i);
    const auto pid = slot ? flight_.recorder_pid(*slot) : std::nullopt;
    // The region names its writer: it must be in the rank's process group.
    const bool ours = pid && *pid > 0 && (*pid == r.rec.pid || ::getpgid(*pid) == r.rec.pid);
    if (ours && catches_signal(static_cast<pid_t>(*pid), SIGUSR1) &&
        ::kill(static_cast<pid_t>(*pid), SIGUSR1) == 0) {
      sent.push_back(r.rec.rank);
    } else {
      left_out.push_back(r.rec.rank);
    }
  }
  std::string text = sent.empty()
                         ? "got SIGUSR1: no rank to dump its flight recorder"
                         : fmt::format(
                               "got SIGUSR1: sent it to {}, which dump their flight recorders "
                               "into {} while the job goes on",
                               flight::rank_list(sent), flight_.dump_dir());
  if (!left_out.empty()) {
    text += fmt::format(
        "; not to {} (no flight recorder yet, before the first communicator: SIGUSR1 would end "
        "{})",
        flight::rank_list(left_out), left_out.size() == 1 ? "it" : "them");
  }
  say(text);
}

// Reaps every rank that exited before judging, so that ranks which failed on
// their own at the same moment are not reported as stopped by ddprun.
void Watcher::reap_exited() {
  for (RankProcess& r : ranks_) {
    if (!r.running) continue;
    const auto status = try_reap(r.rec.pid);
    if (!status) {
      note_stop_change(r);
      continue;
    }
    r.running = false;
    r.rec.wait_status = *status;
    r.rec.stopped_since.reset();
    r.rec.exit_time = last_exit_ = Clock::now();
    if (group_stop_waiting_) leave_stop(r);
  }
  if (!stopping_) judge();
  end_unneeded_joiners();
}

void Watcher::note_stop_change(RankProcess& r) {
  const auto change = try_stop_change(r.rec.pid);
  if (!change || change->stopped == r.rec.stopped_since.has_value()) return;
  if (change->stopped) {
    r.rec.stopped_since = Clock::now();
    r.rec.stop_clock_restart.reset();
    r.rec.stop_signal = change->signal;
    const double limit = std::chrono::duration<double>(spec_.blame.stopped_timeout).count();
    // While the job ends, no deadline applies (stop_all() continues it); nor in a
    // pause (Note [stop clocks]).
    std::string deadline;
    if (job_paused(records(), policy())) {
      deadline =
          "; every running rank is stopped now: a pause, which ends nothing "
          "(--stopped-timeout counts while other ranks run)";
    } else if (limit > 0 && !stopping_) {
      deadline = fmt::format(
          "; {} if it is still stopped in {:g} s (--stopped-timeout)",
          spec_.elastic ? "it leaves the group (--on-failure continue; the job ends if fewer than "
                          "--min-ranks would be left)"
                        : "the job ends",
          limit);
    }
    say(fmt::format("rank {} (pid {}) was stopped by {}{}", r.rec.rank, r.rec.pid,
                    signal_name(change->signal), deadline));
  } else {
    // stop_all()'s own SIGCONT is no news.
    if (!r.rec.signalled) {
      say(fmt::format("rank {} (pid {}) continued after {:.1f} s stopped", r.rec.rank, r.rec.pid,
                      seconds_between(*r.rec.stopped_since, Clock::now())));
    }
    r.rec.stopped_since.reset();
    r.rec.stop_clock_restart.reset();
  }
}

// Note [blame]: the decision is launcher/blame.h's; here it is carried out.
void Watcher::judge() {
  const auto now = Clock::now();
  std::vector<RankRecord> records = this->records();
  if (stop_clocks_restart(records, last_judged_, now, policy())) {  // Note [stop clocks]
    flight_.restart_clock(now);
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].rec.stopped_since)
        ranks_[i].rec.stop_clock_restart = records[i].stop_clock_restart = now;
    }
  }
  last_judged_ = now;
  blame_ = find_blame(records, now, policy());
  if (!blame_) return;
  if (blame_->reason == BlameReason::failed) {
    if (failed_elsewhere_first()) return;
    // --on-failure continue: the rank that failed leaves; the slow ones that held
    // a collective back are alive and stay.
    if (!spec_.elastic) blame_suspects_of_failure(records, now);
  }
  carry_out_blame();
}

// Note [hang on several nodes]: a node publishes its failure before it signals
// its ranks, so when a local rank fails because another node tore its ranks
// down (a connection closed), that node's failure is already in the store: it
// is the group's first, and this node ends on it instead of blaming its own
// rank.
bool Watcher::failed_elsewhere_first() {
  if (!rendezvous_.multi_node()) return false;
  std::optional<GroupFailure> failure;
  // A rank that saved at the group's stop exited.
  if (const auto stop = remote_verdict(failure)) {
    blame_.reset();
    follow_group_stop(*stop);
    return true;
  }
  if (!failure) return false;
  blame_.reset();
  remote_ = failure;
  stop_all(SIGTERM, failure->what);
  return true;
}

// Note [blame]: a rank failed in a collective (it timed out or failed there)
// and the diagnosis names other ranks, still running, as those that held it
// back: they stalled before it failed, and find_blame() judges them so.
void Watcher::blame_suspects_of_failure(std::vector<RankRecord>& records, Clock::time_point now) {
  flight_.capture(by_slot(records), blame_->what);
  const int failed_rank = ranks_[blame_->index].rec.rank;
  const auto& suspects = flight_.diagnosis().suspects;
  if (!flight_.failed_in_collective(failed_rank) ||
      std::find(suspects.begin(), suspects.end(), failed_rank) != suspects.end())
    return;
  bool any = false;
  for (const size_t i : local_suspects()) {
    if (!ranks_[i].running) continue;
    ranks_[i].rec.last_progress = records[i].last_progress =
        progress_of(i).value_or(ranks_[i].rec.start);
    any = true;
  }
  if (any) blame_ = find_blame(records, now, policy());
}

void Watcher::carry_out_blame() {
  if (spec_.elastic && leave_group()) return;
  RankProcess& r = ranks_[blame_->index];
  flight_.capture(raw_records(), blame_->what);  // Note [dumps from the regions]: before any signal
  rendezvous_.publish_failure(
      {.node = spec_.node_rank,
       .exit_code = blame_->exit_code,
       .what = fmt::format("{} on node {}", blame_->what, spec_.node_rank)});
  std::optional<size_t> killed;
  if (r.running) {  // stopped or stalled: it cannot act on SIGTERM
    r.rec.signalled = true;
    signal_group(r.rec.pid, SIGKILL);
    killed = blame_->index;
  }
  stop_all(SIGTERM, blame_->what, killed);
}

// --on-failure continue: the rank to blame leaves the group (killed if it still
// runs: stopped or hung), and the ranks left get the next membership through
// the store (Note [elastic membership] in collectives/elastic.h). Below
// --min-ranks the ranks left stop with the group (Note [group stop]); false when
// none would be left or they cannot stop so: the job ends as without continue.
// Another node's ddprun tells node 0, which decides (Note [nodes lost]).
bool Watcher::leave_group() {
  const size_t index = blame_->index;
  RankProcess& r = ranks_[index];
  if (r.joining) {  // a replacement that never joined: the membership is unchanged
    r.departed = true;
    say(fmt::format("the replacement for rank {} failed before it joined: {}", r.rec.rank,
                    blame_->what));
    blame_.reset();
    start_replacement(index);
    return true;
  }
  std::optional<std::vector<int>> left;
  std::string too_few_why;
  if (authority()) {
    left = members_without({r.rec.rank});
    too_few_why = too_few(*left, blame_->what);
    // Note [group stop]: only ranks that said they stop so (train) are left to save.
    if (!too_few_why.empty() && (left->empty() || !rendezvous_.ranks_handle_stop())) {
      say(too_few_why + ": ending the job");
      return false;
    }
  }
  if (r.running) {
    r.rec.signalled = true;
    signal_group(r.rec.pid, SIGKILL);
    if (r.rec.stopped_since) signal_group(r.rec.pid, SIGCONT);
  }
  r.departed = true;
  left_.insert(std::upper_bound(left_.begin(), left_.end(), r.rec.rank), r.rec.rank);
  if (!too_few_why.empty()) {  // blame_ stays: the job's exit status
    stop_group(std::move(*left), too_few_why, blame_->exit_code);
    return true;
  }
  flight_.allow_next_capture();
  // The ranks left get a whole --hang-timeout to regroup: the silence that blamed
  // this one is not theirs (a hang whose diagnosis named no rank gave every rank
  // the silence as its last progress, and the next judgement blamed them one by one).
  flight_.restart_clock(Clock::now());
  for (RankProcess& other : ranks_) {
    if (!other.departed) other.rec.last_progress.reset();
  }
  pending_hang_.reset();
  if (left) {
    publish_group(std::move(*left), blame_->what);
  } else {
    rendezvous_.post_event(
        fmt::format("left {} {} {}", r.rec.rank, blame_->exit_code, blame_->what));
    const std::string what = fmt::format("{} at {:.2f} s; it left the group", blame_->what,
                                         seconds_between(start_, Clock::now()));
    departures_.push_back(what);
    say(fmt::format("{} (--on-failure continue: node 0 publishes the next membership)", what));
  }
  blame_.reset();
  start_replacement(index);
  return true;
}

// Node 0: the members once `leaving` left.
std::vector<int> Watcher::members_without(const std::vector<int>& leaving) const {
  std::vector<int> left = members();
  for (const int rank : leaving) std::erase(left, rank);
  return left;
}

// Why the group cannot go on as `left` after `what` (fewer than --min-ranks);
// empty when it can.
std::string Watcher::too_few(const std::vector<int>& left, const std::string& what) const {
  if (static_cast<int>(left.size()) >= spec_.min_ranks) return "";
  return fmt::format("{}; {} rank{} would be left, fewer than --min-ranks {}", what, left.size(),
                     left.size() == 1 ? "" : "s", spec_.min_ranks);
}

// Node 0: the next membership to the store, for every node's ranks.
void Watcher::publish_group(std::vector<int> group, const std::string& what) {
  flight_.allow_next_capture();
  pending_hang_.reset();
  group_ = std::move(group);
  ++membership_;
  rendezvous_.publish_membership(membership_, group_);
  const std::string line =
      fmt::format("{} at {:.2f} s; the group went on with ranks {}", what,
                  seconds_between(start_, Clock::now()), elastic::format_members(group_));
  departures_.push_back(line);
  say(fmt::format("{} (--on-failure continue: membership {})", line, membership_));
}

// Node 0 across nodes (Note [nodes lost]): the other nodes' events in the order
// they were posted, then the nodes lost.
void Watcher::check_nodes() {
  const auto now = Clock::now();
  // While the ranks left stop (Note [group stop]) another node's departures count,
  // not its silence: its ddprun no longer beats then, and ends once its ranks did.
  const bool stop = group_stop_waiting_;
  if (!across_nodes() || !authority() || (stopping_ && !stop) || now < next_node_check_) return;
  next_node_check_ = now + node_check_interval();
  for (const std::string& event : rendezvous_.take_events()) {
    int rank = -1, code = 1, consumed = 0;
    if (std::sscanf(event.c_str(), "left %d %d %n", &rank, &code, &consumed) == 2) {
      // Once the group stops (at this event or one before) the events after it still
      // count: remote_leave() hands them to stop_without().
      if (!remote_leave({rank}, event.substr(static_cast<size_t>(consumed)), code) &&
          !group_stop_waiting_)
        return;
    } else if (std::sscanf(event.c_str(), "ready %d", &rank) == 1) {
      admit_remote(rank);
    } else {
      say(fmt::format("ignored a malformed event from another node: '{}'", event));
    }
  }
  rendezvous_.record_events_applied();
  if (stop) return;
  for (const LostNode& lost : rendezvous_.find_lost_nodes()) {
    std::vector<int> leaving;
    for (const int rank : members()) {
      if (node_of(rank) == lost.node) leaving.push_back(rank);
    }
    const std::string who =
        leaving.empty() ? fmt::format("node {}", lost.node)
                        : fmt::format("node {} (rank{} {})", lost.node,
                                      leaving.size() == 1 ? "" : "s", fmt::join(leaving, ","));
    say(fmt::format("{} was lost: {}", who, lost.why));
    // After the group finished its ranks may have finished too: the result stands.
    const bool finished = rendezvous_.elastic_done();
    if (leaving.empty() || finished) {
      departures_.push_back(
          fmt::format("{} was lost{}", who, finished ? ", after the group finished" : ""));
    } else if (!remote_leave(leaving, who + " was lost", 1) && !group_stop_waiting_) {
      return;
    }
  }
}

// Node 0: ranks of another node left; below --min-ranks the whole job ends, on
// every node, with `exit_code`.
bool Watcher::remote_leave(const std::vector<int>& leaving, const std::string& what,
                           int exit_code) {
  if (group_stop_waiting_) {
    stop_without(leaving, what);
    return true;
  }
  std::vector<int> live;
  const std::vector<int> now = members();
  for (const int rank : leaving) {
    if (std::find(now.begin(), now.end(), rank) != now.end()) live.push_back(rank);
  }
  if (live.empty()) return true;  // left before (its node was lost, say)
  std::vector<int> left = members_without(live);
  if (std::string why = too_few(left, what); !why.empty()) {
    remote_ = GroupFailure{.node = 0, .exit_code = exit_code, .what = why};
    if (!left.empty() && rendezvous_.ranks_handle_stop()) {
      stop_group(std::move(left), why, exit_code);
      return false;
    }
    rendezvous_.publish_failure(*remote_);
    stop_all(SIGTERM, remote_->what + ": ending the job");
    return false;
  }
  publish_group(std::move(left), what);
  return true;
}

// Note [group stop] in collectives/elastic.h: fewer than --min-ranks would be left
// after `why`. The ranks left take one more membership (the most advanced one's
// state: no step lost), write --save and exit; the job then ends with `exit_code`.
void Watcher::stop_group(std::vector<int> left, const std::string& why, int exit_code) {
  group_ = std::move(left);
  ++membership_;
  stop_ = {.epoch = membership_, .exit_code = exit_code, .why = why};
  rendezvous_.publish_stop(membership_, group_, exit_code, why);
  // For a node whose ranks are all gone (the others follow the stop above).
  rendezvous_.publish_failure({.node = spec_.node_rank, .exit_code = exit_code, .what = why});
  say(
      fmt::format("{}: ending the job; the rank{} left ({}) regroup as membership {}, write "
                  "their checkpoint where --save asks and exit (SIGTERM if they have not in "
                  "{} s)",
                  why, group_.size() == 1 ? "" : "s", elastic::format_members(group_), membership_,
                  elastic::kGroupStopWait.count()));
  wait_for_group_stop();
}

// Another node (Note [group stop]): node 0 stopped the group; this node's ranks
// take part in the last membership and its checkpoint, then exit.
void Watcher::follow_group_stop(const elastic::GroupStop& stop) {
  remote_ = GroupFailure{.node = 0, .exit_code = stop.exit_code, .what = stop.why};
  stop_ = stop;
  say(
      fmt::format("node 0 stopped the group: {}; this node's ranks take part in its checkpoint "
                  "and exit (SIGTERM if they have not in {} s)",
                  stop.why, elastic::kGroupStopWait.count()));
  wait_for_group_stop();
  // A replacement this node announced ("ready") that node 0 did not take in before
  // the stop is no member of it: nothing to save.
  try {
    const auto [epoch, list] = rendezvous_.membership();
    if (epoch != stop.epoch) return;
    for (RankProcess& p : ranks_) {
      if (!p.running || p.departed || std::find(list.begin(), list.end(), p.rec.rank) != list.end())
        continue;
      p.rec.signalled = true;
      signal_group(p.rec.pid, SIGTERM);
    }
  } catch (const Error&) {  // the store went: remote_failure() says so
  }
}

// No more judging, replacements or joins (stopping_); the ranks exit by themselves
// (kill_all() at the deadline). A replacement not yet in the group has nothing to
// save: it is told to stop. A member that failed and was not judged (it died in the
// same poll as the failure that stopped the group; on another node, before its
// ddprun saw the stop: failed_elsewhere_first()) leaves the stop now.
void Watcher::wait_for_group_stop() {
  stopping_ = true;
  group_stopping_ = group_stop_waiting_ = true;
  kill_deadline_ = Clock::now() + elastic::kGroupStopWait;
  for (RankProcess& p : ranks_) {
    if (p.running && p.joining) {
      p.rec.signalled = true;
      signal_group(p.rec.pid, SIGTERM);
    } else if (!p.running && p.rec.wait_status) {
      leave_stop(p);
    }
  }
}

// Note [group stop]: a member that dies (of a signal: SIGKILL, a crash, the OOM
// killer) while the ranks left stop leaves their last membership too. Until they
// committed the checkpoint (the trainer's all_reduce after it: no rank exits
// kGroupStopExit before) the others wait for it, in the regroup or the save; node
// 0 publishes the stop once more without it (stop_without()), another node tells
// node 0. After the commit the membership published so is never formed: the
// ranks exit by themselves. A rank that exits with an error (a full disk, a
// regroup that timed out) ends the stop as it would end the job: every writer
// after it would most likely fail alike.
void Watcher::leave_stop(RankProcess& r) {
  const int status = r.rec.wait_status.value_or(0);
  if (r.departed || r.joining || r.rec.signalled || !WIFSIGNALED(status)) return;
  r.departed = true;
  const std::string what =
      fmt::format("rank {} failed at the group's stop ({})", r.rec.rank, describe_status(status));
  if (stop_committed()) {
    say(what + ", after the group's checkpoint was written: the ranks left exit");
    return;
  }
  r.died_in_stop = true;
  if (authority()) {
    stop_without({r.rec.rank}, what);
  } else {
    say(what + ": node 0 stops the group without it");
    rendezvous_.post_event(fmt::format("left {} {} {}", r.rec.rank, exit_code_of(status), what));
  }
}

// Whether a rank of this node exited kGroupStopExit: only after the trainer's
// all_reduce that commits the group's checkpoint does one, so a death after it
// costs nothing (the ranks left exit by themselves).
bool Watcher::stop_committed() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const RankProcess& p) {
    const int status = p.rec.wait_status.value_or(0);
    return !p.running && p.rec.wait_status && WIFEXITED(status) &&
           WEXITSTATUS(status) == elastic::kGroupStopExit;
  });
}

// Node 0: the stop once more, as the next membership, without `leaving` (and the
// local ranks that exited); the job's exit status stays the first failure's.
void Watcher::stop_without(const std::vector<int>& leaving, const std::string& what) {
  const bool member = std::any_of(leaving.begin(), leaving.end(), [this](int rank) {
    return std::find(group_.begin(), group_.end(), rank) != group_.end();
  });
  if (!member) return;  // none of them is in the stop's membership (it left before)
  if (stop_committed()) {
    say(what + ", after the group's checkpoint was written: the ranks left exit");
    return;
  }
  std::vector<int> left = members_without(leaving);
  left_.insert(left_.end(), leaving.begin(), leaving.end());
  std::sort(left_.begin(), left_.end());
  left_.erase(std::unique(left_.begin(), left_.end()), left_.end());
  if (left.empty()) {
    say(what + "; no rank is left to write the checkpoint");
    return;
  }
  group_ = std::move(left);
  ++membership_;
  stop_.epoch = membership_;
  stop_.why += "; then " + what;  // every death at the stop, in order
  rendezvous_.publish_stop(membership_, group_, stop_.exit_code, stop_.why);
  kill_deadline_ = Clock::now() + elastic::kGroupStopWait;
  say(fmt::format(
      "{}: the rank{} left ({}) regroup once more, as membership {}, and write the checkpoint "
      "(SIGTERM if they have not exited in {} s)",
      what, group_.size() == 1 ? "" : "s", elastic::format_members(group_), membership_,
      elastic::kGroupStopWait.count()));
}

// Node 0: another node's replacement is ready; it joins at the members' next
// step boundary.
void Watcher::admit_remote(int rank) {
  if (stopping_) return;  // the group stops: its node stops it (follow_group_stop())
  if (rendezvous_.elastic_done()) return;  // it exits by itself
  // Posted just before its node was lost: it died with it.
  if (rendezvous_.is_lost(node_of(rank))) return;
  std::vector<int> list = members();
  if (std::find(list.begin(), list.end(), rank) != list.end()) return;
  list.push_back(rank);
  group_ = list;
  ++membership_;
  rendezvous_.publish_membership(membership_, group_);
  const std::string what =
      fmt::format("the replacement for rank {} joined at {:.2f} s: the group went on with ranks {}",
                  rank, seconds_between(start_, Clock::now()), elastic::format_members(group_));
  departures_.push_back(what);
  say(fmt::format("{} (membership {})", what, membership_));
}

// Note [node 0 lost]: node 1 with the store's backup, its ranks done, stays
// while node 0 has not finished, so that it can still take over; it says it is
// done (done/1), so that node 0 can finish.
bool Watcher::stand_by() {
  if (!across_nodes() || authority() || stopping_ || !rendezvous_.backs_up()) return false;
  if (result().outcome != Outcome::success) return false;
  if (!said_done_) {
    rendezvous_.publish_done();
    said_done_ = true;
  }
  return !rendezvous_.authority_finished();
}

// Node 0 across nodes: the group goes on while another node runs ranks, so node
// 0 keeps its membership after its own ranks are gone.
//
// Note [the last events]
// A node posts its departures ("left R") before it says it is done, so once every
// other node is done, their events not yet taken are their last: node 0 applies
// them before it ends. Without that, a departure posted between two of node 0's
// checks (kNodeCheckInterval) was never applied: with this node's ranks gone too
// (a rank that failed here, a moment before, and left the group to the other
// node's), the group had no member left, and yet every agent reported success.
// Applied, such an event ends the job as any departure below --min-ranks does
// (remote_leave()), and the other nodes, waiting in wait_for_other_nodes(), read
// the failure. e2e.ddprun_nnodes' "last" case; DDPRUN_TEST_NODE_CHECK_MS widens the
// window between two checks there.
bool Watcher::keep_group() {
  if (!across_nodes() || !authority()) return false;
  // Note [group stop]: the other nodes' ranks may still die in it, with none of
  // this node's left to regroup: their agents' events are applied until they are gone.
  if (group_stop_waiting_) return !rendezvous_.others_gone();
  if (stopping_) return false;
  if (!rendezvous_.others_done()) return true;
  next_node_check_ = Clock::now();  // Note [the last events]
  check_nodes();
  return group_stop_waiting_;  // a stop published now: its ranks are gone, its events count
}

// Launch rank r runs on node r / (ranks per node): every node runs as many.
int Watcher::node_of(int rank) const {
  return rank / static_cast<int>(spec_.ranks.size());
}

bool Watcher::on_this_node(int rank) const {
  return node_of(rank) == spec_.node_rank;
}

// The members of the group now: the ranks running that neither left nor wait
// to join, ascending, then the replacements in the order they joined (Note
// [elastic membership]: a member's rank is its place in the list).
std::vector<int> Watcher::members() const {
  std::vector<int> out;
  for (const int rank : group_) {
    const bool here = std::any_of(ranks_.begin(), ranks_.end(), [rank](const RankProcess& p) {
      return p.rec.rank == rank && p.running && !p.departed && !p.joining;
    });
    if (here || !on_this_node(rank)) out.push_back(rank);
  }
  return out;
}

// --on-failure continue --max-restarts K: a new process for the rank that left,
// with DDPRUN_JOIN=1: it loads its data and model, then asks to join
// (elastic/join/<rank>); check_joiners() puts it into the next membership.
void Watcher::start_replacement(size_t index) {
  if (replacements_ >= spec_.replacements || stopping_) return;
  ++replacements_;
  RankProcess next;
  next.local_rank = ranks_[index].local_rank;
  next.rec.rank = ranks_[index].rec.rank;
  next.joining = true;
  next.extra_env = {std::string(env::kJoin) + "=1",
                    fmt::format("{}={}", env::kReplacement, replacements_)};
  ranks_.push_back(std::move(next));
  RankProcess& r = ranks_.back();
  open_logs(r);
  spawn_one(r);
  say(
      fmt::format("started a replacement for rank {} (pid {}; replacement {} of {}, "
                  "--max-restarts); it joins at a step boundary once it is ready",
                  r.rec.rank, r.rec.pid, replacements_, spec_.replacements));
}

void Watcher::check_joiners() {
  const auto now = Clock::now();
  if (stopping_ || now < next_join_check_) return;
  next_join_check_ = now + kJoinCheckInterval;
  std::vector<size_t> ready;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const RankProcess& r = ranks_[i];
    if (r.joining && r.running && !r.departed && rendezvous_.joiner_ready(r.rec.rank, r.rec.pid))
      ready.push_back(i);
  }
  if (ready.empty() || rendezvous_.elastic_done()) return;  // done: it exits by itself
  std::vector<int> list = members();
  for (const size_t i : ready) {
    ranks_[i].joining = false;
    list.push_back(ranks_[i].rec.rank);
    std::erase(left_, ranks_[i].rec.rank);  // its region is the replacement's now
    if (!authority()) {                     // Note [nodes lost]: node 0 takes it in
      rendezvous_.post_event(fmt::format("ready {}", ranks_[i].rec.rank));
      say(fmt::format("the replacement for rank {} is ready; node 0 takes it into the group",
                      ranks_[i].rec.rank));
    }
  }
  if (!authority()) return;
  group_ = list;
  ++membership_;
  rendezvous_.publish_membership(membership_, list);
  const std::string what = fmt::format(
      "the replacement for rank{} {} joined at {:.2f} s: the group went on with ranks {}",
      ready.size() == 1 ? "" : "s",
      fmt::join(list.end() - static_cast<std::ptrdiff_t>(ready.size()), list.end(), ","),
      seconds_between(start_, now), elastic::format_members(list));
  departures_.push_back(what);
  say(fmt::format("{} (membership {})", what, membership_));
}

// Replacements still waiting to join when every member has finished: not needed.
void Watcher::end_unneeded_joiners() {
  // Across nodes a replacement waits until the group finished (elastic/done).
  if (across_nodes() || !members().empty()) return;
  for (RankProcess& r : ranks_) {
    if (!r.joining || !r.running || r.departed) continue;
    r.departed = true;
    r.rec.signalled = true;
    signal_group(r.rec.pid, SIGKILL);
    say(
        fmt::format("the replacement for rank {} (pid {}) was not needed: the group finished "
                    "before it joined",
                    r.rec.rank, r.rec.pid));
  }
}

BlamePolicy Watcher::policy() const {
  BlamePolicy p = spec_.blame;
  p.progress_timeout = flight_.hang_timeout();  // Note [default hang timeout]
  p.across_nodes = rendezvous_.multi_node();    // any multi-node job, elastic or not
  return p;
}

// The local ranks the captured diagnosis names, in its order (a rank that left
// the group is not its replacement's suspect).
std::vector<size_t> Watcher::local_suspects() const {
  std::vector<size_t> out;
  for (const int rank : flight_.diagnosis().suspects) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].rec.rank == rank && !ranks_[i].departed) out.push_back(i);
    }
  }
  return out;
}

// The flight recorder's last progress of ranks_[index]. A replacement (past the
// ranks the flight recorder was made for) publishes its region under its launch
// rank (Note [region file]), which refresh() maps into that rank's slot in place
// of the departed process's: its progress is that slot's, once it is a member.
std::optional<Clock::time_point> Watcher::progress_of(size_t index) const {
  const auto slot = region_slot(index);
  return slot ? flight_.last_progress(*slot) : std::nullopt;
}

// The region slot of ranks_[index]: its own, or a replacement's once it joined
// (it writes the region of the launch rank it replaces).
std::optional<size_t> Watcher::region_slot(size_t index) const {
  if (index < spec_.ranks.size()) return index;
  if (ranks_[index].joining) return std::nullopt;
  return slot_of(ranks_[index].rec.rank);
}

// The region slot (index into spec_.ranks) of launch rank `rank` on this node.
std::optional<size_t> Watcher::slot_of(int rank) const {
  const auto it = std::find(spec_.ranks.begin(), spec_.ranks.end(), rank);
  if (it == spec_.ranks.end()) return std::nullopt;
  return static_cast<size_t>(it - spec_.ranks.begin());
}

// The records as they are, for the flight recorder's dumps and diagnosis (a
// rank that left shows how it ended).
std::vector<RankRecord> Watcher::raw_records() const {
  std::vector<RankRecord> all;
  for (const RankProcess& r : ranks_) all.push_back(r.rec);
  return by_slot(std::move(all));
}

// The flight recorder's view, one record per region slot (spec_.ranks): a slot
// whose rank was replaced (--on-failure continue) shows the replacement that is
// a member now, whose region refresh() maps there (Note [region file]), not the
// process that left (whose waits would otherwise hide the replacement's).
std::vector<RankRecord> Watcher::by_slot(std::vector<RankRecord> all) const {
  for (size_t j = spec_.ranks.size(); j < ranks_.size(); ++j) {
    if (ranks_[j].departed || ranks_[j].joining) continue;
    if (const auto slot = slot_of(ranks_[j].rec.rank)) all[*slot] = all[j];
  }
  all.resize(std::min(all.size(), spec_.ranks.size()));
  return all;
}

// A rank that left the group (--on-failure continue) counts as one that exited
// cleanly: nothing of it is to blame again.
std::vector<RankRecord> Watcher::records() const {
  std::vector<RankRecord> out;
  for (const RankProcess& r : ranks_) {
    out.push_back(r.rec);
    if (!r.departed) continue;
    RankRecord& gone = out.back();
    gone.wait_status = 0;
    gone.signalled = false;
    gone.stopped_since.reset();
    gone.last_progress.reset();
  }
  return out;
}

// Note [hang detector]. Also keeps the regions mapped for the straggler report
// when the detector is off.
void Watcher::check_hang() {
  const auto now = Clock::now();
  if (stopping_ || now < next_hang_check_) return;
  next_hang_check_ = now + kHangCheckInterval;
  flight_.refresh();
  if (pending_hang_) {  // Note [hang on several nodes]
    if (now >= pending_hang_->deadline) {
      // A verdict that came in since check_remote()'s last read (it reads every
      // kRemoteCheckInterval) ends the job as the other node found it.
      next_remote_check_ = now;
      check_remote();
      if (stopping_) return;
      say("no verdict from the other nodes: blaming this node's ranks");
      end_hung_job(pending_hang_->hang);
    }
    return;
  }
  const auto hang = flight_.check_hang(by_slot(records()), now);
  if (!hang) return answer_remote_hang(now);
  const double limit = std::chrono::duration<double>(flight_.hang_timeout()).count();
  say(fmt::format(
      "no rank made progress for {:.1f} s while {} wait{} in a collective (--hang-timeout {:g} "
      "s{}; raise it if a rank may legitimately be busy that long, in a checkpoint, an "
      "evaluation or data loading; 0 turns the detector off): {}; dumping and diagnosing",
      hang->silent_s, flight::rank_list(hang->waiting), hang->waiting.size() == 1 ? "s" : "", limit,
      spec_.flight.hang_timeout ? "" : ", the default: the ranks' collective timeout + 60 s",
      spec_.elastic ? "a hang (--on-failure continue: the rank to blame leaves the group, or the "
                      "job ends if fewer than --min-ranks would be left)"
                    : "the job is hung"));
  flight_.capture(raw_records(), "hang", FlightWatch::Occasion::hang);
  if (local_suspects().empty() && flight_.partial_view() && across_nodes()) {
    // Note [hang across nodes under continue]
    say("the diagnosis names none of this node's ranks: not blaming them (--on-failure "
        "continue); the rank to blame is its own node's ddprun's, and a node lost is node 0's "
        "to take out. The ranks here go on once their collective ends (at the latest at its "
        "timeout, DDP_TIMEOUT_S) and they regroup");
    hangs_seen_ = std::max(hangs_seen_, rendezvous_.publish_hang());
    flight_.restart_clock(now);
    flight_.allow_next_capture();
    return;
  }
  if (local_suspects().empty() && flight_.partial_view() && rendezvous_.multi_node()) {
    hangs_seen_ = std::max(hangs_seen_, rendezvous_.publish_hang());
    say(
        fmt::format("the diagnosis names none of this node's ranks: waiting {:g} s for the other "
                    "nodes' verdict",
                    std::chrono::duration<double>(kRemoteVerdictWait).count()));
    pending_hang_ = PendingHang{*hang, now + kRemoteVerdictWait};
    return;
  }
  end_hung_job(*hang);
}

// Note [hang on several nodes]: another node's ranks wait in a collective and its
// diagnosis names none of them; this node's detector sees nothing when no rank here
// waits. A rank here that waits in no collective and made no progress for the hang
// timeout is the one they wait for: blamed here, its failure is their verdict.
void Watcher::answer_remote_hang(Clock::time_point now) {
  if (!rendezvous_.multi_node() || flight_.hang_timeout().count() <= 0) return;
  if (const int64_t published = rendezvous_.hangs_published(); published > hangs_seen_) {
    hangs_seen_ = published;
    answer_until_ = now + kRemoteVerdictWait;
  }
  if (!answer_until_) return;
  if (now >= *answer_until_) {
    answer_until_.reset();  // nothing stalled here: the asking node blames its own
    return;
  }
  std::vector<size_t> stalled;
  for (const int rank : flight_.stalled_ranks(by_slot(records()), now, start_)) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].rec.rank == rank && ranks_[i].running && !ranks_[i].departed)
        stalled.push_back(i);
    }
  }
  if (stalled.empty()) return;
  answer_until_.reset();
  Hang hang;
  for (const size_t i : stalled) {  // one that never made progress: since it started
    const auto p = progress_of(i).value_or(ranks_[i].rec.start);
    hang.silent_s = std::max(hang.silent_s, std::chrono::duration<double>(now - p).count());
  }
  std::vector<int> ranks;
  for (const size_t i : stalled) ranks.push_back(ranks_[i].rec.rank);
  say(fmt::format(
      "another node's ranks wait in a collective and its diagnosis names none of them; {} of "
      "this node wait{} in no collective and made no progress for {:.1f} s (--hang-timeout "
      "{:g} s): the job is hung on {}; dumping and diagnosing",
      flight::rank_list(ranks), ranks.size() == 1 ? "s" : "", hang.silent_s,
      std::chrono::duration<double>(flight_.hang_timeout()).count(),
      ranks.size() == 1 ? "it" : "them"));
  flight_.capture(raw_records(), "hang", FlightWatch::Occasion::hang);
  end_hung_job(hang, stalled);
}

// Note [hang blame]: the suspects (every local rank when there are none) are
// judged by their last progress.
void Watcher::end_hung_job(const Hang& hang, const std::vector<size_t>& suspects) {
  const auto now = Clock::now();
  std::vector<RankRecord> records = this->records();
  HangVerdict verdict;
  verdict.silent_s = hang.silent_s;
  verdict.waiting = hang.waiting;
  // A rank this ddprun sees stopped (SIGSTOP, SIGTSTP; --stopped-timeout 0 left it
  // to this detector) cannot make progress: it is the suspect before any the
  // diagnosis names (whose view of a replacement's collectives, numbered from its
  // join, may be off).
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i].running && !ranks_[i].departed && ranks_[i].rec.stopped_since)
      verdict.suspects.push_back(i);
  }
  if (verdict.suspects.empty()) verdict.suspects = suspects;
  if (verdict.suspects.empty()) verdict.suspects = local_suspects();
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const int rank = ranks_[i].rec.rank;
    if (!ranks_[i].departed &&
        std::find(hang.waiting.begin(), hang.waiting.end(), rank) != hang.waiting.end())
      verdict.waiting_index.push_back(i);
    const bool suspect =
        verdict.suspects.empty() ||
        std::find(verdict.suspects.begin(), verdict.suspects.end(), i) != verdict.suspects.end();
    if (suspect && ranks_[i].running) {
      ranks_[i].rec.last_progress = records[i].last_progress =
          progress_of(i).value_or(ranks_[i].rec.start);
    }
  }
  blame_ = blame_hang(records, now, policy(), verdict);
  carry_out_blame();
}

void Watcher::check_remote() {
  if (!rendezvous_.multi_node()) return;
  if (stopping_) {
    // Note [group stop]: node 0 publishes the stop again when a member dies in it;
    // this node's ranks get the whole wait for that one too.
    if (group_stop_waiting_ && spec_.elastic && !authority() &&
        Clock::now() >= next_remote_check_) {
      next_remote_check_ = Clock::now() + kRemoteCheckInterval;
      if (const auto stop = rendezvous_.group_stop(); stop && stop->epoch > stop_.epoch) {
        stop_.epoch = stop->epoch;
        kill_deadline_ = Clock::now() + elastic::kGroupStopWait;
      }
    }
    return;
  }
  std::string lost;  // Note [node 0 lost]: an atomic read until the backup serves
  if (spec_.elastic && rendezvous_.take_over(lost)) return become_authority(lost);
  if (Clock::now() < next_remote_check_) return;
  next_remote_check_ = Clock::now() + kRemoteCheckInterval;
  rendezvous_.heartbeat();  // Note [nodes lost]
  std::optional<GroupFailure> failure;
  if (const auto stop = remote_verdict(failure)) return follow_group_stop(*stop);
  if (failure) {
    remote_ = failure;
    stop_all(SIGTERM, failure->what);
  } else if (auto why = rendezvous_.taken_out()) {
    remote_ = GroupFailure{.node = 0,
                           .exit_code = 1,
                           .what = fmt::format("node 0 took this node out of the group: {}", *why)};
    stop_all(SIGKILL, remote_->what);
  }
}

// Note [stop before failure]: under --on-failure continue node 0 publishes a group
// stop before the failure that goes with it (stop_group(): that one for a node whose
// ranks are all gone), and another node follows the stop when there is one. Read
// stop first, failure second, a stop published between the two reads went unseen:
// the failure's stop_all() then ended this node without telling node 0 of a member
// that died at the stop, and the ranks left waited for it in the regroup until their
// timeout (e2e.train_elastic_nnodes' min_two, once in CI: ranks 0,1 waited 30 s for a
// rank 3 already dead). So the failure is read first: a stop that came with it is then
// in the store. The stop, or nullopt with `failure` set to the failure (if any).
std::optional<elastic::GroupStop> Watcher::remote_verdict(std::optional<GroupFailure>& failure) {
  failure = rendezvous_.remote_failure();
  if (!spec_.elastic || authority()) return std::nullopt;
  if (stop_read_gap().count() > 0) std::this_thread::sleep_for(stop_read_gap());
  return rendezvous_.group_stop();
}

// Node 1 with --rdzv-backup, node 0 lost (Note [node 0 lost]): the membership
// last published, without node 0's ranks, is the next one; this node keeps it
// from now on. A failure node 0 had published first ends the job as it would have.
void Watcher::become_authority(const std::string& why) {
  if (auto failure = rendezvous_.remote_failure()) {
    remote_ = failure;
    return stop_all(SIGTERM, failure->what);
  }
  try {
    auto [epoch, list] = rendezvous_.membership();
    membership_ = epoch;
    if (epoch > 0) group_ = std::move(list);
  } catch (const Error& e) {
    remote_ = GroupFailure{.node = 0,
                           .exit_code = 1,
                           .what = fmt::format("node 0 was lost ({}), and its store's backup "
                                               "cannot be read: {}",
                                               why, e.what())};
    return stop_all(SIGTERM, remote_->what);
  }
  std::vector<int> leaving;
  for (const int rank : members()) {
    if (node_of(rank) == 0) leaving.push_back(rank);
  }
  const std::string who = leaving.empty()
                              ? "node 0"
                              : fmt::format("node 0 (rank{} {})", leaving.size() == 1 ? "" : "s",
                                            fmt::join(leaving, ","));
  say(
      fmt::format("{} was lost: {}; this node hosts the store's backup (--rdzv-backup) and keeps "
                  "the group's membership from now on",
                  who, why));
  next_node_check_ = Clock::now();  // the events node 0 had not applied, at once
  if (rendezvous_.elastic_done()) {
    departures_.push_back(fmt::format("{} was lost", who));
    return;
  }
  // Without node 0's ranks, and without this node's own departures node 0 had
  // not applied yet (members() leaves them out).
  std::vector<int> now = members_without(leaving);
  if (now == group_) {
    departures_.push_back(fmt::format("{} was lost", who));
    return;
  }
  if (std::string too = too_few(now, who + " was lost"); !too.empty()) {
    remote_ = GroupFailure{.node = spec_.node_rank, .exit_code = 1, .what = std::move(too)};
    rendezvous_.publish_failure(*remote_);
    return stop_all(SIGTERM, remote_->what + ": ending the job");
  }
  publish_group(std::move(now), who + " was lost");
}

// Sends `sig` to every running rank's process group; SIGKILL follows at the
// end of the grace period (kill_all() from poll_once()).
void Watcher::stop_all(int sig, const std::string& why, std::optional<size_t> killed) {
  flight_.capture(raw_records(), why);  // Note [dumps from the regions]: before any signal
  stopping_ = true;
  group_stop_waiting_ = false;  // a group's stop ends here too (a signal to ddprun, say)
  kill_deadline_ = Clock::now() + spec_.grace;
  const auto running =
      std::count_if(ranks_.begin(), ranks_.end(), [](auto& r) { return r.running; }) -
      (killed ? 1 : 0);
  // Note [hang blame]: the blamed rank, stalled or stopped, gets SIGKILL at once.
  const std::string at_once =
      killed ? fmt::format("sent SIGKILL to rank {} at once (it cannot act on SIGTERM){}",
                           ranks_[*killed].rec.rank, running > 0 ? "; " : "")
             : "";
  if (running > 0) {
    say(fmt::format("{}; {}sending {} to {}{} rank{}, SIGKILL after {:.3g} s", why, at_once,
                    signal_name(sig), killed ? "the other " : "", running, running == 1 ? "" : "s",
                    std::chrono::duration<double>(spec_.grace).count()));
  } else {
    say(killed ? fmt::format("{}; {}", why, at_once) : why);
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankProcess& r = ranks_[i];
    if (!r.running || (killed && i == *killed)) continue;
    r.rec.signalled = true;
    signal_group(r.rec.pid, sig);
    // A stopped rank acts on nothing but SIGKILL and SIGCONT: let it handle `sig`.
    if (r.rec.stopped_since) signal_group(r.rec.pid, SIGCONT);
  }
}

void Watcher::kill_all() {
  killed_ = true;
  for (auto& r : ranks_) {
    if (!r.running) continue;
    r.rec.signalled = true;
    signal_group(r.rec.pid, SIGKILL);
  }
}

bool Watcher::all_exited() const {
  return std::none_of(ranks_.begin(), ranks_.end(), [](auto& r) { return r.running; });
}

bool Watcher::streams_open() const {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](auto& r) { return r.out->fd() >= 0 || r.err->fd() >= 0; });
}

GroupResult Watcher::result() const {
  if (blame_) return {Outcome::rank_failed, blame_->exit_code};
  if (stop_signal_ != 0) return {Outcome::interrupted, 128 + stop_signal_};
  if (remote_) return {Outcome::remote_failed, remote_->exit_code};
  return {Outcome::success, 0};
}

void Watcher::print_summary() const {
  say(fmt::format("summary of restart {} on node {}: {} local rank{} in {:.1f} s{}", spec_.restart,
                  spec_.node_rank, ranks_.size(), ranks_.size() == 1 ? "" : "s",
                  seconds_between(start_, last_exit_),
                  remote_ ? fmt::format("; the group failed elsewhere: {}", remote_->what) : ""));
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const RankRecord& r = ranks_[i].rec;
    const int status = r.wait_status.value_or(0);
    std::string note;
    if (blame_ && blame_->index == i)
      note = blame_->reason == BlameReason::failed ? "  <- first failure" : "  <- to blame";
    else if (group_stopping_ && WIFEXITED(status) && WEXITSTATUS(status) == elastic::kGroupStopExit)
      note = "  (left at the group's stop: saved, then exited)";  // Note [group stop]
    else if (ranks_[i].died_in_stop)
      note = "  (died at the group's stop: the others saved without it)";
    else if (r.signalled && failed(status))
      note = "  (stopped by ddprun)";
    say(fmt::format("  rank {:<3} pid {:<8} {:<28} {:6.1f} s{}", r.rank, r.pid,
                    describe_status(status), seconds_between(r.start, r.exit_time), note));
  }
  if (!blame_) {
    print_flight_summary();
    return;
  }
  const RankProcess& f = ranks_[blame_->index];
  if (blame_->reason != BlameReason::failed) say(fmt::format("to blame: {}", blame_->what));
  const auto& tail = f.err->tail();
  // The error line first: its last lines may be a usage text or a traceback's end.
  const std::string& error_line = f.err->last_error_line();
  if (!error_line.empty()) say(fmt::format("rank {}'s error: {}", f.rec.rank, error_line));
  if (tail.empty()) {
    say(fmt::format("rank {} wrote nothing to stderr", f.rec.rank));
  } else if (tail.size() == 1 && tail.front() == error_line) {
    // Its whole stderr is the error line just quoted: once is enough.
  } else {
    say(fmt::format("last {} line{} of rank {}'s stderr:", tail.size(), tail.size() == 1 ? "" : "s",
                    f.rec.rank));
    for (const auto& line : tail) say("  | " + line);
  }
  if (!f.err_log.empty()) say(fmt::format("rank {}'s log: {}", f.rec.rank, f.err_log));
  print_flight_summary();
}

void Watcher::print_flight_summary() const {
  for (const std::string& line : flight_.summary_lines()) say(line);
}

}  // namespace

GroupResult run_local_group(const GroupSpec& spec, SignalPipe& signals, Rendezvous& rendezvous) {
  Watcher watcher(spec, signals, rendezvous);
  return watcher.run();
}

}  // namespace ddp::launcher
