// The ranks' side of a group that survives a dead rank (`ddprun --on-failure
// continue`, docs/elastic.md): the membership the launcher keeps in its store,
// and the regroup that forms a new communicator among the ranks left.
//
// Note [elastic membership]
// ddprun starts the ranks with DDPRUN_ON_FAILURE=continue and keeps a
// membership: the launch ranks (RANK as ddprun started them) alive, numbered by
// an epoch that is 0 with every rank. When a rank leaves (it died, or ddprun
// killed it for being stopped or hung) ddprun writes the next epoch to its store:
//   elastic/<E>/members         "0,1,3": launch ranks, ascending
//   elastic/epoch               "E": the latest epoch, written after its members
// A rank whose collective fails (a dead peer breaks its communicator: shm's
// dead-rank check, gloo's connection reset) drops its communicator -- closing its
// connections, so that peers blocked on it fail as well -- and calls regroup(),
// which waits for an epoch newer than the rank's own, announces the rank there,
//   elastic/<E>/arrived/<launch rank>   "<value>": the caller's progress (its step)
// and waits for every member's announcement. A newer epoch meanwhile starts it
// over there only when the one it announced at cannot complete (a member that
// has not arrived is not in the newer one: it left); otherwise it completes
// that one first, so no two ranks form communicators of different epochs. The new rank is the
// rank's index among the members, the new communicator the same backend's over a fresh namespace of
// the store ("elastic/<E>/" before gloo's keys) or a fresh shm segment (run id
// "<id>-m<E>"). Every member reads every announcement, so all agree without a
// collective on the one that holds the most advanced state (the highest value,
// the lowest rank among equals), which the trainer copies to the others.
// A membership that does not come within the timeout (the failure was not a
// rank's death: a mismatch, a network error), or one without this rank, is a
// CommError naming the epoch, its members and the original error.
// A membership grows too: ddprun (--max-restarts K under continue) starts a
// replacement for a rank that left, with DDPRUN_JOIN=1; it builds its model,
// sets elastic/join/<launch rank> = its pid, and waits in regroup(joining) for
// the membership ddprun then writes with it appended (the list is the members
// ascending, then the replacements in joining order: a rank's new number is its
// place in the list, so no member's number goes down and the writer stays rank
// 0). The members notice the newer membership at a step boundary (the trainer
// polls elastic/epoch every 100 ms there), drop their communicator -- a peer
// already waiting in the next step's first collective fails at once (shm:
// RankControl::left; gloo: the connection closes) -- and regroup as after a
// death; the replacement announces no progress, so it is never the source.
//
// Note [group stop]
// A failure that would leave fewer ranks than `ddprun --min-ranks` ends the job,
// but not the ranks left: they hold the only up-to-date state, and killing them
// would lose the steps since the last checkpoint. ddprun writes
//   elastic/stop                "<E> <exit code> <why>"
// before it publishes membership E of the ranks left. They regroup into it as into
// any membership (the state copied from the most advanced one, so no step is
// lost), see that it is the last (Regroup::stop), and at the next step boundary
// write --save (every rank takes part: ZeRO's gather, sharded files) and exit
// kGroupStopExit. ddprun waits for them (SIGTERM, as any end, after kGroupStopWait), and
// exits with the failed rank's status, naming --min-ranks; another node's ddprun
// sees the key and waits for its ranks as well. The checkpoint resumes as any
// mid-epoch one written after a regroup (its epoch_cursor), at any world size.
// ddprun does so only when the ranks set elastic/handles_stop (train does, at its
// start under continue); with another program the job ends at once, as before.
// The save ends with a one-element all_reduce ("stop committed"), so no rank exits
// before the writer has written. A member that dies of a signal before that (in
// the regroup, the save) leaves the stop too: node 0's ddprun publishes it once
// more without that rank (another node's ddprun posts the death as an event, and
// node 0 applies them until the other agents are gone), the others' collective
// fails, and they regroup into it and save again. A rank that exits with an error
// ends the stop (every writer after it would most likely fail alike).
#pragma once

#include "collectives/bootstrap.h"
#include "collectives/store/store.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

