#include "collectives/elastic.h"

#include "collectives/communicator.h"
#include "runtime/logging.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

namespace ddp {
namespace elastic {

std::string members_key(int64_t epoch) {
  return fmt::format("elastic/{}/members", epoch);
}

std::string arrived_key(int64_t epoch, int launch_rank) {
  return fmt::format("elastic/{}/arrived/{}", epoch, launch_rank);
}

std::string join_key(int launch_rank) {
  return fmt::format("elastic/join/{}", launch_rank);
}

std::string format_stop(const GroupStop& stop) {
  return fmt::format("{} {} {}", stop.epoch, stop.exit_code, stop.why);
}

std::optional<GroupStop> parse_stop(const std::string& text) {
  GroupStop out;
  int consumed = 0;
  long long epoch = 0;
  if (std::sscanf(text.c_str(), "%lld %d %n", &epoch, &out.exit_code, &consumed) != 2 || epoch <= 0)
    return std::nullopt;
  out.epoch = epoch;
  out.why = text.substr(static_cast<size_t>(consumed));
  return out;
}

std::string format_members(const std::vector<int>& members) {
  return fmt::format("{}", fmt::join(members, ","));
}

std::vector<int> parse_members(const std::string& text) {
  std::vector<int> out;
  for (size_t at = 0; at <= text.size();) {  // "" and "3," have an empty entry
    const size_t comma = std::min(text.find(',', at), text.size());
    int v = -1;
    const auto [end, ec] = std::from_chars(text.data() + at, text.data() + comma, v);
    DDP_CHECK(ec == std::errc() && end == text.data() + comma && v >= 0,
              "elastic membership '{}': expected launch ranks such as 0,1,3", text);
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

std::pair<int, int> local_place(const std::vector<int>& members, int launch_rank,
                                int launch_local_world_size) {
  const auto node = [&](int r) { return r / std::max(1, launch_local_world_size); };
  int local_rank = 0, local_size = 0;
  for (const int m : members) {
    if (node(m) != node(launch_rank)) continue;
    if (m == launch_rank) local_rank = local_size;
    ++local_size;
  }
  return {local_rank, local_size};
}

std::function<bool()> abandon_check(std::shared_ptr<Store> store, int64_t epoch,
                                    std::vector<int> members, std::chrono::milliseconds interval,
                                    bool any_change) {
  auto last_look =
      std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  return [store = std::move(store), epoch, members = std::move(members), interval, any_change,
          last_look] {
    const auto now = std::chrono::steady_clock::now();
    if (now - *last_look < interval) return false;
    *last_look = now;
    const int64_t latest = latest_epoch(*store);
    if (any_change) return latest > epoch;
    for (int64_t e = epoch + 1; e <= latest; ++e) {
      const auto next = parse_members(store->get_string(members_key(e)));
      for (const int m : members) {
        if (std::find(next.begin(), next.end(), m) == next.end()) return true;
      }
    }
    return false;
  };
}

}  // namespace elastic

std::vector<std::string> PrefixStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  inner_->set(prefix_ + key, value);
}
Bytes PrefixStore::get(const std::string& key) {
  return inner_->get(prefix_ + key);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(prefix_ + key, delta);
}
void PrefixStore::wait(const std::vector<std::string>& keys,
                       std::optional<std::chrono::milliseconds> timeout) {
  inner_->wait(prefixed(keys), timeout);
}
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return inner_->compare_set(prefix_ + key, expected, desired);
}
bool PrefixStore::delete_key(const std::string& key) {
  return inner_->delete_key(prefix_ + key);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return inner_->check(prefixed(keys));
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPoll{5};

}  // namespace

namespace elastic {
int64_t latest_epoch(Store& store) {
  if (!store.check({elastic::kEpochKey})) return 0;
  const std::string text = store.get_string(elastic::kEpochKey);
  int64_t v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}
}  // namespace elastic

namespace {

[[noreturn]] void give_up(const ProcessGroup& pg, const std::string& why, const std::string& cause,
                          bool joining) {
  throw CommError(
      joining ? fmt::format("the replacement for launch rank {} cannot join the group: {}",
                            pg.launch_rank, why)
              : fmt::format("rank {} (launch rank {}) cannot regroup after its collective failed "
                            "({}): {}",
                            pg.env.rank, pg.launch_rank, cause, why),
      pg.env.rank, "regroup", -1, 0);
}

bool has(const std::vector<int>& list, int v) {
  return std::find(list.begin(), list.end(), v) != list.end();
}

}  // namespace

Regroup regroup(ProcessGroup& pg, int64_t value, std::chrono::milliseconds timeout,
                const std::string& cause, bool joining) {
  DDP_CHECK(
      pg.store != nullptr && (pg.backend == "shm" || pg.backend == "gloo" || pg.backend == "nccl"),
      "an elastic regroup needs the shm, gloo or nccl backend with ddprun's store; this "
      "group runs {}",
      pg.backend);
  DDP_CHECK(pg.comm == nullptr, "regroup: drop the broken communicator first");
  Store& store = *pg.store;
  const auto deadline = Clock::now() + timeout;
  const double seconds = std::chrono::duration<double>(timeout).count();
  Regroup out;
  out.old_world_size = pg.env.world_size;
  int64_t epoch = pg.membership;  // where this rank announced itself (none yet: its own)
  std::map<int64_t, std::vector<int>> lists;  // every membership's members, read once
  const auto members_of = [&](int64_t e) -> const std::vector<int>& {
    auto it = lists.find(e);
    if (it == lists.end())
      it =
          lists.emplace(e, elastic::parse_members(store.get_string(elastic::members_key(e)))).first;
    return it->second;
  };
  const auto arrived = [&](int64_t e, int m) { return store.check({elastic::arrived_key(e, m)}); };
  for (;;) {
    const int64_t latest = elastic::latest_epoch(store);
    // The membership to form: the oldest newer than the rank's own that has it
    // and can still complete -- every member arrived there, or is in every
    // membership since (one missing from a later one left, so it never
    // arrives). Every rank decides alike: a member's departure is final, and so
    // is its arrival.
    int64_t target = 0;
    bool listed = false;
    for (int64_t c = pg.membership + 1; c <= latest && target == 0; ++c) {
      if (!has(members_of(c), pg.launch_rank)) continue;
      listed = true;
      bool can_complete = true;
      for (const int m : members_of(c)) {
        if (arrived(c, m)) continue;
        for (int64_t later = c + 1; later <= latest && can_complete; ++later)
          can_complete = has(members_of(later), m);
      }
      if (can_complete) target = c;
    }
    if (latest > pg.membership && !listed && !joining) {
      give_up(pg,
              fmt::format("membership {} ({}) leaves this rank out", latest,
                          elastic::format_members(members_of(latest))),
              cause, joining);
    }
    if (target != 0 && target != epoch) {
      epoch = target;
      store.set(elastic::arrived_key(epoch, pg.launch_rank), std::to_string(value));
    }
    const bool announced = epoch > pg.membership;
    if (announced) {
      out.epoch = epoch;
      out.members = members_of(epoch);
      const auto here = [&](int m) { return arrived(epoch, m); };
      if (std::all_of(out.members.begin(), out.members.end(), here)) break;
    }
    if (joining && store.check({elastic::kDoneKey})) {  // the group finished without it
      out.finished = true;
      return out;
    }
    if (Clock::now() >= deadline) {
      give_up(pg,
              announced ? fmt::format("membership {} ({}): not every member arrived in {:g} s",
                                      epoch, elastic::format_members(out.members), seconds)
              : joining ? fmt::format("no membership took it in {:g} s", seconds)
                        : fmt::format("ddprun reported no rank gone in {:g} s, so the failure "
                                      "was not a rank leaving the group",
                                      seconds),
              cause, joining);
    }
    std::this_thread::sleep_for(kPoll);
  }
  const auto me = std::find(out.members.begin(), out.members.end(), pg.launch_rank);
  const int rank = static_cast<int>(me - out.members.begin());
  const int size = static_cast<int>(out.members.size());
  int64_t best = std::numeric_limits<int64_t>::min();
  for (size_t i = 0; i < out.members.size(); ++i) {
    const std::string text = store.get_string(elastic::arrived_key(epoch, out.members[i]));
    int64_t v = 0;
    std::from_chars(text.data(), text.data() + text.size(), v);
    out.values.push_back(v);
    if (v > best) {
      best = v;
      out.source = static_cast<int>(i);
    }
  }
  for (const int m : pg.members) {
    if (std::find(out.members.begin(), out.members.end(), m) == out.members.end())
      out.left.push_back(m);
  }
  for (const int m : out.members) {
    if (std::find(pg.members.begin(), pg.members.end(), m) == pg.members.end())
      out.joined.push_back(m);
  }
  // Read after every member arrived: a stop published again meanwhile (a member
  // died at it) lists this membership's epoch no more, so some members may take it
  // for an ordinary one. That heals: the dead member fails their collectives, and
  // all regroup into the newer stop.
  if (store.check({elastic::kStopKey})) {  // Note [group stop]
    const auto stop = elastic::parse_stop(store.get_string(elastic::kStopKey));
    if (stop && stop->epoch == epoch) out.stop = stop->why.empty() ? "--min-ranks" : stop->why;
  }
  pg.members = out.members;
  pg.env.rank = rank;
  pg.env.world_size = size;
  std::tie(pg.env.local_rank, pg.env.local_world_size) =
      elastic::local_place(out.members, pg.launch_rank, pg.launch_local_world_size);
  pg.membership = epoch;
  auto scoped = std::make_shared<PrefixStore>(pg.store, fmt::format("elastic/{}/", epoch));
  // A member that leaves while the communicator forms (it announced itself, then
  // died): give up at once and regroup under the next membership, rather than
  // wait for it up to the collective timeout. nccl watches so for the
  // communicator's life (Note [nccl regroup]).
  const bool nccl = pg.backend == "nccl";
  const auto abandon = elastic::abandon_check(pg.store, epoch, out.members,
                                              std::chrono::milliseconds(nccl ? 100 : 50), nccl);
  pg.comm = make_store_communicator(pg.backend, scoped, pg.env, rank, size,
                                    fmt::format("{}-m{}", pg.shm_run_id, epoch), pg.comm_options,
                                    "gloo/", abandon, /*nccl_instance=*/0);
  DDP_LOG_DEBUG("elastic regroup: membership {} ({}), rank {} of {}", epoch,
                elastic::format_members(out.members), rank, size);
  return out;
}

}  // namespace ddp
