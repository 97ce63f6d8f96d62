// The process's side of the timeline (Note [timeline] in runtime/trace.h):
// starting from DDP_TRACE, the file at exit and on signals, and what a forked
// child inherits.
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/trace.h"
#include "runtime/trace/file.h"
#include "runtime/trace/gpu.h"
#include "runtime/trace/internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

namespace ddp::trace {
namespace {

// The process that last called start(): only it writes at exit (Note [trace and fork]).
std::atomic<pid_t> g_start_pid{0};
// The records published when the file was last written: at exit it is written
// again only when there are more (train writes it at the end of its run), and
// never when nothing was recorded.
std::atomic<int64_t> g_written_records{0};

void write_quietly(const char* why) noexcept {
  try {
    write_file();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: DDP_TRACE: could not write the trace %s: %s\n", why, e.what());
  }
}

void at_exit() {
  if (g_start_pid.load() != ::getpid() || directory().empty()) return;
  const int64_t published = detail::published_records();
  if (published == 0 || published == g_written_records.load()) return;
  write_quietly("at exit");
}

// Note [trace on signals]
// The handler of SIGTERM, SIGINT and SIGHUP stops recording (so that the file
// holds what happened until the signal, and writing it takes a bounded time) and
// writes the signal's number into a pipe (both async-signal-safe); a thread of
// ours writes the file, puts the previous action back and raises the signal
// again, which then does what it did before. A second signal while the file is
// being written does at once what it did before (a second Ctrl-C ends the
// program); a signal the program ignores stays ignored.
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
constexpr size_t kSignalCount = std::size(kSignals);
int g_pipe[2] = {-1, -1};
pid_t g_signal_pid = 0;  // the process whose thread writes on signals
struct sigaction g_previous[kSignalCount];
bool g_installed[kSignalCount] = {};
std::atomic<bool> g_signalled{false};  // a signal began the write
static_assert(std::atomic<bool>::is_always_lock_free);

// Async-signal-safe: what `sig` did before we handled it, now.
void restore_and_raise(int sig) {
  for (size_t i = 0; i < kSignalCount; ++i) {
    if (kSignals[i] == sig && g_installed[i]) ::sigaction(sig, &g_previous[i], nullptr);
  }
  ::raise(sig);  // blocked in its handler: delivered with the restored action on return
}

void on_signal(int sig) {
  const int saved = errno;
  if (::getpid() != g_signal_pid || g_signalled.exchange(true)) {
    restore_and_raise(sig);  // a forked child's (Note [trace and fork]), or a second signal
  } else {
    detail::g_on.store(false, std::memory_order_relaxed);
    const char byte = static_cast<char>(sig);
    [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &byte, 1);
  }
  errno = saved;
}

void signal_thread(int read_fd, std::shared_ptr<std::promise<void>> running) {
  running->set_value();
  running.reset();
  for (;;) {
    char byte = 0;
    const ssize_t n = ::read(read_fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const int sig = static_cast<unsigned char>(byte);
    write_quietly(fmt::format("on signal {}", sig).c_str());
    for (size_t i = 0; i < kSignalCount; ++i) {
      if (kSignals[i] == sig && g_installed[i]) ::sigaction(sig, &g_previous[i], nullptr);
    }
    ::kill(::getpid(), sig);
  }
}

// Note [trace and fork]
// A child forked without exec inherits the parent's records, handlers and pipe
// (but not its threads). Left alone, its SIGTERM would make the parent write
// and end itself while the child ignored the signal, and its exit would write
// the parent's rank file. So the child stops recording, gets the signals'
// previous actions back and closes the pipe (pthread_atfork, async-signal-safe
// calls only); a child that wants a timeline of its own calls start().
void in_forked_child() {
  detail::g_on.store(false, std::memory_order_relaxed);
  for (size_t i = 0; i < kSignalCount; ++i) {
    if (g_installed[i]) ::sigaction(kSignals[i], &g_previous[i], nullptr);
    g_installed[i] = false;
  }
  if (g_pipe[0] >= 0) ::close(g_pipe[0]);
  if (g_pipe[1] >= 0) ::close(g_pipe[1]);
  g_pipe[0] = g_pipe[1] = -1;
  g_signal_pid = 0;
  g_signalled.store(false, std::memory_order_relaxed);
}

void handle_signals() {
  if (g_signal_pid == ::getpid()) return;  // once per process
  if (::pipe2(g_pipe, O_CLOEXEC) != 0) return;
  g_signal_pid = ::getpid();
  g_signalled.store(false);
  // Returns once the thread runs: a fork right after start() then finds no thread
  // half made (with a sanitizer's thread registry locked, the child's own threads
  // would never start).
  auto running = std::make_shared<std::promise<void>>();
  std::future<void> ran = running->get_future();
  std::thread(signal_thread, g_pipe[0], std::move(running)).detach();
  ran.wait();
  for (size_t i = 0; i < kSignalCount; ++i) {
    struct sigaction current {};
    ::sigaction(kSignals[i], nullptr, &current);
    if (current.sa_handler == SIG_IGN) continue;  // nohup's SIGHUP stays ignored
    // Ours already (a child whose hook did not run): the previous action is the one saved.
    if (current.sa_handler != on_signal) g_previous[i] = current;
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(kSignals[i], &action, nullptr);
    g_installed[i] = true;
  }
}

// Who this process is before a process group says so: the launcher's variables
// (runtime/env.h), so that ranks of a program without one still write their own
// files, rank_<R>.json, of one run.
RankInfo rank_from_env() {
  RankInfo info;
  for (const auto& [rank, size, launcher] :
       {std::tuple{env::kRank, env::kWorldSize, "ddprun"},
        std::tuple{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"},
        std::tuple{"PMI_RANK", "PMI_SIZE", "pmi"},
        std::tuple{"SLURM_PROCID", "SLURM_NTASKS", "slurm"}}) {
    const std::optional<std::string> r = env::get(rank);
    if (!r) continue;
    info.rank = static_cast<int>(std::strtol(r->c_str(), nullptr, 10));
    info.world_size =
        static_cast<int>(std::strtol(env::get(size).value_or("1").c_str(), nullptr, 10));
    info.launcher = launcher;
    break;
  }
  info.run_id = env::get(env::kRunId).value_or("");
  info.restart = static_cast<int>(
      std::strtol(env::get(env::kRestartCount).value_or("0").c_str(), nullptr, 10));
  return info;
}

}  // namespace

namespace detail {

void started(const StartOptions& options) {
  static std::once_flag once;  // inherited by a forked child, as its handlers are
  std::call_once(once, [] {
    std::atexit(at_exit);
    ::pthread_atfork(nullptr, nullptr, in_forked_child);
  });
  g_start_pid.store(::getpid());
  g_written_records.store(0);
  if (options.handle_signals && !options.dir.empty()) handle_signals();
}

}  // namespace detail

bool requested() {
  return env::get(env::kTrace).has_value();
}

bool start_from_env() noexcept {
  static std::atomic<pid_t> done{0};  // once per process, a forked child included
  if (done.exchange(::getpid()) == ::getpid()) return enabled();
  try {
    const std::optional<std::string> dir = env::get(env::kTrace);
    if (!dir) return false;
    StartOptions options;
    options.dir = *dir;
    if (auto max = env::get_int(env::kTraceMaxEvents)) {
      DDP_CHECK(*max > 0, "{}={} must be a positive number of records", env::kTraceMaxEvents, *max);
      options.max_events = *max;
    }
    set_rank_info(rank_from_env());
    start(options);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: %s: tracing is off in this process: %s\n", env::kTrace, e.what());
    return false;
  }
}

std::string write_file() {
  const std::string dir = directory();
  DDP_CHECK(!dir.empty(), "trace::write_file: tracing has no directory; set {}=DIR", env::kTrace);
  static auto* write_mutex = new std::mutex();  // one write at a time; never destroyed
  std::lock_guard<std::mutex> lock(*write_mutex);
  poll_device_spans();  // Note [device spans]
  const int64_t published = detail::published_records();
  const Snapshot s = snapshot();
  const std::string path = fmt::format("{}/{}", dir, rank_file_name(s.rank.rank, s.rank.restart));
  write_atomically(path, [&s](std::ostream& out) { write_rank_file(out, s); });
  g_written_records.store(published);
  return path;
}

}  // namespace ddp::trace
