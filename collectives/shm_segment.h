// The POSIX shared-memory segment of one shm group (collectives/shm_communicator.cpp):
// its layout, creation, attachment and cleanup, the liveness of the peer processes
// and the futex wake-ups the ranks wait on. Internal to the shm backend.
//
// Layout (all offsets fixed by the world size, so every rank computes them alone):
//   SegmentHeader                      one cache line
//   RankControl[size]                  one cache line per rank: counter, pid, fingerprints
//   data slots [2 buffers][size]       slot_bytes each, page aligned
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace ddp::shm {

inline constexpr size_t kCacheLine = 64;

struct alignas(kCacheLine) SegmentHeader {
  std::atomic<uint64_t> magic;  // stored last (release) by the creator
  int32_t size;                 // world size the segment was made for
  int32_t creator_pid;
  uint64_t slot_bytes;
  std::atomic<int32_t> attached;  // Note [shm cleanup]
};

// One rank's published state. Only that rank writes counter, wake and fingerprint;
// the others read them (and touch sleepers while they wait on it).
struct alignas(kCacheLine) RankControl {
  std::atomic<uint64_t> counter;   // Note [shm steps]: monotonic, never reset
  std::atomic<uint32_t> wake;      // futex word, bumped when sleepers are waiting
  std::atomic<uint32_t> sleepers;  // peers sleeping on `wake`
  std::atomic<int32_t> pid;        // 0 until the rank attached
  // Set when the rank dropped its communicator (an elastic regroup, Note [elastic
  // membership] in collectives/elastic.h): peers waiting for it fail as if it exited.
  std::atomic<uint32_t> left;
  std::atomic<uint64_t> fingerprint[2][2];  // per step parity: {kind|op|dtype|root, count}
};
static_assert(sizeof(RankControl) == kCacheLine);
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4);

struct SegmentLayout {
  size_t slot_bytes = 0;
  size_t control_offset = 0;
  size_t data_offset = 0;
  size_t total_bytes = 0;
  static SegmentLayout for_size(int size);
};

// "/ddp-shm-<run_id>" with every character outside [A-Za-z0-9._-] replaced by '_'.
std::string segment_name(const std::string& run_id);

class Segment {
 public:
  // Rank 0 creates the segment (replacing a stale one of a crashed run), the others
  // open it with retries; every rank then attaches and waits until all `size` ranks
  // did, or throws CommTimeoutError naming the ranks that did not (Note [shm cleanup]).
  // abandon: polled while waiting for the others; true gives up (ShmOptions::abandon).
  static std::unique_ptr<Segment> attach(int rank, int size, const std::string& run_id,
                                         std::chrono::milliseconds timeout,
                                         const std::function<bool()>& abandon = {});
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  RankControl& control(int rank) const;
  std::byte* slot(int rank, int buffer) const;
  size_t slot_bytes() const { return layout_.slot_bytes; }
  const std::string& name() const { return name_; }
  int pid(int rank) const { return control(rank).pid.load(std::memory_order_relaxed); }

 private:
  Segment(std::string name, int rank, int size);
  void create();
  bool try_open(std::string& why);
  void open_until(std::chrono::steady_clock::time_point deadline);
  void join(std::chrono::steady_clock::time_point deadline);
  void wait_attached(std::chrono::steady_clock::time_point deadline);
  void check_abandon() const;
  std::function<bool()> abandon_;
  void map(int fd);
  void unmap();
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }

  std::string name_;
  int rank_;
  int size_;
  SegmentLayout layout_;
  std::byte* base_ = nullptr;
};

enum class ProcessState { running, stopped, exited };
// running, stopped (SIGSTOP, a debugger) or exited (gone, or a zombie not yet reaped).
ProcessState process_state(int pid);
std::string_view process_state_name(ProcessState state);

// FUTEX_WAIT on a word shared between processes: sleeps while *word == expected,
// at most `timeout`; returns early on a wake-up or a signal.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::microseconds timeout);
void futex_wake_all(std::atomic<uint32_t>& word);

}  // namespace ddp::shm
