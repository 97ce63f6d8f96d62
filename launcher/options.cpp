#include "launcher/options.h"

#include "launcher/node_address.h"

#include "runtime/error.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace ddp::launcher {

const char* const kDdprunUsage = R"(usage: ddprun [options] PROGRAM [ARGS...]

Starts PROGRAM once per rank with the environment of torchrun (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...), hosts
the rendezvous store, prefixes and forwards every rank's output, and stops the
whole group when one rank fails. PROGRAM is a path, else a program next to
ddprun, else found on PATH; a .py file runs under python3 -u. Options end at
PROGRAM (or at "--").

ranks:
  -n, --nproc-per-node N|gpu|auto
                        ranks on this node (default 1); gpu: one per visible
                        GPU (an error without one); auto: one per GPU, else 1
  --nnodes N            nodes taking part (default 1); start one ddprun per node
                        (torchrun's N:N is N; an elastic MIN:MAX is refused)
  --node-rank R         this node's rank, 0..N-1 (default 0); node 0 hosts the
                        store, the others connect to it
  --backend NAME        sets DDP_BACKEND for the ranks:
                        auto|local|shm|gloo|nccl (mpi needs mpirun, not ddprun)
rendezvous:
  --master-addr HOST    MASTER_ADDR: node 0's address (default 127.0.0.1)
  --master-port PORT    MASTER_PORT (default 29500; 29501 when --rdzv-port or
                        --rdzv-endpoint names 29500), left free for rank 0's
                        own store (a PyTorch program's init_process_group)
  --standalone          one node; MASTER_PORT is a free port chosen for you
  --rdzv-port PORT      with --nnodes > 1: the port of the agents' store on
                        node 0 (default: --master-port + 1)
  --rdzv-endpoint HOST:PORT
                        with --nnodes > 1: the agents' store (torchrun's
                        spelling); HOST is also MASTER_ADDR unless given;
                        HOST:0 on one node: --standalone's free ports
  --rdzv-bind ADDR      the address node 0's store binds (default: the one
                        the store's HOST resolves to; 0.0.0.0: every interface)
  --rdzv-backup HOST:PORT
                        with --nnodes > 1 and --on-failure continue: node 1's
                        ddprun hosts a backup of the agents' store at HOST:PORT
                        (HOST: an address of node 1) and keeps the membership
                        when node 0 is lost; pass it to every node
                        (docs/elastic.md)
  --rdzv-timeout S      seconds the agents wait for each other (default 300)
  --store-secret-file FILE
                        DDP_STORE_SECRET from FILE (mode 0600 or 0400);
                        with --nnodes > 1 this or DDP_STORE_SECRET in the
                        environment is required
failures:
  --max-restarts K      restart the whole group up to K times when a rank
                        fails (default 0); ranks see DDPRUN_RESTART_COUNT
                        and TORCHELASTIC_RESTART_COUNT. With --on-failure
                        continue: start up to K replacement ranks, each
                        joining the group at a step boundary
  --on-failure restart|continue|stop
                        what a rank that fails (dies, or is stopped or hung
                        past its timeout) does to the group: restart it whole
                        (the default, up to --max-restarts times), stop the
                        job, or continue: the ranks left regroup in memory and
                        train on without it (shm, gloo or nccl; a lost node
                        leaves with its ranks; docs/elastic.md)
  --min-ranks K         with --on-failure continue: end the job (with the
                        failed rank's exit status, naming --min-ranks) when
                        fewer than K ranks would be left; those ranks first
                        write --save where the group stands (default 1)
  --node-timeout S      with --nnodes > 1: node 0 takes a node whose ddprun
                        sent no heartbeat for S seconds out of the group with
                        its ranks (--on-failure continue), or ends the attempt
                        (default 15; an agent that exits or dies is seen at once)
  --grace-period S      seconds between SIGTERM and SIGKILL when the group is
                        stopped (default 10)
  --stopped-timeout S   a rank stopped (SIGSTOP, SIGTSTP) for S seconds ends
                        the job, and is blamed (default 30; 0: never)
  --hang-timeout S      no rank made progress for S seconds while one waits in
                        a collective: dump every rank's flight recorder, print
                        the diagnosis and end the job with exit 124 (default:
                        the ranks' collective timeout + 60, i.e. 360 with
                        DDP_TIMEOUT_S unset, so the ranks' own timeout fires
                        first; 0: never)
program:
  -m, --module          PROGRAM is a Python module: each rank runs
                        python3 -u -m PROGRAM ARGS (as torchrun -m)
  --no-python           a .py PROGRAM is executed itself (its #! line), not
                        by python3 (as torchrun --no-python)
output:
  --log-dir DIR         write DIR/rank_<R>.out and DIR/rank_<R>.err instead of
                        the console (and flight recorder dumps there)
  --tee                 with --log-dir: the console as well (torchrun's
                        --tee 3; --tee 0 is off)
  --quiet               only rank 0 on the console (the others still go to
                        --log-dir)
  --no-prefix           no "[rank N] " before each line
  --trace DIR           record every rank's timeline (DDP_TRACE=DIR for the
                        ranks) and merge the ranks' files into DIR/trace.json
                        at the end, success or failure; open it in Perfetto
                        (ui.perfetto.dev) or chrome://tracing
  --version             ddprun's version
  -h, --help            this text

subcommands:
  ddprun analyze DIR    print the hang diagnosis and the straggler report from
                        the flight recorder dumps (flight_rank_<R>.json) in DIR:
                        those ddprun wrote, or those ranks wrote on a collective
                        timeout or SIGUSR1 (DDP_FLIGHT_DIR) under mpirun/srun
  ddprun trace-merge DIR [--output FILE] [--run-id ID] [--restart K]
                        merge the rank files in DIR into DIR/trace.json (for
                        mpirun/srun runs with DDP_TRACE=DIR, files copied
                        from several nodes, or a restarted group's attempt K)

Underscore spellings (--nproc_per_node, --master_addr, ...) are accepted.
Exit status: 0 when every rank succeeded; else the first failing rank's exit
code, or 128+N when it died of signal N (or ddprun got signal N); 1 when ddprun
itself failed (rendezvous, port in use); 2 for bad options; 128+SIGSTOP (147)
when a rank stayed stopped past --stopped-timeout; 124 when the job hung past
--hang-timeout, or a collective timed out waiting for a stalled rank; 126
when PROGRAM is not executable; 127 when it is not found.
Flight recorder dumps and the diagnosis are printed in the failure summary;
the straggler report at the end of every multi-rank run.
Docs: docs/ddprun.md, docs/observability.md.
)";

namespace {

constexpr const char* kBackendNames[] = {"auto", "local", "shm", "gloo", "nccl"};

template <typename T>
T parse_number(const std::string& flag, const std::string& text, const char* expected) {
  T value{};
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, value);
  DDP_CHECK(r.ec != std::errc::result_out_of_range || r.ptr != end, "{} '{}': out of range", flag,
            text);
  bool ok = r.ec == std::errc() && r.ptr == end;
  if constexpr (std::is_floating_point_v<T>) ok = ok && std::isfinite(value);
  DDP_CHECK(ok, "{} '{}': expected {}", flag, text, expected);
  return value;
}

int parse_int(const std::string& flag, const std::string& text) {
  return parse_number<int>(flag, text, "a whole number");
}

// Durations are held in milliseconds (int64): a bound far past any job keeps
// them from overflowing into a negative, or zero ("never"), deadline.
constexpr double kMaxSeconds = 1e9;  // about 31 years
// Bounds on the job's size, far past today's largest jobs, so that counts stay
// ints and the rendezvous' per-node keys a bounded list.
constexpr int kMaxNodes = 65536;
constexpr int64_t kMaxWorldSize = int64_t{1} << 22;

double parse_seconds(const std::string& flag, const std::string& text) {
  const double s = parse_number<double>(flag, text, "a number of seconds");
  DDP_CHECK(s <= kMaxSeconds, "{} {}: at most {:g} seconds (about 31 years)", flag, text,
            kMaxSeconds);
  return s;
}

// FLAG's HOST:PORT; `what` follows "expected HOST:PORT" in the error.
void parse_host_port(const std::string& flag, const std::string& text, const char* what,
                     std::string& host, int& port) {
  const auto colon = text.rfind(':');
  DDP_CHECK(colon != std::string::npos && colon > 0, "{} '{}': expected HOST:PORT{}", flag, text,
            what);
  host = text.substr(0, colon);
  // "[::1]:29400": the host is "::1"; the brackets are endpoint syntax, added
  // back wherever an endpoint is written (store_detail::endpoint).
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  port = parse_int(flag + " port", text.substr(colon + 1));
}

void parse_endpoint(LaunchOptions& o, const std::string& text) {
  parse_host_port("--rdzv-endpoint", text, "", o.rdzv_host, o.rdzv_port);
  o.rdzv_free_port = o.rdzv_port == 0;  // torchrun's HOST:0 (parse_ddprun_args)
}

void parse_backup(LaunchOptions& o, const std::string& text) {
  parse_host_port("--rdzv-backup", text, " (an address of node 1 and a free port there)",
                  o.rdzv_backup_host, o.rdzv_backup_port);
}

// N, or torchrun's MIN:MAX where MIN = MAX (an elastic range is not ddprun's).
int parse_nnodes(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return parse_int("--nnodes", text);
  const int low = parse_int("--nnodes", text.substr(0, colon));
  const int high = parse_int("--nnodes", text.substr(colon + 1));
  DDP_CHECK(low == high,
            "--nnodes {}: torchrun's elastic MIN:MAX range is not ddprun's; pass the count of "
            "nodes (--nnodes {}); to go on with fewer ranks after a failure, use --on-failure "
            "continue with --min-ranks (docs/elastic.md)",
            text, high);
  return high;
}

// torchrun's --tee takes 0..3 (or per-rank maps); ddprun's copies both streams.
bool looks_like_tee_value(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789:,") == std::string::npos;
}
bool parse_tee(const std::string& text) {
  DDP_CHECK(text == "0" || text == "3",
            "--tee {}: ddprun's --tee copies both stdout and stderr to the console (torchrun's "
            "--tee 3); stdout or stderr alone (1, 2) and per-rank maps are not supported",
            text);
  return text == "3";
}

using Setter = std::function<void(LaunchOptions&, const std::string&)>;

const std::map<std::string, Setter>& valued_flags() {
  static const std::map<std::string, Setter> table = {
      {"--nproc-per-node", [](auto& o, auto& v) { o.nproc_per_node = v; }},
      {"--nnodes", [](auto& o, auto& v) { o.nnodes = parse_nnodes(v); }},
      {"--node-rank", [](auto& o, auto& v) { o.node_rank = parse_int("--node-rank", v); }},
      {"--master-addr", [](auto& o, auto& v) { o.master_addr = v; }},
      {"--rdzv-port", [](auto& o, auto& v) { o.rdzv_port = parse_int("--rdzv-port", v); }},
      {"--rdzv-bind", [](auto& o, auto& v) { o.rdzv_bind = v; }},
      {"--store-secret-file", [](auto& o, auto& v) { o.store_secret_file = v; }},
      {"--stopped-timeout",
       [](auto& o, auto& v) { o.stopped_timeout_s = parse_seconds("--stopped-timeout", v); }},
      {"--hang-timeout",
       [](auto& o, auto& v) { o.hang_timeout_s = parse_seconds("--hang-timeout", v); }},
      {"--master-port", [](auto& o, auto& v) { o.master_port = parse_int("--master-port", v); }},
      {"--rdzv-endpoint", [](auto& o, auto& v) { parse_endpoint(o, v); }},
      {"--rdzv-backup", [](auto& o, auto& v) { parse_backup(o, v); }},
      {"--backend", [](auto& o, auto& v) { o.backend = v; }},
      {"--max-restarts", [](auto& o, auto& v) { o.max_restarts = parse_int("--max-restarts", v); }},
      {"--on-failure", [](auto& o, auto& v) { o.on_failure = v; }},
      {"--min-ranks",
       [](auto& o, auto& v) {
         o.min_ranks = parse_int("--min-ranks", v);
         DDP_CHECK(o.min_ranks >= 1, "--min-ranks {}: must be at least 1", v);
       }},
      {"--node-timeout",
       [](auto& o, auto& v) {
         o.node_timeout_s = parse_seconds("--node-timeout", v);
         o.node_timeout_given = true;
       }},
      {"--log-dir", [](auto& o, auto& v) { o.log_dir = v; }},
      {"--trace",
       [](auto& o, auto& v) {
         DDP_CHECK(!v.empty(), "--trace '': expected a directory for the trace files");
         o.trace_dir = v;
       }},
      {"--grace-period",
       [](auto& o, auto& v) { o.grace_period_s = parse_seconds("--grace-period", v); }},
      {"--rdzv-timeout",
       [](auto& o, auto& v) { o.rdzv_timeout_s = parse_seconds("--rdzv-timeout", v); }},
  };
  return table;
}

bool* switch_flag(LaunchOptions& o, const std::string& name) {
  if (name == "--standalone") return &o.standalone;
  if (name == "--tee") return &o.tee;
  if (name == "--quiet") return &o.quiet;
  if (name == "-m" || name == "--module") return &o.module;
  if (name == "--no-python") return &o.no_python;
  return nullptr;
}

// torchrun options that ddprun does not have: named in the error, so a user
// coming from torchrun learns it is a deliberate gap, not a typo.
bool is_torchrun_only(const std::string& name) {
  static const char* const kNames[] = {
      "--rdzv-backend", "--rdzv-id",    "--rdzv-conf",         "--monitor-interval",
      "--role",         "--redirects",  "--local-addr",        "--run-path",
      "--start-method", "--logs-specs", "--local-ranks-filter"};
  return std::any_of(std::begin(kNames), std::end(kNames),
                     [&](const char* n) { return name == n; });
}

void validate_rendezvous(const LaunchOptions& o) {
  DDP_CHECK(o.master_port >= 1 && o.master_port <= 65535,
            "--master-port {}: must be a TCP port in 1..65535 (or use --standalone for a free one)",
            o.master_port);
  DDP_CHECK(!o.master_addr.empty(), "--master-addr: must not be empty");
  DDP_CHECK(!o.standalone || o.nnodes == 1, "--standalone is for one node, not --nnodes {}",
            o.nnodes);
  if (o.nnodes == 1) return;  // the agents' store is on a free loopback port
  const int port = rdzv_store_port(o);
  DDP_CHECK(port >= 1 && port <= 65535,
            "the agents' store port {}: must be a TCP port in 1..65535 "
            "(--rdzv-port, --rdzv-endpoint, or --master-port + 1)",
            port);
  // Whatever the hosts: rank 0 of a PyTorch program binds MASTER_PORT on every
  // interface of node 0, where the agents' store is too.
  DDP_CHECK(port != o.master_port,
            "--rdzv-port (or --rdzv-endpoint's port) {} and --master-port {} are the same port: "
            "rank 0 of a PyTorch program hosts its own store on MASTER_PORT on every interface of "
            "node 0, where the agents' store is too; pass another --rdzv-port or --master-port",
            port, o.master_port);
}

// Note [master port follows the rendezvous port]
// torchrun scripts for SLURM pass `--rdzv-endpoint $HEAD:29500`, the port that
// is also --master-port's default; the two stores cannot share it (Note [two
// stores]). When --master-port was not given, MASTER_PORT moves to the next
// port, 29501, rather than refusing a common script; given explicitly, the
// clash is the user's to resolve and is an error.
void move_default_master_port(LaunchOptions& o) {
  if (o.nnodes > 1 && o.rdzv_port == o.master_port) o.master_port = o.rdzv_port + 1;
}

// Note [elastic membership] in collectives/elastic.h; docs/elastic.md.
void validate_on_failure(const LaunchOptions& o) {
  const std::string& f = o.on_failure;
  DDP_CHECK(f == "restart" || f == "continue" || f == "stop",
            "--on-failure {}: expected restart (the whole group, up to --max-restarts times), "
            "continue (the ranks left go on) or stop",
            f);
  DDP_CHECK(f != "stop" || o.max_restarts == 0,
            "--on-failure stop ends the job at the first failure, but --max-restarts {} asks for "
            "restarts; pass one of them",
            o.max_restarts);
  DDP_CHECK(o.min_ranks == 0 || f == "continue",
            "--min-ranks {} applies to --on-failure continue (the group going on smaller); with "
            "--on-failure {} a failure ends or restarts the whole group",
            o.min_ranks, f);
  DDP_CHECK(o.node_timeout_s >= 1,
            "--node-timeout {}: must be at least 1 second (a node's ddprun beats 8 times per "
            "timeout, at most once a second)",
            o.node_timeout_s);
  DDP_CHECK(!o.node_timeout_given || o.nnodes > 1,
            "--node-timeout {:g} takes a node out of the group, which needs --nnodes > 1 "
            "(given: --nnodes {}); drop it",
            o.node_timeout_s, o.nnodes);
  if (!o.rdzv_backup_host.empty()) {  // Note [store backup]
    DDP_CHECK(f == "continue" && o.nnodes > 1,
              "--rdzv-backup keeps the group going when node 0 is lost, which needs --nnodes > 1 "
              "and --on-failure continue (given: --nnodes {}, --on-failure {})",
              o.nnodes, f);
    DDP_CHECK(o.rdzv_backup_port >= 1 && o.rdzv_backup_port <= 65535,
              "--rdzv-backup port {}: must be a TCP port in 1..65535", o.rdzv_backup_port);
    const std::string& host = o.rdzv_backup_host;
    DDP_CHECK(host != "0.0.0.0" && host != "::",
              "--rdzv-backup {}: every node and rank connects to HOST, so it must be node 1's "
              "address, not a wildcard",
              host);
    // The same address under two spellings (localhost and 127.0.0.1) is the same store.
    std::string error;
    const auto numeric = [&error](const std::string& name) {
      std::vector<std::string> found = resolve_host(name, error);
      return found.empty() ? name : found.front();
    };
    if (o.rdzv_backup_port == rdzv_store_port(o)) {  // resolved only then: no DNS otherwise
      const std::string store = rdzv_store_host(o);
      DDP_CHECK(host != store && numeric(host) != numeric(store),
                "--rdzv-backup {}:{} is the agents' store itself; give node 1's address, or "
                "another port when both nodes are one machine",
                host, o.rdzv_backup_port);
    }
  }
  if (f != "continue") return;
  const std::string& n = o.nproc_per_node;
  if (o.min_ranks > 0 && n != "gpu" && n != "auto") {
    const int started = o.nnodes * parse_int("--nproc-per-node", n);
    DDP_CHECK(o.min_ranks <= started,
              "--min-ranks {} is more than the {} ranks started (--nproc-per-node{}): the job "
              "could never go on after a failure",
              o.min_ranks, started, o.nnodes > 1 ? " x --nnodes" : "");
  }
  if (f == "continue" && o.nnodes == 1 && o.nproc_per_node == "1") {
    throw ValueError(
        "--on-failure continue with one rank (-n 1): no rank would be left to go on; use "
        "--on-failure restart with --max-restarts K to start it again");
  }
}

void validate(const LaunchOptions& o) {
  const std::string& n = o.nproc_per_node;
  if (n != "gpu" && n != "auto") {
    DDP_CHECK(parse_int("--nproc-per-node", n) >= 1,
              "--nproc-per-node {}: must be at least 1 (or gpu, auto)", n);
  }
  DDP_CHECK(o.nnodes >= 1 && o.nnodes <= kMaxNodes, "--nnodes {}: must be in 1..{}", o.nnodes,
            kMaxNodes);
  if (n != "gpu" && n != "auto") {
    const int64_t world = int64_t{o.nnodes} * parse_int("--nproc-per-node", n);
    DDP_CHECK(world <= kMaxWorldSize,
              "--nnodes {} x --nproc-per-node {} = {} ranks: at most {} (the ranks are numbered "
              "in an int, and every node's agent keeps a record of each)",
              o.nnodes, n, world, kMaxWorldSize);
  }
  DDP_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes,
            "--node-rank {}: must be in 0..{} for --nnodes {}", o.node_rank, o.nnodes - 1,
            o.nnodes);
  validate_rendezvous(o);
  DDP_CHECK(o.max_restarts >= 0, "--max-restarts {}: must be >= 0", o.max_restarts);
  validate_on_failure(o);
  DDP_CHECK(o.grace_period_s >= 0, "--grace-period {}: must be >= 0 seconds", o.grace_period_s);
  DDP_CHECK(o.rdzv_timeout_s > 0, "--rdzv-timeout {}: must be > 0 seconds", o.rdzv_timeout_s);
  DDP_CHECK(o.stopped_timeout_s >= 0, "--stopped-timeout {}: must be >= 0 seconds (0: never)",
            o.stopped_timeout_s);
  DDP_CHECK(o.hang_timeout_s.value_or(0) >= 0, "--hang-timeout {}: must be >= 0 seconds (0: never)",
            o.hang_timeout_s.value_or(0));
  DDP_CHECK(!o.tee || !o.log_dir.empty(), "--tee needs --log-dir DIR (the files to tee into)");
  DDP_CHECK(o.backend != "mpi",
            "--backend mpi: the mpi backend needs its ranks started by mpirun, which ddprun is "
            "not; run `mpirun -n N PROGRAM ...` with --backend mpi (train) or DDP_BACKEND=mpi, or "
            "keep ddprun and use --backend gloo or shm");
  if (!o.backend.empty()) {
    DDP_CHECK(std::any_of(std::begin(kBackendNames), std::end(kBackendNames),
                          [&](const char* b) { return o.backend == b; }),
              "--backend '{}': valid values are auto, local, shm, gloo, nccl", o.backend);
  }
  DDP_CHECK(!o.program.empty(), "missing PROGRAM: what should each rank run?");
  DDP_CHECK(!o.module || !o.no_python,
            "-m/--module and --no-python together: a module runs under python3; drop one");
}

// Splits "--flag=value" and normalises torchrun's underscores: "--nproc_per_node".
void split_long_option(std::string& name, std::optional<std::string>& value) {
  if (const auto eq = name.find('='); eq != std::string::npos) {
    value = name.substr(eq + 1);
    name.resize(eq);
  }
  std::replace(name.begin() + 2, name.end(), '_', '-');
}

}  // namespace

