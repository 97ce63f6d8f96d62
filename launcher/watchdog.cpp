#include "launcher/watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <set>

namespace ddp::launcher {
namespace {

int g_write_fd = -1;

// The watchdog's whole life: +pgid tracks, -pgid forgets, end of file kills.
[[noreturn]] void watch(int read_fd) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGUSR1}) ::signal(sig, SIG_IGN);
  const int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd <= 2 && null_fd >= 0; ++fd) ::dup2(null_fd, fd);
  std::set<pid_t> groups;
  int32_t message = 0;
  for (;;) {
    const ssize_t n = ::read(read_fd, &message, sizeof(message));
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof(message))) break;  // ddprun is gone
    if (message > 0)
      groups.insert(message);
    else
      groups.erase(-message);
  }
  for (const pid_t pgid : groups) ::kill(-pgid, SIGKILL);
  ::_exit(0);
}

void send(int32_t message) {
  if (g_write_fd < 0) return;
  ssize_t n;
  do {
    n = ::write(g_write_fd, &message, sizeof(message));  // atomic: under PIPE_BUF
  } while (n < 0 && errno == EINTR);
}

}  // namespace

void start_watchdog() {
  int fds[2];
  if (g_write_fd >= 0 || ::pipe2(fds, O_CLOEXEC) != 0) return;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[1]);
    watch(fds[0]);
  }
  ::close(fds[0]);
  if (pid < 0) {
    ::close(fds[1]);
    return;
  }
  g_write_fd = fds[1];
}

void watchdog_track(pid_t pgid) {
  send(static_cast<int32_t>(pgid));
}
void watchdog_untrack(pid_t pgid) {
  send(-static_cast<int32_t>(pgid));
}

}  // namespace ddp::launcher
