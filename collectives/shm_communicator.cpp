// The shm backend: every rank on one node, CPU tensors, one POSIX shared-memory
// segment per group (collectives/shm_segment.h). Collectives run on the
// communication thread of ThreadedCommunicator, in steps (Note [shm steps]).
#include "collectives/backends.h"
#include "collectives/communicator_base.h"
#include "collectives/reduce_kernels.h"
#include "collectives/shm_segment.h"
#include "runtime/env.h"

#include <fmt/ranges.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

// Note [shm steps]: a collective is a sequence of steps, one per chunk of at most
// one slot (large tensors go in chunks). In step s every rank
//   1. writes its chunk into its own slot of buffer s % 2,
//   2. arrives: publishes the collective's fingerprint and sets its counter to
//      2s + 1, then waits until every peer's counter is >= 2s + 1 and checks that
//      all fingerprints agree ("collective mismatch" otherwise),
//   3. reads the peers' slots (reduces, copies out), departs: counter = 2s + 2,
//      and, where a second phase needs the peers' results, waits for 2s + 2.
// Counters only grow and are never reset, so a slow or stale rank is seen as
// "has not reached 2s + 1" and named. Two buffers make the steps overlap safely:
// a rank writes buffer s % 2 again only in step s + 2, after every peer arrived
// in step s + 1, that is after every peer finished reading step s.
//
// all_reduce reduce-scatters within the chunk: rank r copies in all but its own
// slice, reduces slice r (its own part read from its tensor, the others from the
// peers' slots; reduce_buffers accumulates 16-bit floats in f32) into its tensor
// and its slot, departs, waits for 2s + 2 and gathers the other slices. Chunks of
// at most kSmallBytes skip the second phase: every rank reduces the whole chunk
// itself (one barrier instead of two). Every rank reduces in rank order, so the
// results are the same on every rank.
//
// Note [shm waiting]: ranks may outnumber cores (4 ranks on 2 cores), so a waiter
// spins only briefly (not at all when oversubscribed), then sched_yield()s, then
// sleeps on the peer's futex word; a rank that moves its counter wakes sleepers.
// Every 10 ms of sleeping it checks the deadline and whether the late peers are
// still alive (their pids are in the segment): exited -> CommError naming them,
// past the timeout -> CommTimeoutError naming the ranks that did not arrive.

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSmallBytes = size_t{8} << 10;
constexpr size_t kBlockBytes = size_t{16} << 10;  // fits L1 (a multiple of every element size)
constexpr auto kSpinFor = std::chrono::microseconds(50);
constexpr auto kYieldFor = std::chrono::microseconds(1000);
constexpr auto kSleepFor = std::chrono::microseconds(10000);
constexpr auto kCheckEvery = std::chrono::milliseconds(10);
constexpr auto kMargin = std::chrono::milliseconds(200);

#if defined(__x86_64__) || defined(__i386__)
inline void cpu_relax() {
  __builtin_ia32_pause();
}
#elif defined(__aarch64__)
inline void cpu_relax() {
  asm volatile("yield");
}
#else
inline void cpu_relax() {}
#endif

// memcpy that accepts the null pointers of empty tensors.
void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

// kind | op | dtype | root: what must agree across ranks, with the count.
uint64_t pack(const Collective& c) {
  return static_cast<uint64_t>(c.kind) | static_cast<uint64_t>(c.op) << 8 |
         static_cast<uint64_t>(c.dtype()) << 16 |
         static_cast<uint64_t>(static_cast<uint32_t>(c.root)) << 32;
}

std::string describe_packed(uint64_t packed, uint64_t count, int64_t sequence) {
  Collective c;
  c.kind = static_cast<CollectiveKind>(packed & 0xff);
  c.op = static_cast<ReduceOp>((packed >> 8) & 0xff);
  c.root = static_cast<int>(static_cast<uint32_t>(packed >> 32));
  c.sequence = sequence;
  if (c.kind == CollectiveKind::barrier) return c.describe();
  return fmt::format("{} of {} {}", c.describe(), count,
                     dtype_name(static_cast<DType>((packed >> 16) & 0xff)));
}

// Waits for one peer's counter: spin, then yield, then futex sleeps (Note [shm waiting]).
class Backoff {
 public:
  explicit Backoff(bool oversubscribed)
      : start_(Clock::now()), last_check_(start_), spinning_(!oversubscribed) {}