ParseResult parse_ddprun_args(int argc, const char* const* argv) {
  ParseResult result;
  LaunchOptions& o = result.options;
  bool master_addr_given = false;
  bool master_port_given = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string name = argv[i];
    std::optional<std::string> value;
    if (name == "--") {
      ++i;
      break;
    }
    if (name.size() < 2 || name[0] != '-') break;  // PROGRAM
    if (name.starts_with("--")) {
      split_long_option(name, value);
    } else if (name.starts_with("-n") && name.size() > 2) {
      value = name.substr(2);
      name = "-n";
    }
    if (name == "-h" || name == "--help" || name == "--version") {
      result.action = name == "--version" ? ParseAction::version : ParseAction::help;
      return result;
    }
    if (name == "-n") name = "--nproc-per-node";
    if (name == "--tee") {  // a switch, or torchrun's --tee 0..3
      if (!value && i + 1 < argc && looks_like_tee_value(argv[i + 1])) value = argv[++i];
      o.tee = value ? parse_tee(*value) : true;
      continue;
    }
    if (name == "--no-prefix" || switch_flag(o, name) != nullptr) {
      DDP_CHECK(!value, "{} takes no value", name);
      if (name == "--no-prefix")
        o.prefix = false;
      else
        *switch_flag(o, name) = true;
      continue;
    }
    if (name == "--master-addr") master_addr_given = true;
    if (name == "--master-port") master_port_given = true;
    const auto it = valued_flags().find(name);
    DDP_CHECK(!is_torchrun_only(name),
              "unknown option '{}': a torchrun option that ddprun does not have (see "
              "docs/ddprun.md, \"Departures from torchrun\")",
              name);
    DDP_CHECK(it != valued_flags().end(), "unknown option '{}'", name);
    if (!value) {
      DDP_CHECK(i + 1 < argc, "{} needs a value", name);
      value = argv[++i];
    }
    it->second(o, *value);
  }
  if (o.rdzv_free_port) {  // torchrun's HOST:0: a free port, --standalone's, on one node only
    DDP_CHECK(o.nnodes == 1,
              "--rdzv-endpoint {}:0: a free port cannot be found by the other nodes of --nnodes "
              "{}; give node 0's port",
              o.rdzv_host, o.nnodes);
    DDP_CHECK(!master_port_given,
              "--rdzv-endpoint {}:0 picks free ports, and --master-port {} names one; pass one of "
              "them",
              o.rdzv_host, o.master_port);
    o.standalone = true;
  }
  if (!master_addr_given && !o.rdzv_host.empty()) o.master_addr = o.rdzv_host;
  if (!master_port_given) move_default_master_port(o);
  if (i < argc) o.program = argv[i++];
  for (; i < argc; ++i) o.program_args.emplace_back(argv[i]);
  validate(o);
  return result;
}

