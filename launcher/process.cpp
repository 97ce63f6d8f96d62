#include "launcher/process.h"

#include "launcher/watchdog.h"

#include "runtime/error.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

namespace ddp::launcher {

Pipe make_pipe() {
  int fds[2];
  DDP_CHECK_T(Error, ::pipe2(fds, O_CLOEXEC) == 0, "ddprun: pipe2 failed: {}",
              std::strerror(errno));
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return {Fd(fds[0]), Fd(fds[1])};
}

bool write_all(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n >= 0) {
      data += n;
      bytes -= static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else if (errno != EINTR) {
      return false;
    }
  }
  return true;
}

std::string exec_failure(const std::string& path, int error) {
  // The #! line, if any: ENOENT for a file that exists means its interpreter is missing.
  // At most the first 256 bytes: the file may be large, with no newline.
  std::string first(256, '\0');
  if (std::ifstream in(path, std::ios::binary); in) {
    in.read(first.data(), static_cast<std::streamsize>(first.size()));
    first.resize(static_cast<size_t>(in.gcount()));
  } else {
    first.clear();
  }
  first = first.substr(0, first.find('\n'));
  const bool shebang = first.starts_with("#!");
  if (error == ENOENT && shebang) {
    std::string interpreter = first.substr(2);
    interpreter.erase(0, interpreter.find_first_not_of(" \t"));
    interpreter = interpreter.substr(0, interpreter.find_first_of(" \t\r"));
    return fmt::format(
        "cannot execute '{}': its #! line names '{}', which does not exist; install it or fix "
        "the #! line",
        path, interpreter);
  }
  if (error == ENOEXEC) {
    return fmt::format(
        "cannot execute '{}': not a program this machine runs (Exec format error){}", path,
        shebang ? ""
                : ": a script needs a #! line naming its interpreter (e.g. #!/bin/sh), or run "
                  "it as `ddprun ... -- sh SCRIPT`");
  }
  if (error == EISDIR) return fmt::format("cannot execute '{}': it is a directory", path);
  return fmt::format("cannot execute '{}': {}", path, std::strerror(error));
}

namespace {

// Note [a console that does not read]: one queue and writer thread per descriptor,
// so ddprun's own messages on stderr still come while stdout's reader sleeps.
// Made once and never destroyed: a writer may still run while the process exits.
struct Channel {
  int fd = -1;
  std::mutex mutex;
  std::condition_variable wake, drained;
  std::deque<std::string> queue;
  size_t bytes = 0;      // queued, and the text being written
  bool started = false;  // the writer thread
  bool failed = false;   // a write failed (EPIPE): later text is dropped

  size_t queued() {  // bytes
    std::lock_guard lock(mutex);
    return bytes;
  }

  void writer() {
    // A reader gone (EPIPE) must fail the write, not kill ddprun with SIGPIPE: the
    // agent restores SIGPIPE's default action before the last flush.
    sigset_t pipe;
    ::sigemptyset(&pipe);
    ::sigaddset(&pipe, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return !queue.empty(); });
      const std::string text = std::move(queue.front());
      queue.pop_front();
      const bool skip = failed;
      lock.unlock();
      const bool ok = skip || write_all(fd, text.data(), text.size());
      lock.lock();
      if (!ok) failed = true;  // later text is dropped
      bytes -= text.size();
      if (bytes == 0) drained.notify_all();
    }
  }
};

// Whether two descriptors are one file (a terminal, or `2>&1`).
bool same_file(int a, int b) {
  struct stat sa {
  }, sb{};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// stdout's and stderr's channels; one, when both are the same file, so that lines
// keep their order there and a long line is never cut by the other stream's.
Channel* channel(int fd) {
  static Channel* channels = [] {
    auto* c = new Channel[2];
    c[0].fd = STDOUT_FILENO;
    c[1].fd = STDERR_FILENO;
    return c;
  }();
  static const bool shared = same_file(STDOUT_FILENO, STDERR_FILENO);
  if (fd == STDOUT_FILENO || (fd == STDERR_FILENO && shared)) return &channels[0];
  return fd == STDERR_FILENO ? &channels[1] : nullptr;
}

}  // namespace

void console_write(int fd, std::string_view text) {
  Channel* c = channel(fd);
  if (text.empty() || c == nullptr) return;
  std::lock_guard lock(c->mutex);
  if (!c->started) {
    std::thread([c] { c->writer(); }).detach();
    c->started = true;
  }
  c->queue.emplace_back(text);
  c->bytes += text.size();
  c->wake.notify_one();
}

size_t console_backlog() {
  Channel* out = channel(STDOUT_FILENO);
  Channel* err = channel(STDERR_FILENO);
  return out->queued() + (err != out ? err->queued() : 0);
}

void console_flush() {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    Channel* c = channel(fd);
    std::unique_lock lock(c->mutex);
    c->drained.wait(lock, [&] { return c->bytes == 0; });
  }
}

void say(const std::string& text) {
  console_write(STDERR_FILENO, "ddprun: " + text + "\n");
}

