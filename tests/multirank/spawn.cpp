#include "tests/multirank/spawn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "runtime/fmt.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <stdexcept>
#include <thread>

namespace ddp::test {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  pid_t pid = -1;
  std::FILE* capture = nullptr;  // the child's stderr, an unlinked temporary file
  bool running = false;
  RankResult result;
};

void set_env(const char* name, const std::string& value) {
  setenv(name, value.c_str(), 1);
}

// In the child: never returns.
[[noreturn]] void run_child(int rank, int n, const std::function<int(int, int)>& body,
                            const SpawnOptions& options, const std::string& run_id, int port,
                            std::FILE* capture, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test process
  if (getppid() != parent) _exit(111);
  dup2(fileno(capture), STDERR_FILENO);
  set_env("RANK", std::to_string(rank));
  set_env("WORLD_SIZE", std::to_string(n));
  set_env("LOCAL_RANK", std::to_string(rank));
  set_env("LOCAL_WORLD_SIZE", std::to_string(n));
  set_env("GROUP_RANK", "0");
  set_env("MASTER_ADDR", "127.0.0.1");
  set_env("MASTER_PORT", std::to_string(port));
  set_env("DDPRUN_RUN_ID", run_id);
  for (const auto& [name, value] : options.env) set_env(name.c_str(), value);
  int code = 1;
  try {
    code = body(rank, n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, e.what());
  } catch (...) {
    std::fprintf(stderr, "[rank %d] error: unknown exception\n", rank);
  }
  std::fflush(nullptr);
  _exit(code);  // no atexit handlers or static destructors of the test process
}

void record(Child& child, int status) {
  child.running = false;
  if (WIFEXITED(status)) child.result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) child.result.signal = WTERMSIG(status);
}

void kill_and_reap(Child& child) {
  kill(child.pid, SIGKILL);
  int status = 0;
  waitpid(child.pid, &status, 0);
  record(child, status);
  child.result.killed_by_harness = true;
}

bool all_exited(const std::vector<Child>& children, const std::vector<int>& ranks) {
  if (ranks.empty()) return false;
  for (int r : ranks) {
    if (children.at(static_cast<size_t>(r)).running) return false;
  }
  return true;
}

// Reaps children as they exit (promptly: peers judge liveness by their pids).
void wait_children(std::vector<Child>& children, const SpawnOptions& options) {
  const auto deadline = Clock::now() + options.timeout;
  for (;;) {
    bool any = false;
    for (Child& child : children) {
      int status = 0;
      if (child.running && waitpid(child.pid, &status, WNOHANG) == child.pid) record(child, status);
      any = any || child.running;
    }
    if (!any) return;
    if (Clock::now() >= deadline || all_exited(children, options.wait_for)) {
      for (Child& child : children) {
        if (child.running) kill_and_reap(child);
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string read_all(std::FILE* file) {
  std::string text;
  std::rewind(file);
  char buffer[4096];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, got);
  return text;
}

}  // namespace

std::string RankResult::describe() const {
  std::string status = signal != 0 ? fmt::format("killed by signal {}", signal)
                                   : fmt::format("exit code {}", exit_code);
  if (killed_by_harness) status += " (killed by spawn_ranks: timeout or wait_for)";
  return fmt::format("rank {}: {}\n--- stderr of rank {} ---\n{}", rank, status, rank, stderr_text);
}

std::vector<RankResult> spawn_ranks(int n, const std::function<int(int, int)>& body,
                                    const SpawnOptions& options) {
  const std::string run_id = options.run_id.empty() ? unique_run_id() : options.run_id;
  const int port = free_port();
  const pid_t parent = getpid();
  std::vector<Child> children(static_cast<size_t>(n));
  std::fflush(nullptr);  // or the children flush the parent's buffered output again
  for (int rank = 0; rank < n; ++rank) {
    Child& child = children[static_cast<size_t>(rank)];
    child.result.rank = rank;
    child.capture = std::tmpfile();
    if (child.capture == nullptr) throw std::runtime_error("spawn_ranks: tmpfile() failed");
    child.pid = fork();
    if (child.pid < 0) throw std::runtime_error("spawn_ranks: fork() failed");
    if (child.pid == 0) run_child(rank, n, body, options, run_id, port, child.capture, parent);
    child.running = true;
  }
  wait_children(children, options);
  std::vector<RankResult> results;
  for (Child& child : children) {
    child.result.stderr_text = read_all(child.capture);
    std::fclose(child.capture);
    results.push_back(std::move(child.result));
  }
  return results;
}

std::string unique_run_id() {
  static std::atomic<int> counter{0};
  static const uint32_t salt = std::random_device{}();
  return fmt::format("t{}-{}-{:08x}", getpid(), counter++, salt);
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_port: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) throw std::runtime_error("free_port: bind() to 127.0.0.1:0 failed");
  return ntohs(addr.sin_port);
}

void inject_fault(Fault fault) {
  raise(fault == Fault::kill ? SIGKILL : SIGSTOP);
}

}  // namespace ddp::test
