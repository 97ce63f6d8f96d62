#include "collectives/bootstrap.h"

#include "collectives/communicator_base.h"
#include "collectives/elastic.h"
#include "collectives/flight/flight_recorder.h"
#include "collectives/store/socket.h"
#include "collectives/store/tcp_store.h"
#include "collectives/trace_collectives.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/env.h"
#include "runtime/logging.h"
#include "runtime/trace.h"
#include "runtime/unique_fd.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <optional>
#include <random>

namespace ddp {
namespace {

constexpr const char* kBackends = "auto, local, shm, gloo, mpi, nccl";

std::optional<int64_t> first_int(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = env::get_int(n)) return v;
  }
  return std::nullopt;
}

// "RANK=3 WORLD_SIZE=2 ..." for error messages: every variable of the contract that is set.
std::string seen_variables() {
  static const char* kNames[] = {"RANK",
                                 "WORLD_SIZE",
                                 "LOCAL_RANK",
                                 "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK",
                                 "MASTER_ADDR",
                                 "MASTER_PORT",
                                 "DDPRUN_RUN_ID",
                                 "DDPRUN_STORE",
                                 "DDPRUN_STORE_ADDR",
                                 "DDPRUN_STORE_BACKUP",
                                 "OMPI_COMM_WORLD_RANK",
                                 "OMPI_COMM_WORLD_SIZE",
                                 "OMPI_COMM_WORLD_LOCAL_RANK",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE",
                                 "PMI_RANK",
                                 "PMI_SIZE",
                                 "SLURM_PROCID",
                                 "SLURM_NTASKS",
                                 "SLURM_LOCALID",
                                 "SLURM_NTASKS_PER_NODE"};
  std::string out;
  for (const char* n : kNames) {
    if (auto v = env::get(n)) out += fmt::format("{}{}={}", out.empty() ? "" : " ", n, *v);
  }
  return out.empty() ? "(none set)" : out;
}

// The integer variable `name` (nullopt when unset), at most INT_MAX: a larger one
// would wrap in an int (WORLD_SIZE=4294967298 read as 2).
std::optional<int> int_var(const char* name) {
  const auto v = env::get_int(name);
  if (!v) return std::nullopt;
  DDP_CHECK(*v >= 0 && *v <= std::numeric_limits<int>::max(),
            "{}={}: expected a whole number from 0 to {}. Seen: {}", name, *v,
            std::numeric_limits<int>::max(), seen_variables());
  return static_cast<int>(*v);
}

