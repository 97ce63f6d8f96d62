#include "bench/scale/runner.h"

#include "models/gpt_config.h"
#include "runtime/error.h"
#include "runtime/unique_fd.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/fmt.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace ddp::scaling {
namespace {

using Clock = std::chrono::steady_clock;

// A child in scale's own process group (Ctrl-C reaches it too), stdin from
// /dev/null, stdout and stderr appended to files.
pid_t start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::string& stdout_path, const std::string& stderr_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  args.push_back(nullptr);
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int error = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  DDP_CHECK_T(Error, error == 0, "cannot start '{}': {}", argv[0], std::strerror(error));
  return pid;
}

// Waits for every pid until the deadline; the first failure (or the timeout)
// stops the others: SIGTERM, then SIGKILL after 5 s. Returns "" when all exited 0.
std::string wait_all(std::vector<pid_t> pids, Clock::time_point deadline) {
  std::string failure;
  Clock::time_point kill_at = Clock::time_point::max();
  while (!pids.empty()) {
    for (auto it = pids.begin(); it != pids.end();) {
      int status = 0;
      if (::waitpid(*it, &status, WNOHANG) != *it) {
        ++it;
        continue;
      }
      if (failure.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        failure = WIFEXITED(status)
                      ? fmt::format("pid {} exited {}", *it, WEXITSTATUS(status))
                      : fmt::format("pid {} died of signal {}", *it, WTERMSIG(status));
      }
      it = pids.erase(it);
    }
    const auto now = Clock::now();
    if (!pids.empty() && kill_at == Clock::time_point::max() &&
        (!failure.empty() || now > deadline)) {
      if (failure.empty()) failure = "timed out (--timeout)";
      for (pid_t p : pids) ::kill(p, SIGTERM);
      kill_at = now + std::chrono::seconds(5);
    }
    if (now > kill_at) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return failure;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string tail_lines(const std::string& text, size_t count) {
  std::deque<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (lines.size() > count) lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += "  | " + l + "\n";
  return out;
}

std::vector<std::string> environment_with(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('=') + 1);
    const bool replaced = std::any_of(overrides.begin(), overrides.end(),
                                      [&](const std::string& o) { return o.starts_with(key); });
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

int free_port() {
  const UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  DDP_CHECK_T(Error,
              fd && ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &length) == 0,
              "cannot find a free TCP port on 127.0.0.1: {}", std::strerror(errno));
  return ntohs(addr.sin_port);
}

double load_average() {
  double load = 0.0;
  std::ifstream("/proc/loadavg") >> load;
  return load;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string threads_env(const PointSpec& p, const char* name) {
  return fmt::format("{}={}", name, p.threads);
}

// The last line of `text` that holds "samples_per_s" (train: the last epoch).
std::string last_result_line(const std::string& text) {
  std::string found;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"samples_per_s\"") != std::string::npos) found = line;
  }
  return found;
}

Measurement run_ours(const PointSpec& p, const RunOptions& o, Measurement m) {
  const std::string metrics = o.work_dir + "/metrics.jsonl", log = o.work_dir + "/run.log";
  ::unlink(metrics.c_str());
  ::unlink(log.c_str());
  const auto argv = ours_command(p, o.programs, metrics);
  const auto env =
      environment_with({threads_env(p, "OMP_NUM_THREADS"), threads_env(p, "OPENBLAS_NUM_THREADS")});
  const std::string failure = wait_all({start(argv, env, log, log)}, Clock::now() + o.timeout);
  const std::string line = last_result_line(read_file(metrics));
  DDP_CHECK_T(Error, failure.empty() && !line.empty(), "{}: {}\n  $ {}\n{}", p.describe(),
              failure.empty() ? "no samples_per_s in the program's --metrics" : failure,
              fmt::join(argv, " "), tail_lines(read_file(log), 15));
  m.samples_per_s = json_number(line, "samples_per_s").value_or(0.0);
  m.step_ms = json_number(line, "step_ms").value_or(0.0);
  m.comm_exposed_ms = json_number(line, "comm_exposed_ms").value_or(0.0);
  m.tokens_per_s = json_number(line, "tokens_per_s").value_or(0.0);
  return m;
}

