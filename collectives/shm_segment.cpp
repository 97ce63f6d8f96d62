#include "collectives/shm_segment.h"

#include "collectives/communicator.h"
#include "runtime/logging.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>
#include <vector>

// Note [shm cleanup]: nothing may be left in /dev/shm, even when ranks crash.
// Rank 0 creates the segment; every rank, once it mapped it, stores its pid and
// increments `attached`. The rank that brings `attached` to the world size
// shm_unlink()s the name: the mappings stay valid, and from then on the kernel
// frees the memory with the last process, however it ends. If the group never
// forms (a rank died or never started), the creator unlinks at its timeout. A
// segment left by a crashed creator (same run id) is replaced by the next rank 0,
// and ranks that open it see its creator's pid gone and retry.

namespace ddp::shm {
namespace {

constexpr uint64_t kMagic = 0x316d68732d706464ULL;  // "ddp-shm1"
constexpr size_t kPage = 4096;
constexpr size_t kDataBudget = size_t{32} << 20;  // all slots of a group, both buffers
constexpr size_t kMinSlotBytes = size_t{64} << 10;
// 1 MiB chunks: every chunk costs two barriers and the ranks' hand-over of its
// slices, so fewer chunks won over caches (0.8 MB all_reduce 61.6 us at 1 MiB vs
// 68.1 at 512 KiB, 1.6 MB 108 vs 125; 128 KiB to 4 MiB tried; docs/backends.md).
constexpr size_t kMaxSlotBytes = size_t{1} << 20;
constexpr const char* kAttachOp = "shm attach";

using Clock = std::chrono::steady_clock;

size_t round_up(size_t value, size_t align) {
  return (value + align - 1) / align * align;
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

[[noreturn]] void attach_error(int rank, const std::string& message) {
  throw CommError(fmt::format("rank {}: {}", rank, message), rank, kAttachOp, -1, 0);
}

std::string errno_text() {
  return std::strerror(errno);
}

// Creates `name` exclusively, removing a stale segment of the same name first.
int create_exclusive(int rank, const std::string& name) {
  for (int attempt = 0;; ++attempt) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) return fd;
    if (errno != EEXIST || attempt == 3) {
      attach_error(rank,
                   fmt::format("cannot create shared-memory segment {}: {}", name, errno_text()));
    }
    DDP_LOG_WARN("shm: removing the stale segment {} left by an earlier run with this run id",
                 name);
    shm_unlink(name.c_str());
  }
}

void reserve(int rank, int fd, const std::string& name, size_t bytes) {
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    attach_error(rank, fmt::format("cannot size shared-memory segment {} to {} bytes: {}", name,
                                   bytes, errno_text()));
  }
  // Reserve the pages now: a full /dev/shm is then this clear error, not a SIGBUS later.
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc == ENOSPC) {
    attach_error(rank, fmt::format("/dev/shm has no room for the {:.1f} MiB of segment {}; free "
                                   "space there or enlarge it (docker run --shm-size=1g)",
                                   static_cast<double>(bytes) / (1 << 20), name));
  }
  if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
    attach_error(
        rank, fmt::format("cannot reserve shared-memory segment {}: {}", name, std::strerror(rc)));
  }
}

}  // namespace

SegmentLayout SegmentLayout::for_size(int size) {
  SegmentLayout layout;
  const size_t ranks = static_cast<size_t>(size);
  const size_t share = kDataBudget / (2 * ranks) / kPage * kPage;
  layout.slot_bytes = std::clamp(share, kMinSlotBytes, kMaxSlotBytes);
  layout.control_offset = sizeof(SegmentHeader);
  layout.data_offset = round_up(layout.control_offset + ranks * sizeof(RankControl), kPage);
  layout.total_bytes = layout.data_offset + 2 * ranks * layout.slot_bytes;
  return layout;
}

std::string segment_name(const std::string& run_id) {
  std::string name = "/ddp-shm-";
  for (char ch : run_id.substr(0, 200)) {
    const bool keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    name += keep ? ch : '_';
  }
  return name;
}

Segment::Segment(std::string name, int rank, int size)
    : name_(std::move(name)), rank_(rank), size_(size), layout_(SegmentLayout::for_size(size)) {}

Segment::~Segment() {
  unmap();
}

std::unique_ptr<Segment> Segment::attach(int rank, int size, const std::string& run_id,
                                         std::chrono::milliseconds timeout,
                                         const std::function<bool()>& abandon) {
  std::unique_ptr<Segment> segment(new Segment(segment_name(run_id), rank, size));
  segment->abandon_ = abandon;
  const auto deadline = Clock::now() + timeout;
  try {
    if (rank == 0) {
      segment->create();
    } else {
      segment->open_until(deadline);
    }
    segment->join(deadline);
  } catch (...) {
    if (rank == 0) shm_unlink(segment->name_.c_str());  // Note [shm cleanup]
    throw;
  }
  return segment;
}

RankControl& Segment::control(int rank) const {
  return reinterpret_cast<RankControl*>(base_ + layout_.control_offset)[rank];
}

std::byte* Segment::slot(int rank, int buffer) const {
  const size_t index = static_cast<size_t>(buffer * size_ + rank);
  return base_ + layout_.data_offset + index * layout_.slot_bytes;
}

void Segment::map(int fd) {
  void* p = mmap(nullptr, layout_.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const std::string why = errno_text();
    close(fd);
    attach_error(rank_, fmt::format("cannot map shared-memory segment {} ({} bytes): {}", name_,
                                    layout_.total_bytes, why));
  }
  base_ = static_cast<std::byte*>(p);
}