// RANK and WORLD_SIZE set by hand (no ddprun, no torchrun: neither's run id) in a
// process that mpirun, srun or a PMI launcher started: a stale pair left in the
// environment makes every process train alone (WORLD_SIZE 1 in a launch of
// several), or gives the processes one rank number of that launch's world size,
// silently. Those two shapes are refused; others are a spawner's own numbering
// (srun --ntasks-per-node=1 starting 4 ranks a node with RANK=4*SLURM_PROCID+i),
// or a shell inside an srun task of its own, and pass.
void check_against_launcher(const LaunchEnv& e) {
  if (env::get(env::kRunId) || env::get("TORCHELASTIC_RUN_ID")) return;
  struct Launcher {
    const char* name;
    const char* rank;
    const char* size;
  };
  for (const Launcher l : {Launcher{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                           Launcher{"a PMI launcher", "PMI_RANK", "PMI_SIZE"},
                           Launcher{"srun", "SLURM_PROCID", "SLURM_NTASKS"}}) {
    const auto rank = int_var(l.rank), size = int_var(l.size);
    if (!rank || !size || *size <= 1) continue;
    const bool alone = e.world_size == 1;
    const bool renumbered = e.world_size == *size && e.rank != *rank;
    DDP_CHECK(!alone && !renumbered,
              "RANK={} WORLD_SIZE={} disagree with {}'s {}={} {}={}: a RANK/WORLD_SIZE left in "
              "the environment would make {}. Unset RANK and WORLD_SIZE (ranks are then taken "
              "from {}), or set them from it. Seen: {}",
              e.rank, e.world_size, l.name, l.rank, *rank, l.size, *size,
              alone ? "each of its processes train alone" : "its processes share rank numbers",
              l.name, seen_variables());
  }
}

void fill_ranks(LaunchEnv& e) {
  if (env::get(env::kRank)) {
    e.launcher = "ddprun";
    e.rank = *int_var(env::kRank);
    auto world = int_var(env::kWorldSize);
    DDP_CHECK(world.has_value(),
              "RANK is set but WORLD_SIZE is not; the launcher sets both. Seen: {}",
              seen_variables());
    e.world_size = *world;
    e.local_rank = int_var(env::kLocalRank).value_or(e.rank);
    e.local_world_size = int_var(env::kLocalWorldSize).value_or(e.world_size);
    check_against_launcher(e);
  } else if (env::get("OMPI_COMM_WORLD_RANK")) {
    e.launcher = "mpirun";
    e.rank = *int_var("OMPI_COMM_WORLD_RANK");
    e.world_size = int_var("OMPI_COMM_WORLD_SIZE").value_or(1);
    e.local_rank = int_var("OMPI_COMM_WORLD_LOCAL_RANK").value_or(e.rank);
    e.local_world_size = int_var("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(e.world_size);
  } else if (env::get("PMI_RANK")) {
    e.launcher = "pmi";
    e.rank = *int_var("PMI_RANK");
    e.world_size = int_var("PMI_SIZE").value_or(1);
    e.local_rank = e.rank;
    e.local_world_size = e.world_size;
  } else if (env::get("SLURM_PROCID")) {
    e.launcher = "slurm";
    e.rank = *int_var("SLURM_PROCID");
    e.world_size = int_var("SLURM_NTASKS").value_or(1);
    e.local_rank = int_var("SLURM_LOCALID").value_or(0);
    e.local_world_size =
        static_cast<int>(first_int({"SLURM_NTASKS_PER_NODE"}).value_or(e.world_size));
  }
  // No launcher's rank, but a world: one process would train alone, silently, where
  // the user meant one of several (RANK without WORLD_SIZE is refused above too).
  if (e.launcher == "none") {
    const auto world = env::get_int(env::kWorldSize);
    DDP_CHECK(!world || *world <= 1,
              "WORLD_SIZE={} is set but RANK is not; the launcher sets both (ddprun, torchrun), "
              "or unset WORLD_SIZE to run alone. Seen: {}",
              *world, seen_variables());
  }
}

// "host:port" or "[v6 address]:port" in the variable `name`.
std::pair<std::string, int> parse_endpoint(const char* name, const std::string& text) {
  const auto colon = text.rfind(':');
  DDP_CHECK(colon != std::string::npos && colon > 0,
            "{}={}: expected HOST:PORT (ddprun sets it). Seen: {}", name, text, seen_variables());
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port = text.substr(colon + 1);
  char* end = nullptr;
  const long value = std::strtol(port.c_str(), &end, 10);
  DDP_CHECK(!port.empty() && *end == '\0' && value > 0 && value <= 65535,
            "{}={}: the port '{}' is not a TCP port in 1..65535. Seen: {}", name, text, port,
            seen_variables());
  return {host, static_cast<int>(value)};
}

// DDPRUN_STORE_ADDR (Note [two stores] in launcher/rendezvous.h); unset: the
// store is on MASTER_ADDR:MASTER_PORT. DDPRUN_STORE_BACKUP: its backup.
void fill_store(LaunchEnv& e) {
  e.store_host = e.master_addr;
  e.store_port = e.master_port;
  if (const auto text = env::get(env::kStoreAddr))
    std::tie(e.store_host, e.store_port) = parse_endpoint(env::kStoreAddr, *text);
  if (const auto text = env::get(env::kStoreBackup); text && !text->empty())
    std::tie(e.store_backup_host, e.store_backup_port) = parse_endpoint(env::kStoreBackup, *text);
}

}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv e;
  fill_ranks(e);
  DDP_CHECK(e.world_size >= 1 && e.rank >= 0 && e.rank < e.world_size,
            "inconsistent launch environment: rank {} is not below world size {}. Seen: {}", e.rank,
            e.world_size, seen_variables());
  DDP_CHECK(
      e.local_world_size >= 1 && e.local_rank >= 0 && e.local_rank < e.local_world_size &&
          e.local_world_size <= e.world_size,
      "inconsistent launch environment: local rank {} of local world size {} (world size {}). "
      "Seen: {}",
      e.local_rank, e.local_world_size, e.world_size, seen_variables());
  e.master_addr = env::get(env::kMasterAddr).value_or("");
  e.master_port = static_cast<int>(env::get_int(env::kMasterPort).value_or(0));
  DDP_CHECK(e.master_port >= 0 && e.master_port <= 65535,
            "MASTER_PORT={} is not a TCP port. Seen: {}", e.master_port, seen_variables());
  e.run_id = env::get(env::kRunId).value_or("");
  e.agent_store = env::get(env::kStore).value_or("") == "agent";
  e.on_failure = env::get(env::kOnFailure).value_or("");
  e.joining = env::get(env::kJoin).value_or("") == "1";
  fill_store(e);
  return e;
}