  // Waits a little for `peer` to reach `target`; true when the caller should check
  // the deadline and the peers' liveness.
  bool pause(shm::RankControl& peer, uint64_t target) {
    if (spinning_) {
      cpu_relax();
      if ((++spins_ & 15) != 0 || Clock::now() - start_ < kSpinFor) return false;
      spinning_ = false;
    }
    if (Clock::now() - start_ < kYieldFor) {
      sched_yield();
      return false;
    }
    const uint32_t word = peer.wake.load();
    peer.sleepers.fetch_add(1);
    if (peer.counter.load() < target) shm::futex_wait(peer.wake, word, kSleepFor);
    peer.sleepers.fetch_sub(1);
    const auto now = Clock::now();
    if (now - last_check_ < kCheckEvery) return false;
    last_check_ = now;
    return true;
  }

 private:
  Clock::time_point start_;
  Clock::time_point last_check_;
  bool spinning_;
  uint32_t spins_ = 0;
};

class ShmCommunicator final : public ThreadedCommunicator {
 public:
  ShmCommunicator(const ShmOptions& options, std::unique_ptr<shm::Segment> segment)
      : ThreadedCommunicator(options.rank, options.size, options.comm),
        segment_(std::move(segment)),
        oversubscribed_(options.size > available_cores()),
        sources_(static_cast<size_t>(options.size)) {
    start_thread();
  }
  ~ShmCommunicator() override {
    stop_thread();  // then segment_ unmaps
    // Peers still waiting for this rank (it leaves a group that goes on
    // without it, or ahead of it) fail now rather than at their timeout.
    shm::RankControl& mine = segment_->control(rank());
    mine.left.store(1, std::memory_order_release);
    mine.wake.fetch_add(1, std::memory_order_release);
    shm::futex_wake_all(mine.wake);
  }
  std::string backend() const override { return "shm"; }

 protected:
  void run(const Collective& c) override;

 private:
  void run_reduce(const Collective& c, bool to_all);
  void reduce_whole(const Collective& c, std::byte* data, int64_t len, bool to_all);
  void reduce_sliced(const Collective& c, std::byte* data, int64_t len, bool to_all);
  void stage(const std::byte* data, int64_t len, size_t esize);
  static bool whole(int64_t len, size_t esize) {
    return static_cast<size_t>(len) * esize <= kSmallBytes;
  }
  void run_broadcast(const Collective& c);
  void run_all_gather(const Collective& c);
  void run_reduce_scatter(const Collective& c);

  template <typename F>
  void for_each_chunk(int64_t count, int64_t chunk, F&& step);
  int64_t chunk_elements(const Collective& c) const {
    return static_cast<int64_t>(segment_->slot_bytes() / element_size(c.dtype()));
  }
  int64_t slice_begin(int q, int64_t len, size_t esize) const;
  double scale(const Collective& c) const { return c.op == ReduceOp::avg ? 1.0 / size() : 1.0; }
  std::byte* slot(int r) const { return segment_->slot(r, static_cast<int>(step_ & 1)); }
  const void* const* sources(size_t byte_offset);

  void arrive(const Collective& c);
  void depart(const Collective& c, bool wait);
  void signal(uint64_t value);
  void wait_all(const Collective& c, uint64_t target);
  void check_peers(const Collective& c, uint64_t target);
  void check_same_collective(const Collective& c);

  std::unique_ptr<shm::Segment> segment_;
  bool oversubscribed_;
  std::vector<const void*> sources_;
  uint64_t step_ = 0;  // Note [shm steps]
  Clock::time_point deadline_;
};

void ShmCommunicator::run(const Collective& c) {
  // Give up a little before Work::wait() would, so the caller sees this backend's
  // error, which names the late ranks, rather than a bare wait timeout.
  const auto timeout = options().timeout;
  deadline_ = Clock::now() + timeout - std::min<std::chrono::milliseconds>(timeout / 10, kMargin);
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      return run_reduce(c, true);
    case CollectiveKind::reduce:
      return run_reduce(c, false);
    case CollectiveKind::broadcast:
      return run_broadcast(c);
    case CollectiveKind::all_gather:
      return run_all_gather(c);
    case CollectiveKind::reduce_scatter:
      return run_reduce_scatter(c);
    case CollectiveKind::barrier:
      return for_each_chunk(0, 1, [&](int64_t, int64_t) {
        arrive(c);
        depart(c, false);
      });
  }
}

