// Processes and signals of the agent: file descriptors, spawning one rank,
// reaping it, stopping its process group, and turning signals into bytes on a
// pipe that the agent's poll loop watches (the self-pipe trick).
//
// Note [no orphans]
// Every rank is the leader of its own process group, so a signal to -pgid
// reaches whatever the rank started too. The child sets PR_SET_PDEATHSIG to
// SIGKILL before exec (and exits if ddprun already died in between), so ranks
// die with ddprun even when ddprun is SIGKILLed. When a rank exits, whatever is
// left in its group is SIGKILLed before the rank is reaped (the pgid cannot be
// reused while the zombie exists). When ddprun is SIGKILLed, its watchdog
// (launcher/watchdog.h) SIGKILLs the groups, so what the ranks started dies
// too. Grandchildren that leave the group (setsid) are out of reach: only
// cgroups could catch those.
#pragma once

#include <sys/types.h>

#include "runtime/error.h"
#include "runtime/unique_fd.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launcher {

using Fd = ::ddp::UniqueFd;

struct Pipe {
  Fd read;   // non-blocking, close-on-exec
  Fd write;  // blocking, close-on-exec (dup2 into the child clears that)
};
Pipe make_pipe();

// ddprun's own message: "ddprun: TEXT\n" on stderr, in one write (never
// interleaved with the ranks' lines, which the agent writes whole too), through
// the console queue.
void say(const std::string& text);

// PROGRAM exists but exec failed: exit 126, or 127 when its #! interpreter is
// missing, as a shell says (the message names the cause and the fix).
class ExecError : public ::ddp::Error {
 public:
  ExecError(const std::string& what, int exit_code) : Error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Why `path` could not be executed (errno `error`), as a shell explains it.
std::string exec_failure(const std::string& path, int error);

// Note [a console that does not read]: the agent's one thread watches every rank,
// the signals and the store; a blocking write to a terminal or pipe that is not
// read (`ddprun ... | less` left unscrolled, a stopped reader, tee on slow
// storage) would stop all of it: a rank's failure, SIGTERM and the hang and stop
// deadlines would wait for the reader. So the agent's console output goes
// through a queue per descriptor (stdout, stderr) that a writer thread of its own
// empties: console_write() never blocks, and ddprun's messages on stderr are not
// held behind a stdout nobody reads (the order of lines between the two may
// differ by a little from the order they were read in).
// While more than kConsoleBacklog bytes wait, the agent stops reading the ranks'
// pipes, so a rank that prints blocks in its own write, as it would on a slow
// terminal of its own, and nothing is dropped or held in memory without bound.
// Whatever is queued is written before ddprun exits (console_flush()).
inline constexpr size_t kConsoleBacklog = 1 << 20;
// Queues `text` for fd 1 or 2 and returns at once.
void console_write(int fd, std::string_view text);
// Bytes queued and not yet written.
size_t console_backlog();
// Waits until every queued byte is written or its descriptor failed (EPIPE).
void console_flush();

// Writes all of `data` (retrying short writes and EINTR); false when the
// descriptor is gone (EPIPE: the console was closed), which callers ignore.
bool write_all(int fd, const char* data, size_t bytes);

struct SpawnRequest {
  std::string path;               // the resolved executable
  std::vector<std::string> argv;  // argv[0] as the user typed it
  std::vector<std::string> env;   // "KEY=VALUE", the whole environment
  int stdout_fd = -1;             // becomes the child's fd 1
  int stderr_fd = -1;             // becomes the child's fd 2
};

// fork + exec with Note [no orphans]; stdin is /dev/null. Returns the pid, which
// is also the process group id. Throws ddp::Error naming the program when exec
// fails (the child reports errno through a close-on-exec pipe).
pid_t spawn(const SpawnRequest& request);

// kill(-pgid, sig); a group that is already gone is not an error.
void signal_group(pid_t pgid, int sig);

// Whether the "SigCgt:" mask of a /proc/<pid>/status text has `sig` (the process
// installed a handler for it); false without the line.
bool catches_signal_in(std::string_view proc_status, int sig);
// The same for the live process `pid` (false when it is gone or unreadable).
bool catches_signal(pid_t pid, int sig);

// When `pid` has exited: SIGKILLs what is left of its process group, reaps it,
// and returns its wait status. nullopt while it runs. Never blocks.
std::optional<int> try_reap(pid_t pid);

// A change of a running rank's job-control state.
struct StopChange {
  bool stopped = false;  // false: continued
  int signal = 0;        // what stopped it (SIGSTOP, SIGTSTP, ...), with stopped
};
// The latest stop or continue of `pid` since the last call (waitid with
// WSTOPPED | WCONTINUED, which consumes the report), or nullopt. Never blocks,
// never reaps.
std::optional<StopChange> try_stop_change(pid_t pid);

// "exit code 3", "killed by SIGKILL", "SIGSEGV (core dumped)".
std::string describe_status(int wait_status);
// The shell's convention: the exit code, or 128 + the signal number.
int exit_code_of(int wait_status);
// "SIGTERM", or "signal 42".
std::string signal_name(int sig);

// Installs handlers for SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGCHLD (also when a
// child stops or continues) that write the signal number to a pipe, and ignores
// SIGPIPE (a closed console must not kill the agent). SIGUSR1 stops nothing: it asks
// for the ranks' flight recorder dumps (Note [SIGUSR1 to ddprun] in group.cpp). One
// per process.
class SignalPipe {
 public:
  SignalPipe();
  ~SignalPipe();  // restores the previous handlers
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_.get(); }
  // The signals that arrived since the last call, in order.
  std::vector<int> drain();
  // The first of SIGINT/SIGTERM/SIGHUP received, or 0: ddprun is being stopped
  // and never restarts after that. Safe to poll from any loop (the rendezvous
  // waits use it).
  static int stop_signal();

 private:
  Fd read_;
  Fd write_;
};

}  // namespace ddp::launcher