namespace {

// Note [timeout bound]: the collective timeout becomes a deadline in nanoseconds of
// steady_clock (int64: 292 years), and TcpStore waits in milliseconds from it; past
// about 9.2e9 s, s * 1000 or the deadline wrapped negative, so a wait either timed out
// at once or never. A bound far past any job (ddprun's own for its duration flags,
// launcher/options.cpp) keeps every such sum in range.
constexpr int64_t kMaxTimeoutS = 1000000000;  // about 31 years

std::chrono::milliseconds resolve_timeout(const ProcessGroupOptions& o) {
  if (o.timeout) {
    DDP_CHECK(o.timeout->count() > 0 && o.timeout->count() <= kMaxTimeoutS * 1000,
              "ProcessGroupOptions::timeout is {} ms; it must be positive (at 0 every "
              "collective would time out at once) and at most {} ms (about 31 years)",
              o.timeout->count(), kMaxTimeoutS * 1000);
    return *o.timeout;
  }
  if (auto s = env::get_int(env::kTimeoutS)) {
    DDP_CHECK(*s > 0 && *s <= kMaxTimeoutS,
              "{}={}: expected a whole number of seconds from 1 to {} (about 31 years); set "
              "it in that range or unset it (default 300)",
              env::kTimeoutS, *s, kMaxTimeoutS);
    return std::chrono::milliseconds(*s * 1000);
  }
  return std::chrono::milliseconds(300000);
}

// Note [rank devices]: a device without an index ("cuda", "cpu", or nothing: cuda
// where there are GPUs, else cpu) means this rank's own one, by local rank:
// cuda:LOCAL_RANK, or cuda:(LOCAL_RANK mod GPUs) when ranks outnumber the GPUs
// (several ranks on one GPU work with shm or gloo; nccl refuses them with a clear
// error); likewise cpu:(LOCAL_RANK mod N) with N virtual cpu devices (Note
// [virtual cpu devices]). An explicit index is taken as it is.
Device resolve_device(const ProcessGroupOptions& o, const LaunchEnv& e) {
  std::string text = o.device.empty() ? env::get(env::kDevice).value_or("") : o.device;
  if (text.empty()) text = device_count(DeviceType::cuda) > 0 ? "cuda" : "cpu";
  Device d = Device::parse(text);
  const int count = device_count(d.type);
  if (text.find(':') == std::string::npos && count > 0) d.index = e.local_rank % count;
  check_available(d);
  return d;
}

std::string resolve_backend(const ProcessGroupOptions& o, const LaunchEnv& e, const Device& d) {
  std::string name = o.backend.empty() ? env::get(env::kBackend).value_or("auto") : o.backend;
  DDP_CHECK(name == "auto" || name == "local" || name == "shm" || name == "gloo" || name == "mpi" ||
                name == "nccl",
            "unknown backend '{}'; valid backends: {}", name, kBackends);
  if (name != "auto") return name;
  if (e.world_size == 1) return "local";
  if (d.is_cuda()) return "nccl";
  if (e.launcher != "ddprun" && e.launcher != "none" && mpi_built()) return "mpi";
  return e.local_world_size == e.world_size ? "shm" : "gloo";
}

// The wildcard address of MASTER_ADDR's family: "0.0.0.0" where it has an IPv4
// address, "::" where it has IPv6 ones only.
std::string wildcard_for(const std::string& host) {
  bool v4 = host.find(':') == std::string::npos;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) == 0) {
    v4 = false;
    for (const addrinfo* ai = result; ai != nullptr; ai = ai->ai_next)
      v4 |= ai->ai_family == AF_INET;
    ::freeaddrinfo(result);
  }
  return v4 ? "0.0.0.0" : "::";
}

