#include "collectives/flight/flight_recorder.h"

#include "collectives/flight/flight_dump.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>
#include <thread>

namespace ddp::flight {
namespace {

constexpr std::memory_order kRelaxed = std::memory_order_relaxed;

// The begin of this thread's current wait (a thread waits on one Work at a time).
thread_local int64_t t_wait_begin_ns = 0;

uint64_t u64(int64_t v) {
  return static_cast<uint64_t>(v);
}

// Seqlock writer side (Note [flight region]): the CAS also keeps the rank's
// writer threads apart. Returns the even value it found.
uint64_t lock_word(Word& lock) {
  uint64_t seen = lock.load(kRelaxed);
  for (int spins = 0;; ++spins) {
    if ((seen & 1) == 0 &&
        lock.compare_exchange_weak(seen, seen + 1, std::memory_order_acquire, kRelaxed)) {
      break;
    }
    if (spins > 64) std::this_thread::yield();
    seen = lock.load(kRelaxed);
  }
  std::atomic_thread_fence(std::memory_order_release);
  return seen;
}

void unlock_word(Word& lock, uint64_t seen) {
  lock.store(seen + 2, std::memory_order_release);
}

uint64_t ident_of(const CollectiveInfo& info) {
  return static_cast<uint32_t>(info.comm_id) | (u64(static_cast<uint32_t>(info.root)) << 32);
}

uint64_t shape_of(const CollectiveInfo& info, RecordState state, uint8_t flags) {
  return u64(static_cast<uint8_t>(info.kind)) | u64(static_cast<uint8_t>(info.op)) << 8 |
         u64(static_cast<uint8_t>(info.dtype)) << 16 | u64(static_cast<uint8_t>(state)) << 24 |
         u64(flags) << 32;
}

uint64_t with_state(uint64_t shape, RecordState state) {
  return (shape & ~(u64(0xff) << 24)) | u64(static_cast<uint8_t>(state)) << 24;
}

// Note [region file]
// Under ddprun the rank makes its region a file of its own, rank_<R>.<pid>
// (O_EXCL | O_NOFOLLOW: never a file or a link planted there; the directory is
// ddprun's, mode 0700), reserves its blocks (posix_fallocate: a full /dev/shm
// is a warning now, not a SIGBUS in the middle of training, since tmpfs files
// are sparse), writes the header, and only then renames it to rank_<R>. ddprun
// maps whatever rank_<R> is and unlinks it (launcher/flight_watch.h), so a
// second program of the same rank (`ddprun sh -c 'train ...; eval ...'`)
// publishes a new file that ddprun moves to, and no file ddprun maps is ever
// truncated under it.

// Maps the region: a temporary <shm_dir>/rank_<R>.<pid> shared with ddprun
// (`temp` names it; publish_region() renames it), else anonymous memory.
void* map_region(const RecorderOptions& o, int rank, size_t bytes, std::string& temp) {
  if (!o.shm_dir.empty()) {
    temp = fmt::format("{}/rank_{}.{}", o.shm_dir, rank, ::getpid());
    std::string why;
    const int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      why = std::strerror(errno);
    } else {
      const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      void* p =
          err == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      why = std::strerror(err != 0 ? err : errno);
      ::close(fd);
      if (p != MAP_FAILED) return p;
      ::unlink(temp.c_str());
    }
    DDP_LOG_WARN(
        "flight recorder: cannot map {} bytes at {} ({}; is its file system full? `df {}`); "
        "recording in this process's memory, which ddprun cannot read (no hang diagnosis or "
        "straggler figures for this rank)",
        bytes, temp, why, o.shm_dir);
    temp.clear();
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  DDP_CHECK_T(Error, p != MAP_FAILED, "flight recorder: cannot allocate {} bytes: {}", bytes,
              std::strerror(errno));
  return p;
}

// Note [region file]: the header is written; ddprun may map it now. Returns the
// region's name, "" when the rename failed (logged; the rank records anyway).
std::string publish_region(const std::string& temp, int rank) {
  if (temp.empty()) return "";
  const std::string path =
      fmt::format("{}/rank_{}", std::filesystem::path(temp).parent_path().string(), rank);
  if (::rename(temp.c_str(), path.c_str()) == 0) return path;
  DDP_LOG_WARN(
      "flight recorder: cannot rename {} to {} ({}); ddprun cannot read this rank's "
      "region",
      temp, path, std::strerror(errno));
  ::unlink(temp.c_str());
  return "";
}

// Note [flight recorder and fork]
// A fork()ed child inherits the recorder: its region (MAP_SHARED under ddprun,
// so the child's writes would land in the parent's records, under the parent's
// pid), a record lock that another thread of the parent may have held at the
// fork (odd for ever in the child's copy), and the SIGUSR1 pipe, whose dump
// thread is the parent's. So the child's copy goes quiet: every recorder
// remembers the fork generation it was made in and ignores events of a later
// one, the pipe is closed (SIGUSR1 to the child dumps nothing and leaves it
// alone), and ensure_recorder() starts over: a communicator the child makes
// installs a recorder of its own.
std::atomic<uint64_t> g_fork_generation{0};

// ---- SIGUSR1 -------------------------------------------------------------------------

std::atomic<int> g_wake_fd{-1};  // the write end of the dump thread's pipe
std::atomic<int> g_read_fd{-1};  // its read end (the dump thread's)
static_assert(std::atomic<int>::is_always_lock_free, "used in a signal handler");

void on_sigusr1(int) {
  const int saved = errno;
  const char byte = 1;
  const int fd = g_wake_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved;
}

void dump_thread(int read_fd, const FlightRecorder* recorder) {
  for (;;) {
    char byte = 0;
    const ssize_t n = ::read(read_fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const std::string path = recorder->dump("SIGUSR1");
    if (!path.empty()) DDP_LOG_INFO("flight recorder: SIGUSR1: wrote {}", path);
  }
}

// Only where SIGUSR1 has its default action, or the handler of a recorder of
// the parent before a fork (Note [flight recorder]).
void handle_sigusr1(const FlightRecorder* recorder) {
  struct sigaction current {};
  if (::sigaction(SIGUSR1, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) != 0 ||
      (current.sa_handler != SIG_DFL && current.sa_handler != on_sigusr1)) {
    DDP_LOG_DEBUG("flight recorder: SIGUSR1 already has a handler; no dump on SIGUSR1");
    return;
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);  // a flood of signals never blocks the handler
  g_read_fd = fds[0];
  g_wake_fd = fds[1];
  std::thread(dump_thread, fds[0], recorder).detach();
  struct sigaction action {};
  action.sa_handler = on_sigusr1;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGUSR1, &action, nullptr);
}

std::mutex g_install_mutex;
std::atomic<FlightRecorder*> g_recorder{nullptr};
bool g_installed = false;

// Note [flight recorder and fork]. The install mutex is held across fork(), so
// the child's copy is never locked by a thread that does not exist there.
void before_fork() {
  g_install_mutex.lock();
}

void after_fork_in_parent() {
  g_install_mutex.unlock();
}

void after_fork_in_child() {
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
  g_recorder.store(nullptr, std::memory_order_relaxed);
  g_installed = false;
  for (std::atomic<int>* fd : {&g_wake_fd, &g_read_fd}) {
    const int old = fd->exchange(-1);
    if (old >= 0) ::close(old);
  }
  g_install_mutex.unlock();
}

}  // namespace

std::string default_dump_dir() {
  if (auto dir = env::get(env::kFlightDir)) return *dir;
  return private_dump_base();  // Note [dump directories] in flight_dump.h
}

std::string dump_file_name(int rank) {
  return fmt::format("flight_rank_{}.json", rank);
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

namespace {

std::mutex g_job_id_mutex;
std::string g_job_id;  // set_job_id's

}  // namespace

// Note [job id]: what tells one job's dumps from another's in one directory
// (ddprun analyze warns when they differ). ddprun's run id (also torchrun's
// TORCHELASTIC_RUN_ID, but for its default "none"); a Slurm step's job and step
// ids (two sruns of one allocation are two jobs); Open MPI's job id; else the id
// rank 0 made and published in the store (Note [job check] in bootstrap.cpp), so
// that hand-started ranks have one too.
std::string job_id_from_env() {
  for (const char* name : {"DDPRUN_RUN_ID", "TORCHELASTIC_RUN_ID"}) {
    if (auto v = env::get(name); v && *v != "none") return *v;
  }
  if (auto job = env::get("SLURM_JOB_ID")) {
    const auto step = env::get("SLURM_STEP_ID");
    return step ? *job + "." + *step : *job;
  }
  if (auto v = env::get("OMPI_MCA_ess_base_jobid")) return *v;
  std::lock_guard<std::mutex> lock(g_job_id_mutex);
  return g_job_id;
}

void set_job_id(std::string id) {
  std::lock_guard<std::mutex> lock(g_job_id_mutex);
  g_job_id = std::move(id);
}

RecorderOptions recorder_options_from_env() {
  RecorderOptions o;
  if (auto size = env::get_int(env::kFlightRecorderSize)) {
    DDP_CHECK(*size >= 0 && static_cast<size_t>(*size) <= kMaxCapacity,
              "{}={}: expected the number of collectives to keep, 0..{} (0: no flight recorder; "
              "default {})",
              env::kFlightRecorderSize, *size, kMaxCapacity, kDefaultCapacity);
    o.capacity = static_cast<size_t>(*size);
  }
  o.shm_dir = env::get(env::kFlightShm).value_or("");
  o.dump_dir = default_dump_dir();
  o.dump_on_failure = o.shm_dir.empty();
  return o;
}

FlightRecorder::FlightRecorder(const RecorderOptions& options, int rank, int world_size)
    : rank_(rank),
      capacity_(options.capacity),
      dump_dir_(options.dump_dir),
      dump_on_failure_(options.dump_on_failure),
      generation_(g_fork_generation.load(kRelaxed)) {
  bytes_ = region_bytes(capacity_);
  std::string temp;
  base_ = map_region(options, rank, bytes_, temp);
  header_ = std::launder(reinterpret_cast<SharedHeader*>(base_));
  records_ = std::launder(reinterpret_cast<SharedRecord*>(
      static_cast<unsigned char*>(base_) + (bytes_ - capacity_ * sizeof(SharedRecord))));
  SharedHeader& h = *header_;
  h.version.store(kVersion, kRelaxed);
  h.capacity.store(capacity_, kRelaxed);
  h.header_bytes.store(sizeof(SharedHeader), kRelaxed);
  h.record_bytes.store(sizeof(SharedRecord), kRelaxed);
  h.pid.store(u64(::getpid()), kRelaxed);
  h.rank.store(u64(rank), kRelaxed);
  h.world_size.store(u64(world_size), kRelaxed);
  store_string(h.job, kNameWords, job_id_from_env());
  h.created_ns.store(u64(steady_now_ns()), kRelaxed);
  h.wait_comm.store(u64(-1), kRelaxed);
  h.wait_sequence.store(u64(-1), kRelaxed);
  h.magic.store(kMagic, std::memory_order_release);
  region_path_ = publish_region(temp, rank);
}

FlightRecorder::~FlightRecorder() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

bool FlightRecorder::forked_away() const noexcept {
  return generation_ != g_fork_generation.load(kRelaxed);
}

void FlightRecorder::note_timeout(std::chrono::milliseconds timeout) noexcept {
  const auto ns = u64(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count());
  Word& w = header_->collective_timeout_ns;
  uint64_t seen = w.load(kRelaxed);
  while (ns > seen && !w.compare_exchange_weak(seen, ns, kRelaxed)) {
  }
}

void FlightRecorder::on_collective(const CollectiveEvent& e) noexcept {
  if (forked_away()) return;  // Note [flight recorder and fork]
  const CollectiveInfo& info = e.info;
  const int64_t t = e.time_ns;
  header_->last_ns.store(u64(t), kRelaxed);
  switch (e.state) {
    case CollectiveState::enqueued:
      enqueued(info, t);
      break;
    case CollectiveState::started:
      update(info, [&](SharedRecord& r) {
        r.started_ns.store(u64(t), kRelaxed);
        const uint64_t shape = r.shape.load(kRelaxed);
        if (((shape >> 24) & 0xff) == static_cast<uint8_t>(RecordState::enqueued))
          r.shape.store(with_state(shape, RecordState::started), kRelaxed);
      });
      break;
    case CollectiveState::completed:
    case CollectiveState::failed: {
      const bool ok = e.state == CollectiveState::completed;
      update(info, [&](SharedRecord& r) {
        r.finished_ns.store(u64(t), kRelaxed);
        r.shape.store(
            with_state(r.shape.load(kRelaxed), ok ? RecordState::completed : RecordState::failed),
            kRelaxed);
      });
      if (ok) header_->last_progress_ns.store(u64(t), kRelaxed);
      if (!ok) dump_once(info, "failed");
      break;
    }
    case CollectiveState::wait_begin:
      wait_begin(info, t);
      break;
    case CollectiveState::wait_end:
      wait_end(info, t);
      break;
    case CollectiveState::timed_out:
      update(info, [&](SharedRecord& r) {
        r.shape.store(r.shape.load(kRelaxed) | u64(kFlagTimedOut) << 32, kRelaxed);
      });
      dump_once(info, "timed out");
      break;
  }
}

void FlightRecorder::enqueued(const CollectiveInfo& info, int64_t t) {
  SharedHeader& h = *header_;
  if (h.first_ns.load(kRelaxed) == 0) {
    h.first_ns.store(u64(t), kRelaxed);
    store_string(h.backend, kNameWords, info.backend);
  }
  h.last_progress_ns.store(u64(t), kRelaxed);
  if (capacity_ == 0) return;
  const uint64_t index = h.recorded.fetch_add(1, kRelaxed);
  SharedRecord& r = records_[index % capacity_];
  const uint64_t seen = lock_word(r.lock);
  r.index.store(index, kRelaxed);
  r.sequence.store(u64(info.sequence), kRelaxed);
  r.ident.store(ident_of(info), kRelaxed);
  r.shape.store(shape_of(info, RecordState::enqueued, 0), kRelaxed);
  r.count.store(u64(info.count), kRelaxed);
  r.bytes.store(u64(info.bytes), kRelaxed);
  r.enqueued_ns.store(u64(t), kRelaxed);
  r.started_ns.store(0, kRelaxed);
  r.finished_ns.store(0, kRelaxed);
  r.wait_begin_ns.store(0, kRelaxed);
  r.wait_ns.store(0, kRelaxed);
  store_string(r.label, kLabelWords, info.label);
  unlock_word(r.lock, seen);
}

// Runs `update` on the record of `info` under its lock; nothing when the ring
// no longer holds it. The newest records are searched first: a collective's
// later moments come while few others were issued after it.
template <typename Update>
void FlightRecorder::update(const CollectiveInfo& info, Update&& update) {
  if (capacity_ == 0) return;
  const uint64_t recorded = header_->recorded.load(std::memory_order_acquire);
  const uint64_t n = std::min<uint64_t>(recorded, capacity_);
  const uint64_t sequence = u64(info.sequence), ident = ident_of(info);
  for (uint64_t back = 1; back <= n; ++back) {
    SharedRecord& r = records_[(recorded - back) % capacity_];
    if (r.sequence.load(kRelaxed) != sequence || r.ident.load(kRelaxed) != ident) continue;
    const uint64_t seen = lock_word(r.lock);
    if (r.sequence.load(kRelaxed) == sequence && r.ident.load(kRelaxed) == ident) update(r);
    unlock_word(r.lock, seen);
    return;
  }
}

void FlightRecorder::wait_begin(const CollectiveInfo& info, int64_t t) {
  t_wait_begin_ns = t;
  SharedHeader& h = *header_;
  const uint64_t seen = lock_word(h.wait_lock);
  if (h.waiters.load(kRelaxed) == 0) {
    h.wait_since_ns.store(u64(t), kRelaxed);
    h.wait_comm.store(u64(info.comm_id), kRelaxed);
    h.wait_sequence.store(u64(info.sequence), kRelaxed);
  }
  h.waiters.fetch_add(1, kRelaxed);
  unlock_word(h.wait_lock, seen);
  update(info, [&](SharedRecord& r) {
    if (r.wait_begin_ns.load(kRelaxed) == 0) r.wait_begin_ns.store(u64(t), kRelaxed);
  });
}

void FlightRecorder::wait_end(const CollectiveInfo& info, int64_t t) {
  SharedHeader& h = *header_;
  const uint64_t seen = lock_word(h.wait_lock);
  const uint64_t waiters = h.waiters.load(kRelaxed);
  if (waiters <= 1) {
    const auto since = static_cast<int64_t>(h.wait_since_ns.load(kRelaxed));
    if (waiters == 1 && since > 0 && t > since) h.blocked_ns.fetch_add(u64(t - since), kRelaxed);
    h.waiters.store(0, kRelaxed);
    h.wait_since_ns.store(0, kRelaxed);
    h.wait_comm.store(u64(-1), kRelaxed);
    h.wait_sequence.store(u64(-1), kRelaxed);
  } else {
    h.waiters.store(waiters - 1, kRelaxed);
  }
  unlock_word(h.wait_lock, seen);
  const int64_t waited = t_wait_begin_ns > 0 && t > t_wait_begin_ns ? t - t_wait_begin_ns : 0;
  t_wait_begin_ns = 0;
  update(info, [&](SharedRecord& r) { r.wait_ns.fetch_add(u64(waited), kRelaxed); });
}

void FlightRecorder::step_begin() noexcept {
  if (forked_away()) return;
  step_begin_ns_ = steady_now_ns();
  step_begin_blocked_ns_ = static_cast<int64_t>(header_->blocked_ns.load(kRelaxed));
}

void FlightRecorder::step_end() noexcept {
  if (step_begin_ns_ == 0 || forked_away()) return;
  const int64_t t = steady_now_ns();
  SharedHeader& h = *header_;
  const auto blocked = static_cast<int64_t>(h.blocked_ns.load(kRelaxed));
  const uint64_t step_ns = u64(t - step_begin_ns_);
  const uint64_t step_blocked_ns = u64(std::max<int64_t>(0, blocked - step_begin_blocked_ns_));
  // Only this thread marks steps: the first is kept apart before it is counted.
  if (h.steps.load(kRelaxed) == 0) {
    h.first_step_ns.store(step_ns, kRelaxed);
    h.first_step_blocked_ns.store(step_blocked_ns, kRelaxed);
  }
  h.step_ns.fetch_add(step_ns, kRelaxed);
  h.step_blocked_ns.fetch_add(step_blocked_ns, kRelaxed);
  h.steps.fetch_add(1, kRelaxed);
  h.last_progress_ns.store(u64(t), kRelaxed);
  step_begin_ns_ = 0;
}

RankSnapshot FlightRecorder::snapshot(std::string_view reason) const {
  RankSnapshot s = read_region(base_, bytes_, steady_now_ns());
  s.host = host_name();
  s.process = ProcessState::running;
  s.reason = std::string(reason);
  return s;
}

RankStatus FlightRecorder::status() const {
  return read_region_status(base_, bytes_);
}

std::string FlightRecorder::dump(std::string_view reason) const noexcept {
  try {
    return write_dump(dump_dir_, snapshot(reason));
  } catch (const std::exception& e) {
    DDP_LOG_WARN("flight recorder: {}", e.what());
  } catch (...) {
  }
  return "";
}

void FlightRecorder::dump_once(const CollectiveInfo& info, std::string_view what) noexcept {
  if (!dump_on_failure_ || dumped_on_failure_.exchange(true)) return;
  try {
    const std::string reason =
        fmt::format("{} #{} {}{}", collective_name(info.kind), info.sequence, what,
                    info.label.empty() ? "" : fmt::format(" ({})", info.label));
    const std::string path = dump(reason);
    if (!path.empty()) DDP_LOG_WARN("flight recorder: {}: wrote {}", reason, path);
  } catch (...) {
  }
}

void ensure_recorder(int rank, int world_size, std::chrono::milliseconds timeout) {
  if (world_size <= 1) return;
  static std::once_flag at_fork;
  std::call_once(at_fork,
                 [] { ::pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); });
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_installed) {
    if (FlightRecorder* r = g_recorder.load(std::memory_order_relaxed)) r->note_timeout(timeout);
    return;
  }
  const RecorderOptions options = recorder_options_from_env();
  g_installed = true;
  if (options.capacity == 0) return;
  // The region is the launch rank's, RANK as the launcher started the process:
  // ddprun maps rank_<R> into launch rank R's slot. A replacement's first
  // communicator ranks it by its place in the membership, another launch rank's
  // (a healthy rank was blamed for its hang, and its straggler figures lost).
  if (const auto launched = env::get_int(env::kRank); launched && *launched >= 0) {
    rank = static_cast<int>(*launched);
    world_size = std::max(world_size, rank + 1);
  }
  auto r = std::make_shared<FlightRecorder>(options, rank, world_size);
  r->note_timeout(timeout);
  g_recorder.store(r.get(), std::memory_order_release);
  add_collective_observer(r);  // the registry keeps it for the process's life
  if (options.handle_sigusr1) handle_sigusr1(r.get());
}

FlightRecorder* recorder() {
  return g_recorder.load(std::memory_order_acquire);
}

void mark_step_begin() noexcept {
  if (FlightRecorder* r = recorder()) r->step_begin();
}

void mark_step_end() noexcept {
  if (FlightRecorder* r = recorder()) r->step_end();
}

}  // namespace ddp::flight