// Keys of Note [elastic membership].
namespace elastic {
inline constexpr const char* kEpochKey = "elastic/epoch";
// Set by a member that finished the run: a replacement still waiting exits 0,
// and ddprun admits no one any more.
inline constexpr const char* kDoneKey = "elastic/done";
// Note [group stop]: the last membership, and why the group stops there.
inline constexpr const char* kStopKey = "elastic/stop";
// Set by a rank that stops as Note [group stop] asks (train); without it ddprun
// ends the job as before (SIGTERM, then SIGKILL): a program that cannot regroup
// would only wait out kGroupStopWait.
inline constexpr const char* kHandlesStopKey = "elastic/handles_stop";
// What a rank exits with once the group stopped and its checkpoint is written
// (EX_TEMPFAIL: the job can go on later, from that checkpoint).
inline constexpr int kGroupStopExit = 75;
// How long ddprun waits for the ranks left to regroup, save and exit.
inline constexpr std::chrono::seconds kGroupStopWait{120};
struct GroupStop {
  int64_t epoch = 0;  // the last membership
  int exit_code = 1;  // the job's, the failed rank's
  std::string why;
};
std::string format_stop(const GroupStop& stop);
// nullopt for a malformed value.
std::optional<GroupStop> parse_stop(const std::string& text);
std::string members_key(int64_t epoch);
std::string arrived_key(int64_t epoch, int launch_rank);
// A replacement's request to join: its pid, so a stale key of a dead one is no request.
std::string join_key(int launch_rank);
// The latest membership epoch ddprun wrote to `store` (0: none yet).
int64_t latest_epoch(Store& store);
// "0,1,3" <-> {0, 1, 3}; ValueError names a malformed list.
std::string format_members(const std::vector<int>& members);
std::vector<int> parse_members(const std::string& text);
// LOCAL_RANK and LOCAL_WORLD_SIZE of `launch_rank` in a membership: its place
// among the members on its node (ddprun starts launch_local_world_size ranks per
// node, so launch rank r runs on node r / launch_local_world_size; a replacement
// runs where the rank it replaces ran).
std::pair<int, int> local_place(const std::vector<int>& members, int launch_rank,
                                int launch_local_world_size);
// True once a membership newer than `epoch` lacks one of `members` (a member of
// that group left) -- or, with `any_change`, once there is any newer membership
// (nccl: every member leaves the communicator then, and a peer's departure does
// not fail the others' collectives) -- looking at the store at most every
// `interval` (false in between). For one thread at a time.
std::function<bool()> abandon_check(std::shared_ptr<Store> store, int64_t epoch,
                                    std::vector<int> members, std::chrono::milliseconds interval,
                                    bool any_change = false);
}  // namespace elastic

// A store whose keys are those of `inner` behind a prefix (torch's PrefixStore).
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys,
            std::optional<std::chrono::milliseconds> timeout = std::nullopt) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  using Store::get_string;
  using Store::set;

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;
  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

struct Regroup {
  int64_t epoch = 0;
  std::vector<int> members;     // launch ranks, ascending; the new rank is the index
  std::vector<int64_t> values;  // each member's announced value
  int source = 0;               // the new rank with the highest value (lowest among equals)
  int old_world_size = 0;
  std::vector<int> left, joined;  // launch ranks, against the rank's previous membership
  bool finished = false;          // joining: the group finished before taking it in
  std::string stop;  // Note [group stop]: why this membership is the group's last ("": it is not)
};

// Note [elastic membership]: the caller has dropped pg.comm (every Work on it
// finished or failed). Waits up to `timeout` for the next membership, then sets
// pg.comm to a communicator among its members and pg.env's rank and world size to
// this rank's place there. `value`: this rank's progress (the trainer's step).
// `cause`: the error that broke the old communicator, for the messages.
// joining: a replacement (LaunchEnv::joining) that waits past memberships without
// it for the first one with it (ddprun adds it once it asked to join); it sets
// pg.membership to the latest epoch before it asks, so that only a newer one is
// taken (an older one listing its launch rank was a predecessor's).
Regroup regroup(ProcessGroup& pg, int64_t value, std::chrono::milliseconds timeout,
                const std::string& cause, bool joining = false);

}  // namespace ddp