void connect_store(ProcessGroup& pg, std::chrono::milliseconds timeout) {
  const LaunchEnv& e = pg.env;
  DDP_CHECK(!e.store_host.empty() && e.store_port > 0,
            "world size {} needs MASTER_ADDR and MASTER_PORT (the rendezvous store); ddprun sets "
            "them, with mpirun or srun export them. Seen: {}",
            e.world_size, seen_variables());
  const std::string secret = store_secret_from_env();
  if (e.rank == 0 && !e.agent_store) {
    // On every interface, as torch's TCPStore: MASTER_ADDR as the other nodes
    // resolve it need not be an address that rank 0 resolves it to (a hostname
    // that /etc/hosts maps to 127.0.1.1 here). ddprun binds its --master-addr.
    pg.server = std::make_shared<TcpStoreServer>(TcpStoreServerOptions{
        .host = wildcard_for(e.store_host), .port = e.store_port, .secret = secret});
  }
  // Without ddprun or torchrun (whose store is up before any rank starts) a rank
  // may start up to the timeout before rank 0 and its store.
  const bool own_store = !e.agent_store && e.run_id.empty();
  const std::chrono::milliseconds connect_timeout =
      own_store ? timeout : TcpStoreOptions{}.connect_timeout;
  pg.store = std::make_shared<TcpStore>(TcpStoreOptions{.host = e.store_host,
                                                        .port = e.store_port,
                                                        .secret = secret,
                                                        .timeout = timeout,
                                                        .connect_timeout = connect_timeout,
                                                        .backup_host = e.store_backup_host,
                                                        .backup_port = e.store_backup_port});
}

// Note [job check]: ranks that no ddprun or torchrun started (mpirun, srun, RANK
// set by hand) compare, through the store rank 0 hosts, what they were started
// with: each rank number is claimed once (two processes given one RANK, or two
// jobs on one MASTER_PORT), and every rank's world size and DDP_DEBUG level are
// rank 0's. ddprun starts each rank once with one world size, and keeps its store
// across restarts and replacements, where these keys would be stale. Rank 0 also
// makes a job id, which the flight recorder keeps where no launcher gives one
// (Note [job id] in flight/flight_recorder.cpp).
void check_job(ProcessGroup& pg) {
  const LaunchEnv& e = pg.env;
  if (!e.run_id.empty() || e.agent_store || env::get("TORCHELASTIC_RUN_ID")) return;
  Store& store = *pg.store;
  const std::string where = store_detail::endpoint(e.store_host, e.store_port);
  const int64_t claims = store.add(fmt::format("ddp/job/rank/{}", e.rank), 1);
  DDP_CHECK(claims == 1,
            "rank {}: another process was started with rank {} on the store at {} (a rank given "
            "twice, or two jobs on one MASTER_PORT: give each job its own). Seen: {}",
            e.rank, e.rank, where, seen_variables());
  const std::string mine =
      fmt::format("world size {}, DDP_DEBUG {}", e.world_size, debug_detail() ? "detail" : "off");
  if (e.rank == 0) {
    std::random_device rd;
    const std::string id = fmt::format("{}-{:08x}", getpid(), rd());
    store.set("ddp/job/id", id);  // before ddp/job/start, which the others wait for
    store.set("ddp/job/start", mine);
    flight::set_job_id(id);  // used where no launcher names the job (Note [job id])
    return;
  }
  store.wait({"ddp/job/start"});
  flight::set_job_id(store.get_string("ddp/job/id"));  // a second job in this process: its own
  const std::string theirs = store.get_string("ddp/job/start");
  DDP_CHECK(theirs == mine,
            "rank {} was started with {}, but rank 0 (the store at {}) with {}: every rank of a "
            "job needs the same WORLD_SIZE (and DDP_DEBUG); check the launcher's variables. "
            "Seen: {}",
            e.rank, mine, where, theirs, seen_variables());
}