int resolve_nproc(const std::string& spec, int gpu_count, const std::string& why_no_gpu) {
  if (spec == "auto") return std::max(1, gpu_count);
  if (spec == "gpu") {
    // The reason ends with train's hint ("use --device cpu"), which is no flag of
    // ddprun's: the ranks' program picks its device (train's default auto: the CPU).
    std::string why = why_no_gpu;
    constexpr std::string_view kTrainHint = "; without a GPU, use --device cpu";
    if (why.ends_with(kTrainHint)) why.resize(why.size() - kTrainHint.size());
    DDP_CHECK(gpu_count > 0,
              "--nproc-per-node gpu: no GPU is visible{}{}; pass a number of ranks (-n 4: "
              "train's ranks then run on the CPU) or auto (one rank per GPU, else 1)",
              why.empty() ? "" : ": ", why);
    return gpu_count;
  }
  return parse_int("--nproc-per-node", spec);
}

std::string rdzv_store_host(const LaunchOptions& o) {
  return o.rdzv_host.empty() ? o.master_addr : o.rdzv_host;
}

int rdzv_store_port(const LaunchOptions& o) {
  return o.rdzv_port != 0 ? o.rdzv_port : o.master_port + 1;
}

int threads_per_rank(int cores, int local_ranks) {
  return std::max(1, cores / std::max(1, local_ranks));
}

}  // namespace ddp::launcher
