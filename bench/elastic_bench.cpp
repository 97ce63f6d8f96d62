// bench elastic: what `ddprun --on-failure continue` adds to a training step that
// sees no failure (issue 32 asks at most 1% of the step time), part by part, each
// next to what --on-failure restart does instead (docs/elastic.md):
//   - check_membership() when no poll is due: a clock read and a compare
//     (restart: nothing);
//   - a due poll, once per kMembershipPoll per rank: elastic::latest_epoch() over
//     TCP to a TcpStoreServer in this process, with a membership published (its
//     two round trips; ddprun's store is another process of the same node, behind
//     the same loopback);
//   - each --loss-log row flushed to the file (continue, so a dying writer loses
//     no row) against buffered rows (restart), samples interleaved.
// From those, the cost per step for a step of --step-ms: the clock read and the
// flush's extra on every step, the poll on one step in max(1, 100 ms / step).
// The end-to-end comparison, whose noise on 2 cores is larger than 1%, is
// bench/elastic.sh's second part.
#include "bench/subcommands.h"
#include "collectives/elastic.h"
#include "collectives/store/tcp_store.h"
#include "runtime/ops/ops.h"
#include "trainer/elastic.h"
#include "trainer/run_log.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace ddp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// check_membership()'s path when no poll is due (trainer/elastic.cpp).
int64_t clock_checks(int n, Clock::time_point next_poll) {
  int64_t due = 0;
  for (int i = 0; i < n; ++i) due += Clock::now() < next_poll ? 0 : 1;
  return due;
}

}  // namespace

int run_elastic_bench(const BenchOptions& options, const Reporter& reporter) {
  const std::string text = options.flag("--step-ms", "3.5");
  double step_ms = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), step_ms);
  DDP_CHECK(ec == std::errc() && end == text.data() + text.size() && step_ms > 0 &&
                std::isfinite(step_ms),
            "--step-ms expects a positive number of milliseconds (such as 3.5), got '{}'", text);
  // 1. The clock read of a step whose poll is not due.
  constexpr int kChecks = 10000;
  const auto next_poll = Clock::now() + std::chrono::hours(1);
  int64_t sink = 0;
  const Timing check = time_op(Device::cpu(), options.timing(3, 15, 20.0),
                               [&] { sink += clock_checks(kChecks, next_poll); });
  do_not_optimize(&sink);
  const double check_us = check.median_ms * 1e3 / kChecks;
  // 2. A due poll: the store's membership key read over TCP.
  TcpStoreServer server({});
  TcpStoreOptions client;
  client.host = "127.0.0.1";
  client.port = server.port();
  TcpStore store(client);
  store.set(elastic::kEpochKey, std::string("1"));
  int64_t latest = 0;
  reporter.progress("bench elastic: timing the membership poll");
  const Timing poll = time_op(Device::cpu(), options.timing(20, 15, 20.0),
                              [&] { latest += elastic::latest_epoch(store); });
  do_not_optimize(&latest);
  const double poll_us = poll.median_ms * 1e3;
  // 3. --loss-log rows, flushed each (continue) or buffered (restart).
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("ddp-bench-elastic-{}", ::getpid());
  std::filesystem::create_directories(dir);
  double flushed_us = 0, buffered_us = 0;
  {
    train::LossLog flushed((dir / "flushed.txt").string(), std::nullopt);
    train::LossLog buffered((dir / "buffered.txt").string(), std::nullopt);
    flushed.set_flush_each_row(true);
    const Tensor loss = full({}, 0.6931);
    int64_t step = 0;
    reporter.progress("bench elastic: timing --loss-log rows");
    const auto rows = time_interleaved(
        Device::cpu(), options.timing(20, 15, 20.0),
        {[&] { flushed.step(1, ++step, loss, 1); }, [&] { buffered.step(1, ++step, loss, 1); }});
    flushed_us = rows[0].median_ms * 1e3;
    buffered_us = rows[1].median_ms * 1e3;
  }
  std::filesystem::remove_all(dir);
  const double poll_ms = static_cast<double>(train::kMembershipPoll.count());
  const double polls_per_step = std::min(1.0, step_ms / poll_ms);
  const double flush_extra_us = std::max(0.0, flushed_us - buffered_us);
  const double per_step_us = check_us + flush_extra_us + poll_us * polls_per_step;
  reporter.section(
      "what --on-failure continue adds (no failure)",
      {Row().add("part", "membership check, not due").add("us", check_us, 4).add("per_step", 1.0),
       Row()
           .add("part", "membership poll (store read)")
           .add("us", poll_us, 2)
           .add("per_step", polls_per_step, 4),
       Row()
           .add("part", "loss-log row flushed")
           .add("us", flushed_us, 2)
           .add("per_step", 1.0)
           .add("restart_us", buffered_us, 2),
       Row()
           .add("part", fmt::format("total for a {} ms step", step_ms))
           .add("us", per_step_us, 2)
           .add("per_step", 1.0)
           .add("overhead_pct", 100.0 * per_step_us / (step_ms * 1e3), 3)});
  return 0;
}

}  // namespace ddp::bench