// Note [mpi needs mpirun]: MPI started without mpirun initialises as a
// singleton (a world of 1), so ranks started by anything else would each train
// alone and succeed. A world that disagrees with the launch environment is an
// error that names mpirun.
void check_mpi_world(const Communicator& comm, const LaunchEnv& e) {
  DDP_CHECK(comm.size() == e.world_size && comm.rank() == e.rank,
            "the mpi backend sees rank {} of a world of {}, but the launch environment says rank "
            "{} of {} (launcher: {}): MPI ranks must be started by mpirun, e.g. `mpirun -n {} "
            "PROGRAM ...` with --backend mpi or DDP_BACKEND=mpi; under ddprun use gloo or shm; "
            "under srun (or in a Slurm job without mpirun) export DDP_BACKEND=gloo with "
            "MASTER_ADDR and MASTER_PORT (docs/deploy.md). Seen: {}",
            comm.rank(), comm.size(), e.rank, e.world_size, e.launcher, e.world_size,
            seen_variables());
}

std::string shared_run_id(ProcessGroup& pg) {
  if (!pg.env.run_id.empty()) return pg.env.run_id;
  DDP_CHECK(pg.store != nullptr, "the shm backend needs DDPRUN_RUN_ID or MASTER_ADDR/MASTER_PORT");
  if (pg.env.rank == 0) {
    std::random_device rd;
    pg.store->set("ddp/run_id", fmt::format("{}-{:08x}", getpid(), rd()));
  }
  return pg.store->get_string("ddp/run_id");
}

// Note [gloo address]: every gloo rank listens on an address that it publishes
// in the store, and by default gloo takes this host's name. Where that name
// resolves to a loopback address (/etc/hosts of containers, Debian's 127.0.1.1,
// network namespaces), ranks on other nodes cannot connect. The address this
// rank uses to reach the store's host is one they can reach, so that is the
// default when it is not a loopback address (MASTER_ADDR 127.0.0.1 on one node
// keeps the host name, as before). DDP_GLOO_HOSTNAME overrides both.
std::string gloo_hostname(const LaunchEnv& e) {
  if (auto name = env::get(env::kGlooHostname)) return *name;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(e.store_host.c_str(), "9", &hints, &found) != 0) return "";
  std::string address;
  for (addrinfo* a = found; a != nullptr && address.empty(); a = a->ai_next) {
    const UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0));
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    // connect() on a UDP socket only picks the route and the source address; nothing is sent.
    if (!fd || connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 ||
        getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0) {
      continue;
    }
    char text[NI_MAXHOST] = {};
    if (getnameinfo(reinterpret_cast<sockaddr*>(&local), length, text, sizeof(text), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      address = text;
    }
  }
  freeaddrinfo(found);
  const bool loopback = address.starts_with("127.") || address == "::1";
  return loopback ? "" : address;
}

}  // namespace

