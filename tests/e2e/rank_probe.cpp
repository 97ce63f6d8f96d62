// rank_probe: the program the ddprun e2e tests launch. Prints the launch
// environment, then behaves as told:
//
//   rank_probe [--sleep S] [--exit-code C] [--signal SIG] [--on-rank R]
//              [--fail-after S] [--fail-until-restart K] [--ignore-sigterm]
//              [--child] [--lines N] [--stderr-lines N] [--marker TEXT]
//
//   --sleep S               every rank sleeps S seconds before exiting (default 0)
//   --exit-code C           exit with C instead of 0       } only on the rank of
//   --signal SIG            raise SIG (a number or a name) } --on-rank R (default
//   --fail-after S          ...after S seconds (default: at } every rank), and
//                           once with --on-rank, else after } only while
//                           --sleep)                        } DDPRUN_RESTART_COUNT
//   --fail-until-restart K                                  } < K (default: always)
//   --ignore-sigterm        ignore SIGTERM (ddprun must escalate to SIGKILL)
//   --child                 fork a child that sleeps as long (same command line,
//                           so `pgrep -f MARKER` finds it too)
//   --lines N               N long lines on stdout, each written in pieces
//   --stderr-lines N        "err line I" for I in 1..N on stderr
//   --marker TEXT           ignored: a unique word for pgrep
//   --allreduce             init_process_group() (the real bootstrap, through
//                           ddprun's store) and all_reduce(rank + 1): prints
//                           "allreduce=<sum> backend=<name>", exits 1 unless
//                           the sum is W(W+1)/2
//   --allreduce-stall S     with --allreduce: the rank of --on-rank (every rank
//                           without) sleeps S seconds between making the
//                           process group and the all_reduce (it has a flight
//                           recorder but no collective yet)
//
// Every output line is flushed at once (a pipe would otherwise buffer it).
#include "collectives/bootstrap.h"
#include "runtime/tensor.h"

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>