// Calls step(offset, length) for each chunk; at least once, so a count of 0 still
// synchronises (and compares fingerprints).
template <typename F>
void ShmCommunicator::for_each_chunk(int64_t count, int64_t chunk, F&& step) {
  int64_t offset = 0;
  do {
    const int64_t len = std::min(chunk, count - offset);
    step(offset, len);
    ++step_;
    offset += len;
  } while (offset < count);
}

// Slices of a chunk, one per rank, starting on cache-line boundaries.
int64_t ShmCommunicator::slice_begin(int q, int64_t len, size_t esize) const {
  if (q >= size()) return len;
  const int64_t align = std::max<int64_t>(1, static_cast<int64_t>(shm::kCacheLine / esize));
  return len * q / size() / align * align;
}

const void* const* ShmCommunicator::sources(size_t byte_offset) {
  for (int r = 0; r < size(); ++r) sources_[static_cast<size_t>(r)] = slot(r) + byte_offset;
  return sources_.data();
}

void ShmCommunicator::run_reduce(const Collective& c, bool to_all) {
  const size_t esize = element_size(c.dtype());
  auto* data = static_cast<std::byte*>(c.input.data_ptr());
  for_each_chunk(c.count(), chunk_elements(c), [&](int64_t offset, int64_t len) {
    std::byte* mine = data + static_cast<size_t>(offset) * esize;
    stage(mine, len, esize);
    arrive(c);
    if (whole(len, esize)) {
      reduce_whole(c, mine, len, to_all);
    } else {
      reduce_sliced(c, mine, len, to_all);
    }
  });
}

// Copies a chunk into this rank's slot: all of it for a whole-chunk reduction,
// else all but this rank's slice (reduce_sliced reads that from the tensor).
void ShmCommunicator::stage(const std::byte* data, int64_t len, size_t esize) {
  std::byte* dst = slot(rank());
  const size_t bytes = static_cast<size_t>(len) * esize;
  if (whole(len, esize)) return copy_bytes(dst, data, bytes);
  const size_t begin = static_cast<size_t>(slice_begin(rank(), len, esize)) * esize;
  const size_t end = static_cast<size_t>(slice_begin(rank() + 1, len, esize)) * esize;
  copy_bytes(dst, data, begin);
  copy_bytes(dst + end, data + end, bytes - end);
}

// A small chunk: every rank reduces the whole chunk from every slot itself.
void ShmCommunicator::reduce_whole(const Collective& c, std::byte* data, int64_t len, bool to_all) {
  if (to_all || rank() == c.root) {
    comm::reduce_buffers(data, sources(0), size(), len, c.dtype(), c.op, scale(c));
  }
  depart(c, false);
}

// Rank r reduces slice r into its tensor, block by block, and copies each block
// to its slot while the block is still in L1 (the peers gather it from there);
// then (all_reduce, or on the root of reduce) it gathers the other slices.
void ShmCommunicator::reduce_sliced(const Collective& c, std::byte* data, int64_t len,
                                    bool to_all) {
  const size_t esize = element_size(c.dtype());
  const size_t begin = static_cast<size_t>(slice_begin(rank(), len, esize)) * esize;
  const size_t end = static_cast<size_t>(slice_begin(rank() + 1, len, esize)) * esize;
  for (size_t at = begin; at < end; at += kBlockBytes) {
    const size_t bytes = std::min(kBlockBytes, end - at);
    sources(at);
    sources_[static_cast<size_t>(rank())] = data + at;
    comm::reduce_buffers(data + at, sources_.data(), size(), static_cast<int64_t>(bytes / esize),
                         c.dtype(), c.op, scale(c));
    copy_bytes(slot(rank()) + at, data + at, bytes);
  }
  const bool receives = to_all || rank() == c.root;
  depart(c, receives);
  if (!receives) return;
  for (int q = 0; q < size(); ++q) {
    const size_t from = static_cast<size_t>(slice_begin(q, len, esize)) * esize;
    const size_t to = static_cast<size_t>(slice_begin(q + 1, len, esize)) * esize;
    if (q != rank()) copy_bytes(data + from, slot(q) + from, to - from);
  }
}

void ShmCommunicator::run_broadcast(const Collective& c) {
  const size_t esize = element_size(c.dtype());
  auto* data = static_cast<std::byte*>(c.input.data_ptr());
  for_each_chunk(c.count(), chunk_elements(c), [&](int64_t offset, int64_t len) {
    std::byte* mine = data + static_cast<size_t>(offset) * esize;
    const size_t bytes = static_cast<size_t>(len) * esize;
    if (rank() == c.root) copy_bytes(slot(rank()), mine, bytes);
    arrive(c);
    if (rank() != c.root) copy_bytes(mine, slot(c.root), bytes);
    depart(c, false);
  });
}