std::shared_ptr<Communicator> make_store_communicator(
    const std::string& backend, const std::shared_ptr<Store>& store, const LaunchEnv& env, int rank,
    int size, const std::string& shm_run_id, const CommOptions& options,
    const std::string& gloo_prefix, const std::function<bool()>& abandon, int nccl_instance) {
  if (backend == "shm") {
    DDP_CHECK(env.local_world_size == env.world_size,
              "the shm backend needs every rank on one node (local world size {} < world size {}); "
              "use gloo across nodes",
              env.local_world_size, env.world_size);
    return make_shm_communicator(
        {.rank = rank, .size = size, .run_id = shm_run_id, .comm = options, .abandon = abandon});
  }
  if (backend == "gloo") {
    const std::string hostname = gloo_hostname(env);  // Note [gloo address]
    return make_gloo_communicator(store, {.rank = rank,
                                          .size = size,
                                          .hostname = hostname,
                                          .comm = options,
                                          .store_prefix = gloo_prefix,
                                          .abandon = abandon});
  }
  DDP_CHECK(backend == "nccl", "make_store_communicator: backend {} has no store rendezvous",
            backend);
  DDP_CHECK_T(DeviceError, options.device.is_cuda(),
              "the nccl backend needs a CUDA device; this rank "
              "has {}. Use shm or gloo for CPU tensors.",
              options.device.str());
  return make_nccl_communicator(store, {.rank = rank,
                                        .size = size,
                                        .device = options.device.index,
                                        .comm = options,
                                        .abandon = abandon,
                                        .instance = nccl_instance});
}

namespace {

ProcessGroup make_process_group(const ProcessGroupOptions& options) {
  ProcessGroup pg;
  pg.env = read_launch_env();
  const auto timeout = resolve_timeout(options);
  pg.device = resolve_device(options, pg.env);
  const CommOptions comm{.timeout = timeout, .device = pg.device};
  if (pg.device.is_cuda()) cuda_api::set_device(pg.device.index);
  const std::string backend = resolve_backend(options, pg.env, pg.device);
  set_log_rank(pg.env.rank, pg.env.world_size);
  if (backend == "local") {
    DDP_CHECK(pg.env.world_size == 1, "the local backend is for world size 1, got {}; valid: {}",
              pg.env.world_size, kBackends);
    pg.comm = make_local_communicator(comm);
    return pg;
  }
  if (backend == "mpi") {
    pg.comm = make_mpi_communicator(comm);
    check_mpi_world(*pg.comm, pg.env);  // Note [mpi needs mpirun]
    DDP_LOG_DEBUG("process group: backend mpi rank {}/{} on {}", pg.env.rank, pg.env.world_size,
                  pg.device.str());
    return pg;
  }
  connect_store(pg, timeout);
  check_job(pg);
  pg.launch_rank = pg.env.rank;
  pg.launch_local_world_size = pg.env.local_world_size;
  for (int r = 0; r < pg.env.world_size; ++r) pg.members.push_back(r);
  pg.backend = backend;
  pg.comm_options = comm;
  if (backend == "shm") pg.shm_run_id = shared_run_id(pg);
  if (pg.env.joining) return pg;  // its communicator comes with the membership it joins
  // Note [nccl regroup]: under --on-failure continue an nccl communicator fails
  // its collectives once the group went on without one of its members.
  std::function<bool()> abandon;
  if (backend == "nccl" && pg.env.elastic())
    abandon = elastic::abandon_check(pg.store, 0, pg.members, std::chrono::milliseconds(100),
                                     /*any_change=*/true);
  pg.comm = make_store_communicator(backend, pg.store, pg.env, pg.env.rank, pg.env.world_size,
                                    pg.shm_run_id, comm, "", abandon);
  DDP_LOG_DEBUG("process group: backend {} rank {}/{} on {}", pg.comm->backend(), pg.env.rank,
                pg.env.world_size, pg.device.str());
  return pg;
}

}  // namespace

ProcessGroup init_process_group(const ProcessGroupOptions& options) {
  trace::start_from_env();  // DDP_TRACE (Note [timeline]): before the communicator exists
  ProcessGroup pg = make_process_group(options);
  trace_process_group(pg);  // Note [trace clocks]; nothing when tracing is off
  return pg;
}

}  // namespace ddp