Measurement run_torch(const PointSpec& p, const RunOptions& o, Measurement m) {
  const std::string out = o.work_dir + "/rank0.out", log = o.work_dir + "/run.log";
  ::unlink(out.c_str());
  ::unlink(log.c_str());
  const auto argv = torch_command(p, o.programs);
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < p.world_size; ++rank) {
    const auto env =
        environment_with({fmt::format("RANK={}", rank), fmt::format("LOCAL_RANK={}", rank),
                          fmt::format("WORLD_SIZE={}", p.world_size),
                          fmt::format("LOCAL_WORLD_SIZE={}", p.world_size), "MASTER_ADDR=127.0.0.1",
                          fmt::format("MASTER_PORT={}", port), threads_env(p, "OMP_NUM_THREADS"),
                          threads_env(p, "OPENBLAS_NUM_THREADS")});
    pids.push_back(start(argv, env, rank == 0 ? out : log, log));
  }
  const std::string failure = wait_all(pids, Clock::now() + o.timeout);
  const std::string line = last_result_line(read_file(out));
  DDP_CHECK_T(Error, failure.empty() && !line.empty(), "{}: {}\n  $ {} (x{} ranks)\n{}",
              p.describe(), failure.empty() ? "no samples_per_s from rank 0" : failure,
              fmt::join(argv, " "), p.world_size, tail_lines(read_file(log), 15));
  m.samples_per_s = json_number(line, "samples_per_s").value_or(0.0);
  m.step_ms = json_number(line, "step_ms").value_or(0.0);
  return m;
}

}  // namespace

int64_t synthetic_size(const PointSpec& p) {
  return std::max<int64_t>(10000, static_cast<int64_t>(p.steps) * p.global_batch());
}

std::vector<std::string> ours_command(const PointSpec& p, const Programs& programs,
                                      const std::string& metrics_path) {
  std::vector<std::string> argv = {
      programs.ddprun, "--standalone", "-n", std::to_string(p.world_size), "--grace-period", "5"};
  if (p.backend != "auto") argv.insert(argv.end(), {"--backend", p.backend});
  if (!programs.program.empty()) {  // Note [program contract] in runner.h
    argv.push_back(programs.program);
    argv.insert(argv.end(), programs.program_args.begin(), programs.program_args.end());
    argv.insert(argv.end(), {"--batch-size", std::to_string(p.batch_per_rank), "--epochs", "2",
                             "--max-steps", std::to_string(p.steps), "--metrics", metrics_path});
    return argv;
  }
  argv.insert(argv.end(), {programs.train,
                           "--model",
                           p.model,
                           "--data",
                           programs.data,
                           "--batch-size",
                           std::to_string(p.batch_per_rank),
                           "--epochs",
                           "2",
                           "--max-steps",
                           std::to_string(p.steps),
                           "--lr-schedule",
                           "constant",
                           "--device",
                           programs.device,
                           "--bucket-cap-mb",
                           fmt::format("{}", p.bucket_cap_mb),
                           "--quiet",
                           "--metrics",
                           metrics_path});
  if (models::is_gpt_model(p.model)) {
    // Sequences of the model's context from the text (--data synthetic: the
    // synthetic token stream); one validation batch per evaluation, which the
    // rates leave out anyway.
    argv.insert(argv.end(), {"--eval-batches", "1"});
  } else if (programs.data == "synthetic") {
    argv.insert(argv.end(), {"--synthetic-size", std::to_string(synthetic_size(p))});
  }
  return argv;
}

std::vector<std::string> torch_command(const PointSpec& p, const Programs& programs) {
  std::vector<std::string> argv = {programs.python,   programs.torch_script,
                                   "--model",         p.model,
                                   "--data",          programs.data,
                                   "--batch",         std::to_string(p.batch_per_rank),
                                   "--steps",         std::to_string(p.steps),
                                   "--warmup",        std::to_string(p.steps),
                                   "--threads",       std::to_string(p.threads),
                                   "--bucket-cap-mb", fmt::format("{}", p.bucket_cap_mb)};
  if (programs.data == "synthetic") {
    argv.insert(argv.end(), {"--synthetic-size", std::to_string(synthetic_size(p))});
  }
  return argv;
}

Measurement run_point(const PointSpec& p, const RunOptions& options) {
  Measurement m;
  m.spec = p;
  m.load1 = load_average();
  m = p.impl == "torch" ? run_torch(p, options, std::move(m)) : run_ours(p, options, std::move(m));
  m.timestamp = utc_now();
  return m;
}

}  // namespace ddp::scaling