void ShmCommunicator::run_all_gather(const Collective& c) {
  const size_t esize = element_size(c.dtype());
  const int64_t n = c.count();
  const auto* in = static_cast<const std::byte*>(c.input.data_ptr());
  auto* out = static_cast<std::byte*>(c.output.data_ptr());
  for_each_chunk(n, chunk_elements(c), [&](int64_t offset, int64_t len) {
    const size_t bytes = static_cast<size_t>(len) * esize;
    copy_bytes(slot(rank()), in + static_cast<size_t>(offset) * esize, bytes);
    arrive(c);
    for (int q = 0; q < size(); ++q) {
      copy_bytes(out + static_cast<size_t>(q * n + offset) * esize, slot(q), bytes);
    }
    depart(c, false);
  });
}

// Each step carries, for every block q, the same chunk of block q: rank r then
// reduces sub-slot r of every rank's slot straight into its output.
void ShmCommunicator::run_reduce_scatter(const Collective& c) {
  const size_t esize = element_size(c.dtype());
  const int64_t n = c.output.numel();
  const int64_t chunk = std::max<int64_t>(1, chunk_elements(c) / size());
  const size_t sub_slot = static_cast<size_t>(chunk) * esize;
  const auto* in = static_cast<const std::byte*>(c.input.data_ptr());
  auto* out = static_cast<std::byte*>(c.output.data_ptr());
  for_each_chunk(n, chunk, [&](int64_t offset, int64_t len) {
    const size_t bytes = static_cast<size_t>(len) * esize;
    for (int q = 0; q < size(); ++q) {
      copy_bytes(slot(rank()) + static_cast<size_t>(q) * sub_slot,
                 in + static_cast<size_t>(q * n + offset) * esize, bytes);
    }
    arrive(c);
    comm::reduce_buffers(out + static_cast<size_t>(offset) * esize,
                         sources(static_cast<size_t>(rank()) * sub_slot), size(), len, c.dtype(),
                         c.op, scale(c));
    depart(c, false);
  });
}

// ---- synchronisation (Note [shm steps], Note [shm waiting]) ------------------------

void ShmCommunicator::arrive(const Collective& c) {
  auto& fingerprint = segment_->control(rank()).fingerprint[step_ & 1];
  fingerprint[0].store(pack(c), std::memory_order_relaxed);
  fingerprint[1].store(static_cast<uint64_t>(c.count()), std::memory_order_relaxed);
  signal(2 * step_ + 1);
  wait_all(c, 2 * step_ + 1);
  check_same_collective(c);
}

void ShmCommunicator::depart(const Collective& c, bool wait) {
  signal(2 * step_ + 2);
  if (wait) wait_all(c, 2 * step_ + 2);
}

void ShmCommunicator::signal(uint64_t value) {
  shm::RankControl& mine = segment_->control(rank());
  mine.counter.store(value, std::memory_order_seq_cst);
  // Pairs with the sleeper's fetch_add then load of the counter (both seq_cst):
  // either it sees the new counter or this sees it sleeping and wakes it.
  if (mine.sleepers.load(std::memory_order_seq_cst) != 0) {
    mine.wake.fetch_add(1, std::memory_order_seq_cst);
    shm::futex_wake_all(mine.wake);
  }
}

void ShmCommunicator::wait_all(const Collective& c, uint64_t target) {
  Backoff backoff(oversubscribed_);
  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    shm::RankControl& peer = segment_->control(p);
    while (peer.counter.load(std::memory_order_acquire) < target) {
      if (backoff.pause(peer, target)) check_peers(c, target);
    }
  }
}

