#include "launcher/rendezvous.h"

#include "collectives/elastic.h"
#include "collectives/flight/diagnosis.h"

#include "collectives/store/socket.h"
#include "collectives/store/tcp_store.h"
#include "launcher/process.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>

namespace ddp::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{100};
constexpr milliseconds kCallTimeout{30000};

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::string random_hex(int bytes) {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < bytes; ++i) out += fmt::format("{:02x}", rd() & 0xff);
  return out;
}

}  // namespace

std::string Rendezvous::node_value() const {
  return fmt::format("{} {}", options_.local_ranks, host_name());
}

namespace {

double seconds(milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

void check_interrupt() {
  if (const int sig = SignalPipe::stop_signal()) throw Interrupted(sig);
}

bool contains(const char* text, const char* part) {
  return std::string_view(text).find(part) != std::string_view::npos;
}

}  // namespace

Interrupted::Interrupted(int sig)
    : Error(fmt::format("interrupted by {}", signal_name(sig))), signal_(sig) {}

Rendezvous::Rendezvous(RendezvousOptions options)
    : options_(std::move(options)), port_(options_.port), authority_(options_.node_rank == 0) {
  if (options_.node_rank == 0) run_id_ = random_hex(8);
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::endpoint() const {
  return store_detail::endpoint(options_.host, port_);  // [v6]:port
}

std::string Rendezvous::backup_endpoint() const {
  if (options_.backup_port == 0) return "";
  return store_detail::endpoint(options_.backup_host, options_.backup_port);
}

// An agent's client of the store (with its backup, Note [store failover]).
std::unique_ptr<TcpStore> Rendezvous::connect(milliseconds connect_timeout) const {
  return std::make_unique<TcpStore>(TcpStoreOptions{.host = options_.host,
                                                    .port = port_,
                                                    .secret = options_.secret,
                                                    .timeout = kCallTimeout,
                                                    .connect_timeout = connect_timeout,
                                                    .backup_host = options_.backup_host,
                                                    .backup_port = options_.backup_port});
}

void Rendezvous::begin_attempt(int restart) {
  if (options_.node_rank == 0) host(restart);
  if (multi_node()) {
    if (options_.node_rank != 0) join(restart);
    if (hosts_backup()) wait_for_backup();
    wait_for_nodes(restart);
  }
}

void Rendezvous::end_attempt() {
  store_.reset();
  server_.reset();  // stops it: Note [one store per attempt]
  backup_server_.reset();
  store_lost_ = false;
  beats_.clear();  // the next attempt's store counts from 0
}

// Node 0 (Note [two stores]).
void Rendezvous::host(int restart) {
  end_attempt();
  try {
    server_ = std::make_unique<TcpStoreServer>(TcpStoreServerOptions{
        .host = options_.bind, .port = options_.port, .secret = options_.secret});
  } catch (const StoreError& e) {
    throw LaunchError(fmt::format(
        "cannot host the agents' store: {}. The agents' store needs --rdzv-port (default "
        "--master-port + 1) free on an address of this machine; --rdzv-bind 0.0.0.0 binds every "
        "interface",
        e.what()));
  }
  port_ = server_->port();
  if (!multi_node()) return;
  try {
    store_ = connect(milliseconds(5000));
    store_->set("run_id", run_id_);
    store_->set("attempt", std::to_string(restart));
    store_->set("node/0/backup", backup_endpoint());
    store_->set("node/0", node_value());
  } catch (const StoreError& e) {
    throw LaunchError(fmt::format(
        "node 0 cannot reach its own store at {}: {}. --master-addr (or --rdzv-endpoint's "
        "HOST) must be an address of this machine that the other nodes can reach",
        endpoint(), e.what()));
  }
}

void Rendezvous::join(int restart) {
  if (hosts_backup()) {  // Note [node 0 lost]: it follows node 0's store from now on
    try {
      backup_server_ =
          std::make_unique<TcpStoreServer>(TcpStoreServerOptions{.host = options_.backup_host,
                                                                 .port = options_.backup_port,
                                                                 .secret = options_.secret,
                                                                 .follow_host = options_.host,
                                                                 .follow_port = port_});
    } catch (const StoreError& e) {
      throw LaunchError(fmt::format(
          "cannot host the store's backup (--rdzv-backup {}): {}. HOST must be an address of "
          "this machine (node 1) and PORT free on it",
          backup_endpoint(), e.what()));
    }
  }
  const auto deadline = Clock::now() + options_.timeout;
  std::string error;
  while (!try_join_once(restart, error)) {
    check_interrupt();
    if (Clock::now() >= deadline) {
      throw LaunchError(fmt::format(
          "node {} cannot reach the rendezvous store at {} (hosted by node 0's ddprun) within "
          "{} s. Check that `ddprun --node-rank 0` runs with the same --master-port and "
          "--rdzv-port, that --master-addr is node 0's address as seen from this node, and that "
          "no firewall blocks the port (--rdzv-timeout sets the wait). Last error: {}",
          options_.node_rank, endpoint(), seconds(options_.timeout), error));
    }
    std::this_thread::sleep_for(kPollInterval * 2);
  }
}

bool Rendezvous::try_join_once(int restart, std::string& error) {
  try {
    // With a backup, a longer wait: a client whose call finds node 0 gone waits
    // for the backup to take over (at most 0.1 s after the stream ends).
    auto store =
        connect(std::min(options_.timeout, milliseconds(options_.backup_port > 0 ? 5000 : 1000)));
    if (!store->check({"attempt"}) || store->get_string("attempt") != std::to_string(restart)) {
      error = "node 0 has not opened this attempt's store yet";
      return false;
    }
    run_id_ = store->get_string("run_id");
    // One ddprun per node rank: a second one given the same --node-rank would
    // start ranks of its own, numbered as the first's (its rank numbers taken twice).
    const std::string me = fmt::format("{} (pid {})", host_name(), ::getpid());
    const std::string key = fmt::format("node/{}/claimed/{}", options_.node_rank, restart);
    const Bytes claimed = store->compare_set(key, Bytes{}, Bytes(me.begin(), me.end()));
    if (const std::string holder(claimed.begin(), claimed.end()); holder != me) {
      throw LaunchError(fmt::format(
          "--node-rank {} is taken: the ddprun on {} joined this job with it first; give each "
          "node's ddprun its own --node-rank (0 to {})",
          options_.node_rank, holder, options_.nnodes - 1));
    }
    store->set(fmt::format("node/{}/backup", options_.node_rank), backup_endpoint());
    store->set(fmt::format("node/{}", options_.node_rank), node_value());
    // Note [nodes lost]; and node 0 keeps its store up until this closes (Note [exit barrier]).
    store->set_on_close(fmt::format("node/{}/closed", options_.node_rank), "1");
    store_ = std::move(store);
    return true;
  } catch (const StoreError& e) {
    if (contains(e.what(), "refused this client")) {
      std::string why = e.what();
      while (!why.empty() && why.back() == '.') why.pop_back();
      throw LaunchError(
          fmt::format("{}. Give every node the same secret: DDP_STORE_SECRET in the environment or "
                      "--store-secret-file FILE",
                      why));
    }
    error = e.what();
    return false;
  }
}

void Rendezvous::wait_for_nodes(int restart) {
  std::vector<std::string> keys;
  for (int r = 0; r < options_.nnodes; ++r) keys.push_back(fmt::format("node/{}", r));
  const auto deadline = Clock::now() + options_.timeout;
  try {
    while (!store_->check(keys)) {
      check_interrupt();
      if (Clock::now() >= deadline) {
        throw LaunchError(fmt::format(
            "attempt {}: {} did not join the rendezvous at {} within {} s. Start `ddprun "
            "--nnodes {} --node-rank R` with the same --master-addr, --master-port and "
            "--rdzv-port on each of them, with the same DDP_STORE_SECRET (--rdzv-timeout sets "
            "the wait)",
            restart, missing_nodes(), endpoint(), seconds(options_.timeout), options_.nnodes));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    check_same_local_ranks();
  } catch (const StoreError& e) {
    throw LaunchError(
        fmt::format("lost the rendezvous store at {} while waiting for the other "
                    "nodes: {}",
                    endpoint(), e.what()));
  }
}

// Node 1 with --rdzv-backup: the ranks start only once every write reaches the backup.
void Rendezvous::wait_for_backup() {
  const auto deadline = Clock::now() + options_.timeout;
  while (!backup_server_->in_sync()) {
    check_interrupt();
    if (Clock::now() >= deadline) {
      throw LaunchError(fmt::format(
          "the store's backup at {} (--rdzv-backup) could not follow node 0's store at {} "
          "within {} s; is the secret the same on both nodes?",
          backup_endpoint(), endpoint(), seconds(options_.timeout)));
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
}

std::string Rendezvous::missing_nodes() {
  std::vector<int> missing;
  for (int r = 0; r < options_.nnodes; ++r) {
    if (!store_->check({fmt::format("node/{}", r)})) missing.push_back(r);
  }
  return flight::id_list(std::move(missing), "node", "nodes");
}

void Rendezvous::check_same_local_ranks() {
  for (int r = 0; r < options_.nnodes; ++r) {
    const std::string backup = store_->get_string(fmt::format("node/{}/backup", r));
    if (backup != backup_endpoint()) {
      throw LaunchError(fmt::format(
          "node {} was given --rdzv-backup '{}' but node {} '{}': give every node the same "
          "--rdzv-backup (or none)",
          r, backup, options_.node_rank, backup_endpoint()));
    }
    const std::string value = store_->get_string(fmt::format("node/{}", r));
    int ranks = 0;
    char host[256] = {};
    std::sscanf(value.c_str(), "%d %255s", &ranks, host);
    if (ranks == options_.local_ranks) continue;
    throw LaunchError(
        fmt::format("node {} ({}) runs {} local ranks but node {} runs {}: ddprun needs the same "
                    "--nproc-per-node on every node",
                    r, host, ranks, options_.node_rank, options_.local_ranks));
  }
}

void Rendezvous::publish_membership(int64_t epoch, const std::vector<int>& members) {
  DDP_CHECK(port_ > 0, "publish_membership: no store (begin_attempt first)");
  if (store_ == nullptr) store_ = connect(milliseconds(5000));  // one node: made on first use
  store_->set(elastic::members_key(epoch), elastic::format_members(members));
  store_->set(elastic::kEpochKey, std::to_string(epoch));  // after the members it names
}

void Rendezvous::publish_stop(int64_t epoch, const std::vector<int>& members, int exit_code,
                              const std::string& why) {
  DDP_CHECK(port_ > 0, "publish_stop: no store (begin_attempt first)");
  if (store_ == nullptr) store_ = connect(milliseconds(5000));
  store_->set(elastic::kStopKey,
              elastic::format_stop({.epoch = epoch, .exit_code = exit_code, .why = why}));
  publish_membership(epoch, members);
}

bool Rendezvous::ranks_handle_stop() {
  if (port_ <= 0 || store_lost_) return false;
  try {
    if (store_ == nullptr) store_ = connect(milliseconds(5000));  // one node: made on first use
    return store_->check({elastic::kHandlesStopKey});
  } catch (const StoreError&) {
    return false;
  }
}

// Across nodes these go to node 0's store: a lost one is remote_failure()'s to report.
std::optional<elastic::GroupStop> Rendezvous::group_stop() {
  if (!multi_node() || store_ == nullptr || store_lost_) return std::nullopt;
  try {
    if (!store_->check({elastic::kStopKey})) return std::nullopt;
    return elastic::parse_stop(store_->get_string(elastic::kStopKey));
  } catch (const StoreError&) {
    store_lost_ = true;
    return std::nullopt;
  }
}

bool Rendezvous::joiner_ready(int rank, int pid) {
  if (store_ == nullptr || store_lost_) return false;
  const std::string key = elastic::join_key(rank);
  try {
    return store_->check({key}) && store_->get_string(key) == std::to_string(pid);
  } catch (const StoreError&) {
    store_lost_ = true;
    return false;
  }
}

bool Rendezvous::elastic_done() {
  if (store_ == nullptr || store_lost_) return false;
  try {
    return store_->check({elastic::kDoneKey});
  } catch (const StoreError&) {
    store_lost_ = true;
    return false;
  }
}

void Rendezvous::publish_failure(const GroupFailure& failure) {
  if (!multi_node() || !store_ || store_lost_) return;
  const std::string value =
      fmt::format("{} {} {}", failure.exit_code, options_.node_rank, failure.what);
  try {
    store_->compare_set("failed", {}, Bytes(value.begin(), value.end()));
  } catch (const StoreError&) {
    store_lost_ = true;  // node 0 is gone: nobody left to tell
  }
}

void Rendezvous::publish_interrupt(int sig) {
  // Under --on-failure continue the node leaves with its ranks (Note [nodes lost]).
  if (!multi_node() || options_.elastic || !store_ || store_lost_) return;
  try {
    store_->set("final", std::to_string(options_.node_rank));
  } catch (const StoreError&) {
    store_lost_ = true;
    return;
  }
  publish_failure({.node = options_.node_rank,
                   .exit_code = 128 + sig,
                   .what = fmt::format("node {}'s ddprun got {}: the job ends, without a restart",
                                       options_.node_rank, signal_name(sig))});
}

bool Rendezvous::interrupted_elsewhere() {
  if (final_ || !multi_node() || !store_ || store_lost_) return final_;
  try {
    final_ = store_->check({"final"});
  } catch (const StoreError&) {
    store_lost_ = true;
  }
  return final_;
}

int64_t Rendezvous::publish_hang() {
  if (!multi_node() || !store_ || store_lost_) return 0;
  try {
    return store_->add("hang", 1);
  } catch (const StoreError&) {
    store_lost_ = true;  // remote_failure() says so
    return 0;
  }
}

int64_t Rendezvous::hangs_published() {
  if (!multi_node() || !store_ || store_lost_) return 0;
  try {
    return store_->add("hang", 0);
  } catch (const StoreError&) {
    store_lost_ = true;
    return 0;
  }
}

std::optional<GroupFailure> Rendezvous::remote_failure() {
  if (!multi_node() || !store_) return std::nullopt;
  if (store_lost_)
    return GroupFailure{0, 1, fmt::format("lost the rendezvous store at {}", endpoint())};
  try {
    if (!store_->check({"failed"})) return gone_node();
    const std::string value = store_->get_string("failed");
    GroupFailure f;
    char what[512] = {};
    if (std::sscanf(value.c_str(), "%d %d %511[^\n]", &f.exit_code, &f.node, what) < 2) {
      return GroupFailure{0, 1, value};
    }
    f.what = what;
    if (f.node == options_.node_rank) return std::nullopt;  // our own
    // Set before the failure it ends with: read now, the store may be gone later.
    final_ = final_ || store_->check({"final"});
    return f;
  } catch (const StoreError& e) {
    store_lost_ = true;
    return GroupFailure{0, 1,
                        fmt::format("lost the rendezvous store at {} (node 0's ddprun exited or "
                                    "is unreachable): {}",
                                    endpoint(), e.what())};
  }
}

// Note [a node gone]: node 0, without --on-failure continue (there Note [nodes
// lost] applies): a node whose ddprun closed its connection to the store before its
// ranks finished, and said nothing (killed, its ranks dying with it; or it lost the
// store itself), or that sent no heartbeat for --node-timeout (stopped, its machine
// or the network down), would never write done/<r>, and node 0 would wait for it
// for ever (wait_for_other_nodes in agent.cpp). Its loss is the group's failure:
// published, so that every node ends the attempt (and restarts, when it may: the
// next rendezvous waits --rdzv-timeout for that node and names it).
std::optional<GroupFailure> Rendezvous::gone_node() {
  if (!authority_ || options_.elastic) return std::nullopt;
  const auto now = Clock::now();
  beats_.resize(static_cast<size_t>(options_.nnodes), Beat{.value = -1, .since = now});
  for (int r = 1; r < options_.nnodes; ++r) {
    const auto i = static_cast<size_t>(r);
    if (r == options_.node_rank || store_->check({fmt::format("done/{}", r)})) continue;
    std::string why;
    if (store_->check({fmt::format("node/{}/closed", r)})) {
      why =
          "left before its ranks finished: it exited or was killed (its ranks die with it), or "
          "lost its connection to the store";
    } else if (const int64_t beat = store_->add(fmt::format("node/{}/beat", r), 0);
               beat != beats_[i].value) {
      beats_[i] = {.value = beat, .since = now};
    } else if (now - beats_[i].since >= options_.node_timeout) {
      why = fmt::format(
          "sent no heartbeat for {:g} s (--node-timeout): it is stopped, or its machine or the "
          "network is down",
          seconds(options_.node_timeout));
    }
    if (why.empty()) continue;
    // Lost: the exit barrier does not wait for it (wait_for_others_to_leave).
    store_->set(fmt::format("node/{}/lost", r), why);
    // As node r would have published it ("<exit code> <node> <text>"), unless a
    // failure came first: remote_failure() returns the group's first.
    const std::string value = fmt::format("1 {} node {}'s ddprun {}", r, r, why);
    store_->compare_set("failed", {}, Bytes(value.begin(), value.end()));
    return remote_failure();
  }
  return std::nullopt;
}

void Rendezvous::publish_done() {
  if (!multi_node() || !store_ || store_lost_) return;
  try {
    store_->set(fmt::format("done/{}", options_.node_rank), "1");
  } catch (const StoreError&) {
    store_lost_ = true;
  }
}

bool Rendezvous::all_done() {
  return nodes_done(true);
}

bool Rendezvous::others_done() {
  return nodes_done(false);
}

bool Rendezvous::others_gone() {
  if (!multi_node() || !store_ || store_lost_) return true;
  try {
    for (int r = 0; r < options_.nnodes; ++r) {
      if (r == options_.node_rank) continue;
      const bool gone = store_->check({fmt::format("done/{}", r)}) ||
                        store_->check({fmt::format("node/{}/closed", r)}) ||
                        store_->check({fmt::format("node/{}/lost", r)});
      if (!gone) return false;
    }
    return true;
  } catch (const StoreError&) {
    store_lost_ = true;
    return true;
  }
}

bool Rendezvous::nodes_done(bool self) {
  if (!multi_node() || !store_ || store_lost_) return true;
  try {
    for (int r = 0; r < options_.nnodes; ++r) {
      if (r == options_.node_rank && !self) continue;
      if (store_->check({fmt::format("done/{}", r)})) continue;
      if (!options_.elastic || !store_->check({fmt::format("node/{}/lost", r)})) return false;
    }
    return true;
  } catch (const StoreError&) {
    store_lost_ = true;
    return true;
  }
}

// Each node numbers its own events and counts one only once it is set, so the
// count never names an event that is missing (a node that dies in between took
// its uncounted event with it).
void Rendezvous::post_event(const std::string& event) {
  if (!multi_node() || !store_ || store_lost_) return;
  try {
    ++events_posted_;
    store_->set(fmt::format("elastic/event/{}/{}", options_.node_rank, events_posted_), event);
    store_->set(fmt::format("elastic/events/{}", options_.node_rank),
                std::to_string(events_posted_));
  } catch (const StoreError&) {
    store_lost_ = true;  // node 0 is gone: remote_failure() says so
  }
}

// The authority's: every node's but its own. With a backup the count taken is
// kept in the store too, for a node 1 that takes over (Note [node 0 lost]).
std::vector<std::string> Rendezvous::take_events() {
  std::vector<std::string> out;
  if (!multi_node() || !store_ || store_lost_) return out;
  events_taken_.resize(static_cast<size_t>(options_.nnodes), 0);
  for (int r = 0; r < options_.nnodes; ++r) {
    // Node 0 posts none; a node 1 that took over applies its own node 0 had not.
    if (r == options_.node_rank && r == 0) continue;
    const std::string count = fmt::format("elastic/events/{}", r);
    if (!store_->check({count})) continue;
    const int64_t posted = std::stoll(store_->get_string(count));
    for (int64_t& taken = events_taken_[static_cast<size_t>(r)]; taken < posted; ++taken)
      out.push_back(store_->get_string(fmt::format("elastic/event/{}/{}", r, taken + 1)));
  }
  return out;
}

// After the events are applied, not when taken: a node 1 taking over applies
// again the ones node 0 may not have (applying one twice changes nothing:
// a rank that left is gone, one admitted is a member), never skips one.
void Rendezvous::record_events_applied() {
  if (options_.backup_port == 0 || !store_ || store_lost_) return;
  events_recorded_.resize(events_taken_.size(), 0);
  try {
    for (size_t r = 0; r < events_taken_.size(); ++r) {
      if (events_taken_[r] == events_recorded_[r]) continue;
      store_->set(fmt::format("elastic/taken/{}", r), std::to_string(events_taken_[r]));
      events_recorded_[r] = events_taken_[r];
    }
  } catch (const StoreError&) {
    store_lost_ = true;
  }
}

bool Rendezvous::authority_finished() {
  if (!store_ || store_lost_) return true;
  try {
    return store_->check({"done/0"}) || store_->check({"node/0/lost"}) || store_->check({"failed"});
  } catch (const StoreError&) {
    store_lost_ = true;
    return true;
  }
}

std::pair<int64_t, std::vector<int>> Rendezvous::membership() {
  const int64_t epoch = elastic::latest_epoch(*store_);
  if (epoch == 0) return {0, {}};
  return {epoch, elastic::parse_members(store_->get_string(elastic::members_key(epoch)))};
}

bool Rendezvous::take_over(std::string& why) {
  // Only once the backup serves: it took over because node 0's store could not
  // be reached after its stream ended (Note [store backup]).
  if (!hosts_backup() || authority_ || backup_server_ == nullptr || !store_ ||
      !backup_server_->promoted())
    return false;
  const auto now = Clock::now();
  if (now < next_takeover_check_) return false;
  next_takeover_check_ = now + kPollInterval;
  try {
    // This node's own client must have moved too (a call fails over); and a
    // node that node 0 took out of the group leaves, as without a backup.
    const bool out = store_->check({fmt::format("node/{}/lost", options_.node_rank)});
    if (out || !store_->on_backup()) return false;
  } catch (const StoreError&) {
    return false;  // remote_failure() reports a store lost both ways
  }
  why = "its ddprun's store went away (its ddprun exited or was killed)";
  store_lost_ = false;
  authority_ = true;
  lost_.assign(static_cast<size_t>(options_.nnodes), false);
  beats_.assign(static_cast<size_t>(options_.nnodes), Beat{.value = -1, .since = now});
  events_taken_.assign(static_cast<size_t>(options_.nnodes), 0);
  try {
    for (int r = 0; r < options_.nnodes; ++r) {
      const auto i = static_cast<size_t>(r);
      if (const std::string key = fmt::format("elastic/taken/{}", r); store_->check({key}))
        events_taken_[i] = std::stoll(store_->get_string(key));
      lost_[i] = r == 0 || store_->check({fmt::format("node/{}/lost", r)});
    }
    store_->set("node/0/lost", why);
  } catch (const StoreError& e) {
    store_lost_ = true;
    why += fmt::format("; and the backup store fails too: {}", e.what());
  }
  return true;
}

void Rendezvous::heartbeat() {
  if (!multi_node() || !store_ || store_lost_) return;  // Note [nodes lost], Note [a node gone]
  const auto now = Clock::now();
  if (now < next_beat_) return;
  // At least 8 beats per --node-timeout (at most one a second), so that a beat
  // late by a busy machine does not look like a node gone.
  next_beat_ = now + std::clamp(options_.node_timeout / 8, milliseconds(100), milliseconds(1000));
  try {
    store_->add(fmt::format("node/{}/beat", options_.node_rank), 1);
  } catch (const StoreError&) {
    store_lost_ = true;
  }
}

std::vector<LostNode> Rendezvous::find_lost_nodes() {
  std::vector<LostNode> out;
  if (!multi_node() || !options_.elastic || !store_ || !authority_ || store_lost_) return out;
  const auto now = Clock::now();
  lost_.resize(static_cast<size_t>(options_.nnodes), false);
  beats_.resize(static_cast<size_t>(options_.nnodes), Beat{.value = -1, .since = now});
  for (int r = 0; r < options_.nnodes; ++r) {
    const auto i = static_cast<size_t>(r);
    if (r == options_.node_rank) continue;
    if (lost_[i] || store_->check({fmt::format("done/{}", r)})) continue;
    std::string why;
    if (store_->check({fmt::format("node/{}/closed", r)})) {
      why =
          "its ddprun closed its connection to the store: it exited or was killed, or its "
          "machine went down";
    } else if (const int64_t beat = store_->add(fmt::format("node/{}/beat", r), 0);
               beat != beats_[i].value) {
      beats_[i] = {.value = beat, .since = now};
    } else if (now - beats_[i].since >= options_.node_timeout) {
      why = fmt::format(
          "its ddprun sent no heartbeat for {:g} s (--node-timeout): it is stopped, or its "
          "machine or the network is down",
          seconds(options_.node_timeout));
    }
    if (why.empty()) continue;
    lost_[i] = true;
    store_->set(fmt::format("node/{}/lost", r), why);
    out.push_back({r, why});
  }
  return out;
}

void Rendezvous::wait_for_others_to_leave(milliseconds timeout, const std::function<bool()>& stop) {
  if (!multi_node() || !store_ || !authority_ || store_lost_) return;
  const auto deadline = Clock::now() + timeout;
  // Gone, not done: a node that finished waits in wait_for_other_nodes and must
  // read the failure before the store goes.
  const auto gone = [this](int r) {
    return store_->check({fmt::format("node/{}/closed", r)}) ||
           store_->check({fmt::format("node/{}/lost", r)});
  };
  try {
    for (int r = 0; r < options_.nnodes && Clock::now() < deadline; ++r) {
      if (r == options_.node_rank) continue;
      while (!gone(r) && Clock::now() < deadline && !(stop ? stop() : SignalPipe::stop_signal()))
        std::this_thread::sleep_for(kPollInterval);
    }
  } catch (const StoreError&) {
    store_lost_ = true;  // nothing more to wait for
  }
}

std::optional<std::string> Rendezvous::taken_out() {
  if (!multi_node() || !options_.elastic || !store_ || store_lost_) return std::nullopt;
  try {
    const std::string key = fmt::format("node/{}/lost", options_.node_rank);
    if (!store_->check({key})) return std::nullopt;
    // Found lost once the group finished (elastic/done), this node's ranks are
    // still members and finish too (one may be writing the final checkpoint);
    // taken out before, they are not.
    if (store_->check({elastic::kDoneKey})) {
      const int first = options_.node_rank * options_.local_ranks;
      const auto [epoch, members] = membership();
      if (epoch == 0) return std::nullopt;  // every launch rank
      for (const int rank : members) {
        if (rank >= first && rank < first + options_.local_ranks) return std::nullopt;
      }
    }
    return store_->get_string(key);
  } catch (const StoreError&) {
    store_lost_ = true;
    return std::nullopt;
  }
}

}  // namespace ddp::launcher