namespace {

struct Probe {
  double sleep_s = 0;
  double fail_after_s = -1;
  int exit_code = 0;
  int signal = 0;
  int on_rank = -1;
  int fail_until_restart = -1;
  bool ignore_sigterm = false;
  bool child = false;
  int lines = 0;
  int stderr_lines = 0;
  bool allreduce = false;
  double allreduce_stall_s = 0;
};

int parse_signal(const char* text) {
  if (std::isdigit(static_cast<unsigned char>(text[0]))) return std::atoi(text);
  std::string name = text;
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  for (int s = 1; s < NSIG; ++s) {
    const char* abbrev = sigabbrev_np(s);
    if (abbrev != nullptr && name == abbrev) return s;
  }
  std::fprintf(stderr, "rank_probe: unknown signal '%s'\n", text);
  std::exit(2);
}

Probe parse(int argc, char** argv) {
  Probe p;
  using Setter = std::function<void(Probe&, const char*)>;
  const std::map<std::string, Setter> valued = {
      {"--sleep", [](Probe& q, const char* v) { q.sleep_s = std::atof(v); }},
      {"--fail-after", [](Probe& q, const char* v) { q.fail_after_s = std::atof(v); }},
      {"--exit-code", [](Probe& q, const char* v) { q.exit_code = std::atoi(v); }},
      {"--signal", [](Probe& q, const char* v) { q.signal = parse_signal(v); }},
      {"--on-rank", [](Probe& q, const char* v) { q.on_rank = std::atoi(v); }},
      {"--fail-until-restart",
       [](Probe& q, const char* v) { q.fail_until_restart = std::atoi(v); }},
      {"--lines", [](Probe& q, const char* v) { q.lines = std::atoi(v); }},
      {"--stderr-lines", [](Probe& q, const char* v) { q.stderr_lines = std::atoi(v); }},
      {"--marker", [](Probe&, const char*) {}},
      {"--allreduce-stall", [](Probe& q, const char* v) { q.allreduce_stall_s = std::atof(v); }},
  };
  const std::map<std::string, bool Probe::*> switches = {
      {"--ignore-sigterm", &Probe::ignore_sigterm},
      {"--child", &Probe::child},
      {"--allreduce", &Probe::allreduce},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (auto s = switches.find(a); s != switches.end()) {
      p.*(s->second) = true;
    } else if (auto v = valued.find(a); v != valued.end() && i + 1 < argc) {
      v->second(p, argv[++i]);
    } else {
      std::fprintf(stderr, "rank_probe: unknown option '%s' (or it needs a value)\n", a.c_str());
      std::exit(2);
    }
  }
  return p;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

void print_environment() {
  const char* const names[] = {"RANK",
                               "LOCAL_RANK",
                               "WORLD_SIZE",
                               "LOCAL_WORLD_SIZE",
                               "GROUP_RANK",
                               "MASTER_ADDR",
                               "MASTER_PORT",
                               "DDPRUN_RESTART_COUNT",
                               "DDPRUN_RUN_ID",
                               "DDPRUN_STORE",
                               "DDPRUN_STORE_ADDR",
                               "GROUP_WORLD_SIZE",
                               "ROLE_NAME",
                               "ROLE_RANK",
                               "ROLE_WORLD_SIZE",
                               "TORCHELASTIC_RESTART_COUNT",
                               "TORCHELASTIC_MAX_RESTARTS",
                               "TORCHELASTIC_RUN_ID",
                               "TORCHELASTIC_USE_AGENT_STORE",
                               "DDP_STORE_SECRET",
                               "DDP_BACKEND",
                               "OMP_NUM_THREADS",
                               "OPENBLAS_NUM_THREADS"};
  for (const char* name : names) {
    const char* v = std::getenv(name);
    std::printf("%s=%s\n", name, v != nullptr ? v : "<unset>");
  }
  std::printf("pid=%d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
}

// Each line goes out in three writes with pauses, so that a launcher that does
// not reassemble lines would interleave them with other ranks' pieces.
void print_lines(int rank, int lines) {
  const std::string body(200, static_cast<char>('a' + rank % 26));
  for (int i = 0; i < lines; ++i) {
    const std::string line = "line " + std::to_string(rank) + " " + std::to_string(i) + " " + body;
    const size_t third = line.size() / 3;
    (void)!write(STDOUT_FILENO, line.data(), third);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    (void)!write(STDOUT_FILENO, line.data() + third, third);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    (void)!write(STDOUT_FILENO, line.data() + 2 * third, line.size() - 2 * third);
    (void)!write(STDOUT_FILENO, "\n", 1);
  }
}

void sleep_s(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

int check_allreduce(const Probe& p, bool chosen) {
  try {
    ddp::ProcessGroup pg = ddp::init_process_group();
    if (chosen) sleep_s(p.allreduce_stall_s);
    const int w = pg.comm->size();
    ddp::Tensor t = ddp::full({1}, pg.comm->rank() + 1.0, {.device = pg.device});
    pg.comm->all_reduce(t)->wait();
    const double sum = t.item_double();
    std::printf("allreduce=%g backend=%s\n", sum, pg.comm->backend().c_str());
    std::fflush(stdout);
    return sum == w * (w + 1) / 2.0 ? 0 : 1;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "rank_probe: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Probe p = parse(argc, argv);
  if (p.ignore_sigterm) ::signal(SIGTERM, SIG_IGN);
  const int rank = env_int("RANK", 0);
  print_environment();
  if (p.allreduce && check_allreduce(p, p.on_rank < 0 || p.on_rank == rank) != 0) return 1;
  print_lines(rank, p.lines);
  for (int i = 1; i <= p.stderr_lines; ++i) std::fprintf(stderr, "err line %d\n", i);
  std::fflush(stderr);
  if (p.child && fork() == 0) {
    sleep_s(p.sleep_s);
    _exit(0);
  }
  const bool chosen = p.on_rank < 0 || p.on_rank == rank;
  const bool failing = chosen && (p.fail_until_restart < 0 ||
                                  env_int("DDPRUN_RESTART_COUNT", 0) < p.fail_until_restart);
  if (!failing) {
    sleep_s(p.sleep_s);
    return 0;
  }
  // The chosen rank of --on-rank fails at once (others sleep to be stopped by ddprun).
  sleep_s(p.fail_after_s >= 0 ? p.fail_after_s : (p.on_rank >= 0 ? 0 : p.sleep_s));
  if (p.exit_code != 0 || p.signal != 0) {
    std::fprintf(stderr, "rank_probe: rank %d failing on purpose\n", rank);
    std::fflush(stderr);
  }
  if (p.signal != 0) {
    ::signal(p.signal, SIG_DFL);
    ::raise(p.signal);
  }
  return p.exit_code;
}
