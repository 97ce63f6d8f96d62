#include "collectives/elastic.h"

#include "collectives/communicator.h"
#include "runtime/logging.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <thread>

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

[[noreturn]] void give_up(const ProcessGroup& pg, const std::string& why,
                          const std::string& cause) {
  throw CommError(fmt::format("rank {} (launch rank {}) cannot regroup after its collective failed "
                              "({}): {}. Under --on-failure continue the ranks left regroup when "
                              "ddprun reports a rank gone; the failure above was not that",
                              pg.env.rank, pg.launch_rank, cause, why),
                  pg.env.rank, "regroup", -1, 0);
}

}  // namespace

Regroup regroup(ProcessGroup& pg, int64_t value, std::chrono::milliseconds timeout,
                const std::string& cause, bool joining) {
  DDP_CHECK(pg.store != nullptr && (pg.backend == "shm" || pg.backend == "gloo"),
            "an elastic regroup needs the shm or gloo backend with ddprun's store; this group "
            "runs {}",
            pg.backend);
  DDP_CHECK(pg.comm == nullptr, "regroup: drop the broken communicator first");
  Store& store = *pg.store;
  const auto deadline = Clock::now() + timeout;
  Regroup out;
  out.old_world_size = pg.env.world_size;
  int64_t epoch = pg.membership;
  for (;;) {
    const int64_t latest = elastic::latest_epoch(store);
    if (latest > epoch) {  // a (newer) membership: announce this rank there
      epoch = latest;
      out.epoch = epoch;
      out.members = elastic::parse_members(store.get_string(elastic::members_key(epoch)));
      const bool member =
          std::find(out.members.begin(), out.members.end(), pg.launch_rank) != out.members.end();
      if (!member && joining) {  // a membership from before it asked: wait for the next
        out.members.clear();
        continue;
      }
      if (!member) {
        give_up(pg,
                fmt::format("membership {} ({}) leaves this rank out", epoch,
                            elastic::format_members(out.members)),
                cause);
      }
      store.set(elastic::arrived_key(epoch, pg.launch_rank), std::to_string(value));
      continue;
    }
    if (epoch > pg.membership && !out.members.empty()) {
      std::vector<std::string> keys;
      for (const int m : out.members) keys.push_back(elastic::arrived_key(epoch, m));
      if (store.check(keys)) break;
    }
    if (Clock::now() >= deadline) {
      give_up(pg,
              epoch > pg.membership && !out.members.empty()
                  ? fmt::format("membership {} ({}): not every member arrived in {:g} s", epoch,
                                elastic::format_members(out.members),
                                std::chrono::duration<double>(timeout).count())
              : joining ? fmt::format("no membership took this replacement in {:g} s",
                                      std::chrono::duration<double>(timeout).count())
                        : fmt::format("ddprun reported no rank gone in {:g} s",
                                      std::chrono::duration<double>(timeout).count()),
              cause);
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
  pg.members = out.members;
  pg.env.rank = pg.env.local_rank = rank;
  pg.env.world_size = pg.env.local_world_size = size;
  pg.membership = epoch;
  auto scoped = std::make_shared<PrefixStore>(pg.store, fmt::format("elastic/{}/", epoch));
  pg.comm = make_store_communicator(pg.backend, scoped, pg.env, rank, size,
                                    fmt::format("{}-m{}", pg.shm_run_id, epoch), pg.comm_options,
                                    "gloo/");
  DDP_LOG_DEBUG("elastic regroup: membership {} ({}), rank {} of {}", epoch,
                elastic::format_members(out.members), rank, size);
  return out;
}

}  // namespace ddp