// Note [gone before arriving]: a peer's `left` flag and its process state are
// read after its counter was seen short, and then its counter once more. A peer
// sets `left` after its last counter (release, read here with acquire), and
// exits after it; without the second read, a peer that arrived, finished a
// collective that needs no second phase and left or exited after the first read
// (reading /proc takes a while) was named as gone before arriving: a job that
// had completed failed (e2e.flight_recorder_shm, rarely). For
// ShmCommunicator.PeerThatArrivesThenLeavesIsNotGone, DDP_TEST_SHM_CHECK_DELAY_MS
// (read once per process) widens the gap after the first read.
void ShmCommunicator::check_peers(const Collective& c, uint64_t target) {
  static const int64_t delay_ms = env::get_int("DDP_TEST_SHM_CHECK_DELAY_MS").value_or(0);
  // Gone before arriving (it finished its collectives, or failed or timed out in an
  // earlier one), or after arriving: it gave up inside this one (its own timeout, a
  // failure), which is not "exited before arriving". Arrival is the odd counter of
  // the collective's step (arrive()); `target` is it or the departure after it.
  const uint64_t arrival = target % 2 == 1 ? target : target - 1;
  std::vector<std::string> exited, gave_up;
  std::vector<std::string> late;
  for (int p = 0; p < size(); ++p) {
    shm::RankControl& peer = segment_->control(p);
    if (p == rank() || peer.counter.load() >= target) continue;
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    const bool left = peer.left.load(std::memory_order_acquire) != 0;
    const int pid = segment_->pid(p);
    const shm::ProcessState state = shm::process_state(pid);
    const uint64_t counter = peer.counter.load();
    if (counter >= target) continue;  // it arrived since (Note [gone before arriving])
    if (left || state == shm::ProcessState::exited) {
      if (counter >= arrival)
        gave_up.push_back(fmt::format("rank {} (pid {})", p, pid));
      else if (left)
        exited.push_back(fmt::format("rank {} (pid {}, which left the communicator)", p, pid));
      else
        exited.push_back(fmt::format("rank {} (pid {})", p, pid));
    }
    late.push_back(fmt::format("rank {} (pid {}, {})", p, pid, shm::process_state_name(state)));
  }
  if (late.empty()) return;  // every peer arrived while this looked
  if (!exited.empty() || !gave_up.empty()) {
    std::vector<std::string> why;
    if (!exited.empty()) {
      why.push_back(
          fmt::format("{} exited before arriving at this collective", fmt::join(exited, ", ")));
    }
    if (!gave_up.empty()) {
      why.push_back(
          fmt::format("{} arrived at this collective but left the communicator "
                      "without completing it (it failed, or timed out waiting)",
                      fmt::join(gave_up, ", ")));
    }
    fail(c, fmt::format("{}; the group cannot complete it. Check that rank's output for the "
                        "cause (a crash, an OOM kill, an uncaught exception, its timeout)",
                        fmt::join(why, "; ")));
  }
  if (Clock::now() >= deadline_) {
    fail_timeout(c, fmt::format("{} did not arrive (step counter {} of segment {}). A stopped "
                                "process (SIGSTOP, a debugger), a rank busy elsewhere, or a rank "
                                "that skipped this collective: set DDP_DEBUG=detail to compare "
                                "collectives across ranks, or raise DDP_TIMEOUT_S",
                                fmt::join(late, ", "), target, segment_->name()));
  }
}

void ShmCommunicator::check_same_collective(const Collective& c) {
  const uint64_t mine = pack(c);
  const auto count = static_cast<uint64_t>(c.count());
  for (int p = 0; p < size(); ++p) {
    const auto& theirs = segment_->control(p).fingerprint[step_ & 1];
    const uint64_t kind = theirs[0].load(std::memory_order_relaxed);
    const uint64_t n = theirs[1].load(std::memory_order_relaxed);
    if (kind == mine && n == count) continue;
    fail(c,
         fmt::format("collective mismatch: rank {} issued {} while rank {} issued {}; every rank "
                     "must issue the same collectives in the same order",
                     rank(), c.describe(), p, describe_packed(kind, n, c.sequence)));
  }
}

}  // namespace

std::shared_ptr<Communicator> make_shm_communicator(const ShmOptions& options) {
  DDP_CHECK(options.size >= 1 && options.rank >= 0 && options.rank < options.size,
            "shm backend: rank {} and world size {} are inconsistent (need 0 <= rank < size)",
            options.rank, options.size);
  DDP_CHECK(!options.run_id.empty(),
            "shm backend: ShmOptions.run_id is empty; every rank of one group must pass the same "
            "id (ddprun sets DDPRUN_RUN_ID)");
  check_comm_options(options.comm, "shm backend");
  auto segment = shm::Segment::attach(options.rank, options.size, options.run_id,
                                      options.comm.timeout, options.abandon);
  return std::make_shared<ShmCommunicator>(options, std::move(segment));
}

}  // namespace ddp