void Segment::unmap() {
  if (base_ != nullptr) munmap(base_, layout_.total_bytes);
  base_ = nullptr;
}

void Segment::create() {
  const int fd = create_exclusive(rank_, name_);
  try {
    reserve(rank_, fd, name_, layout_.total_bytes);
  } catch (...) {
    close(fd);
    throw;
  }
  map(fd);
  close(fd);
  // ftruncate zero-filled the memory; begin the lifetimes of the shared objects.
  SegmentHeader* h = new (base_) SegmentHeader();
  for (int r = 0; r < size_; ++r) new (&control(r)) RankControl();
  h->size = size_;
  h->creator_pid = static_cast<int32_t>(getpid());
  h->slot_bytes = layout_.slot_bytes;
  h->magic.store(kMagic, std::memory_order_release);
}

// One attempt to open the segment of this run; `why` says what was wrong otherwise.
bool Segment::try_open(std::string& why) {
  const int fd = shm_open(name_.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno != ENOENT) {
      attach_error(rank_,
                   fmt::format("cannot open shared-memory segment {}: {}", name_, errno_text()));
    }
    why = "it does not exist yet";
    return false;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < layout_.total_bytes) {
    close(fd);
    why = "it is still being created";
    return false;
  }
  map(fd);
  close(fd);
  const SegmentHeader& h = header();
  if (h.magic.load(std::memory_order_acquire) != kMagic) {
    why = "it is not initialised yet";
  } else if (h.size != size_ || h.slot_bytes != layout_.slot_bytes) {
    why = fmt::format("it was made for world size {}, this rank has world size {}", h.size, size_);
  } else if (process_state(h.creator_pid) == ProcessState::exited) {
    why = fmt::format("it is stale: its creator (pid {}) exited", h.creator_pid);
  } else {
    return true;
  }
  unmap();
  return false;
}

void Segment::check_abandon() const {
  if (abandon_ && abandon_()) {
    attach_error(rank_, fmt::format("gave up forming shared-memory segment {}: the group's "
                                    "membership lost a member meanwhile",
                                    name_));
  }
}

void Segment::open_until(Clock::time_point deadline) {
  const auto start = Clock::now();
  std::string why;
  while (!try_open(why)) {
    check_abandon();
    if (Clock::now() >= deadline) {
      throw CommTimeoutError(
          fmt::format("rank {}: could not open shared-memory segment {} within {:.1f} s: {}. Rank "
                      "0 creates it; check that rank 0 runs with the same DDPRUN_RUN_ID and "
                      "WORLD_SIZE ({}) on this node",
                      rank_, name_, seconds(Clock::now() - start), why, size_),
          rank_, kAttachOp, -1, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Segment::join(Clock::time_point deadline) {
  RankControl& mine = control(rank_);
  int32_t other = 0;
  if (!mine.pid.compare_exchange_strong(other, static_cast<int32_t>(getpid()))) {
    attach_error(rank_, fmt::format("rank {} of segment {} is already taken by pid {}; two "
                                    "processes were started with RANK={}",
                                    rank_, name_, other, rank_));
  }
  if (header().attached.fetch_add(1) + 1 == size_) shm_unlink(name_.c_str());  // Note [shm cleanup]
  wait_attached(deadline);
}

void Segment::wait_attached(Clock::time_point deadline) {
  const auto start = Clock::now();
  while (header().attached.load(std::memory_order_acquire) < size_) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      const int pid_r = pid(r);
      if (pid_r == 0) missing.push_back(r);
      if (pid_r != 0 && process_state(pid_r) == ProcessState::exited) {
        attach_error(rank_, fmt::format("rank {} (pid {}) exited while the ranks attached to "
                                        "shared-memory segment {}",
                                        r, pid_r, name_));
      }
    }
    check_abandon();
    if (Clock::now() >= deadline) {
      throw CommTimeoutError(
          fmt::format("rank {}: {} {} did not attach to shared-memory segment {} within {:.1f} "
                      "s ({} of {} attached); check that every rank started, on this node, with "
                      "the same DDPRUN_RUN_ID and WORLD_SIZE",
                      rank_, missing.size() == 1 ? "rank" : "ranks", fmt::join(missing, ", "),
                      name_, seconds(Clock::now() - start),
                      size_ - static_cast<int>(missing.size()), size_),
          rank_, kAttachOp, -1, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

ProcessState process_state(int pid) {
  if (pid <= 0) return ProcessState::running;
  if (kill(pid, 0) != 0 && errno == ESRCH) return ProcessState::exited;
  // kill() succeeds on a zombie (dead, not yet reaped by its parent); /proc tells.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return ProcessState::running;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return ProcessState::running;
  switch (line[paren + 2]) {
    case 'Z':
    case 'X':
    case 'x':
      return ProcessState::exited;
    case 'T':
    case 't':
      return ProcessState::stopped;
    default:
      return ProcessState::running;
  }
}

std::string_view process_state_name(ProcessState state) {
  switch (state) {
    case ProcessState::running:
      return "running";
    case ProcessState::stopped:
      return "stopped";
    case ProcessState::exited:
      return "exited";
  }
  return "?";
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::microseconds timeout) {
  const timespec ts{static_cast<time_t>(timeout.count() / 1000000),
                    static_cast<long>(timeout.count() % 1000000) * 1000};
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace ddp::shm