namespace {

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Between fork and exec: async-signal-safe calls only (the agent has threads).
[[noreturn]] void exec_child(const SpawnRequest& r, pid_t agent, int null_fd, int report_fd,
                             char* const* argv, char* const* envp) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != agent) ::_exit(127);  // the agent died before prctl took effect
  ::dup2(null_fd, STDIN_FILENO);
  ::dup2(r.stdout_fd, STDOUT_FILENO);
  ::dup2(r.stderr_fd, STDERR_FILENO);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE, SIGQUIT})
    ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(r.path.c_str(), argv, envp);
  const int error = errno;
  ssize_t ignored = ::write(report_fd, &error, sizeof(error));
  (void)ignored;
  ::_exit(127);
}

}  // namespace

pid_t spawn(const SpawnRequest& request) {
  Fd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  DDP_CHECK_T(Error, static_cast<bool>(null_fd), "ddprun: cannot open /dev/null: {}",
              std::strerror(errno));
  Pipe report = make_pipe();  // exec failure: the child writes errno here
  const auto argv = c_strings(request.argv);
  const auto envp = c_strings(request.env);
  const pid_t agent = ::getpid();
  const pid_t pid = ::fork();
  DDP_CHECK_T(Error, pid >= 0, "ddprun: fork failed: {}", std::strerror(errno));
  if (pid == 0)
    exec_child(request, agent, null_fd.get(), report.write.get(), argv.data(), envp.data());
  ::setpgid(pid, pid);  // also here, so signal_group() works before the child ran
  watchdog_track(pid);
  report.write.reset();
  int error = 0;
  ssize_t n;
  do {
    pollfd p{report.read.get(), POLLIN, 0};
    ::poll(&p, 1, -1);
    n = ::read(report.read.get(), &error, sizeof(error));
  } while (n < 0 && (errno == EINTR || errno == EAGAIN));
  if (n == static_cast<ssize_t>(sizeof(error))) {
    watchdog_untrack(pid);
    int status = 0;
    ::waitpid(pid, &status, 0);
    throw ExecError(exec_failure(request.path, error), error == ENOENT ? 127 : 126);
  }
  return pid;
}

void signal_group(pid_t pgid, int sig) {
  if (pgid > 0) ::kill(-pgid, sig);
}

std::optional<int> try_reap(pid_t pid) {
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid == 0) {
    return std::nullopt;
  }
  ::kill(-pid, SIGKILL);  // Note [no orphans]: the zombie still holds the pgid
  watchdog_untrack(pid);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::optional<StopChange> try_stop_change(pid_t pid) {
  std::optional<StopChange> latest;
  for (int i = 0; i < 4; ++i) {  // a stop and a continue may both be pending
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WSTOPPED | WCONTINUED | WNOHANG) != 0 ||
        info.si_pid == 0) {
      break;
    }
    if (info.si_code == CLD_STOPPED) latest = StopChange{.stopped = true, .signal = info.si_status};
    if (info.si_code == CLD_CONTINUED) latest = StopChange{.stopped = false};
  }
  return latest;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string describe_status(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exit code {}", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    return fmt::format("killed by {}{}", signal_name(WTERMSIG(wait_status)),
                       WCOREDUMP(wait_status) ? " (core dumped)" : "");
  }
  return fmt::format("wait status {:#x}", wait_status);
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

bool catches_signal_in(std::string_view proc_status, int sig) {
  constexpr std::string_view kField = "\nSigCgt:";
  const size_t at = proc_status.find(kField);
  if (at == std::string_view::npos || sig < 1 || sig > 64) return false;
  const std::string hex(proc_status.substr(at + kField.size(), 20));
  char* end = nullptr;
  const unsigned long long mask = std::strtoull(hex.c_str(), &end, 16);
  return end != hex.c_str() && ((mask >> (sig - 1)) & 1u) != 0;
}

bool catches_signal(pid_t pid, int sig) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  if (!in) return false;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return catches_signal_in(text, sig);
}

// ---- signals -------------------------------------------------------------------

namespace {

constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD};
std::atomic<int> g_signal_write_fd{-1};
std::atomic<int> g_stop_signal{0};
struct sigaction g_previous[std::size(kHandledSignals) + 1];

void on_signal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD && sig != SIGUSR1) {
    int expected = 0;
    g_stop_signal.compare_exchange_strong(expected, sig);
  }
  const unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_write_fd.load(), &byte, 1);  // full pipe: a wakeup is pending
  (void)ignored;
  errno = saved;
}

}  // namespace

SignalPipe::SignalPipe() {
  Pipe p = make_pipe();
  ::fcntl(p.write.get(), F_SETFL, ::fcntl(p.write.get(), F_GETFL) | O_NONBLOCK);
  read_ = std::move(p.read);
  write_ = std::move(p.write);
  g_signal_write_fd = write_.get();
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;  // no SA_NOCLDSTOP: a stopped rank wakes the agent
  ::sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
    ::sigaction(kHandledSignals[i], &sa, &g_previous[i]);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &g_previous[std::size(kHandledSignals)]);
}

SignalPipe::~SignalPipe() {
  for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
    ::sigaction(kHandledSignals[i], &g_previous[i], nullptr);
  }
  ::sigaction(SIGPIPE, &g_previous[std::size(kHandledSignals)], nullptr);
  g_signal_write_fd = -1;
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> out;
  unsigned char buffer[64];
  for (;;) {
    const ssize_t n = ::read(read_.get(), buffer, sizeof(buffer));
    if (n <= 0) break;
    out.insert(out.end(), buffer, buffer + n);
  }
  return out;
}

int SignalPipe::stop_signal() {
  return g_stop_signal.load();
}

}  // namespace ddp::launcher
