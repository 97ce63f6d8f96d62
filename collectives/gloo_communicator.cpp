// The gloo backend: CPU tensors over TCP with Debian's libgloo, rendezvous through
// our Store. Collectives run on the communication thread of ThreadedCommunicator,
// one at a time, each as one call into gloo's algorithms.
//
// Note [gloo reductions]: every reduction goes through gloo's generic
// allreduce/reduce with our own element-wise function (comm::reduce_buffers), so
// all five dtypes take one path: 16-bit floats (bf16, which gloo lacks, and f16)
// are combined pairwise in f32 and rounded back, integers in their own type. avg
// is sum followed by a scale by 1 / world size on the ranks that receive a result.
//
// Note [gloo errors]: this gloo reports a peer that stopped or is too slow as an
// IoException whose text says "timeout"/"Timed out" (it has no TimeoutException);
// those become CommTimeoutError, every other gloo failure (a reset connection
// from a rank that died, a failed enforce) a CommError. gloo's transport is in an
// unknown state after an IoException, which matches the communicator being
// broken after its first failure. gloo names a broken peer by a socket address,
// often an ephemeral port, not by rank; Debian's headers do not expose the
// connections (tcp/pair.h includes a header the package lacks), so these errors
// cannot name the rank that failed.
//
// Note [gloo mismatch]: when ranks issue different collectives (or sizes), a
// peer's message is longer than the buffer gloo posted for it, and gloo's
// network thread fails an enforce ("op.preamble.length <= op.nbytes") where no
// caller can catch it: the process used to die of std::terminate (SIGABRT, exit
// 134) with gloo's line only. Comparing every collective up front costs a round
// trip per collective, which is what DDP_DEBUG=detail is for; instead a
// terminate handler (installed with the first gloo communicator, chained to the
// previous one for every other exception) recognises gloo's exception, says
// what happened in our words (rank, this rank's collective in flight, the byte
// counts) and exits 1.
#include "collectives/backends.h"
#include "collectives/communicator_base.h"
#include "collectives/reduce_kernels.h"
#include "collectives/sigpipe_block.h"
#include "runtime/ops/ops.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <regex>

namespace ddp {
namespace {

// gloo's rendezvous store over ours, every key under `prefix`.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<ddp::Store> store, std::string prefix, std::function<bool()> abandon)
      : store_(std::move(store)), prefix_(std::move(prefix)), abandon_(std::move(abandon)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    if (abandon_) wait_or_abandon({key}, store_->timeout());
    const Bytes value = store_->get(prefix_ + key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    if (abandon_) return wait_or_abandon(keys, store_->timeout());
    store_->wait(prefixed(keys));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    if (abandon_) return wait_or_abandon(keys, timeout);
    store_->wait(prefixed(keys), timeout);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  // GlooOptions::abandon: waits in slices, giving up when it says so.
  void wait_or_abandon(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      try {
        store_->wait(prefixed(keys), std::clamp(left, std::chrono::milliseconds(1),
                                                std::chrono::milliseconds(100)));
        return;
      } catch (const StoreTimeoutError&) {
        if (abandon_()) {
          throw CommError(
              "gave up connecting the gloo ranks: the group's membership lost a "
              "member meanwhile",
              -1, "gloo rendezvous", -1, 0);
        }
        if (std::chrono::steady_clock::now() >= deadline) throw;
      }
    }
  }
  std::shared_ptr<ddp::Store> store_;
  std::string prefix_;
  std::function<bool()> abandon_;
};

std::string this_host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  DDP_CHECK(gethostname(name, sizeof(name) - 1) == 0,
            "gloo: gethostname failed; set GlooOptions::hostname to an address other ranks reach");
  return name;
}

// Calls f(T{}) with an unsigned type of the dtype's element size: gloo's typed
// setters only use sizeof(T) (Note [gloo reductions]).
template <typename F>
void with_element_type(DType dtype, F&& f) {
  switch (element_size(dtype)) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      DDP_ASSERT(false, "gloo: unexpected element size of {}", dtype_name(dtype));
  }
}

std::function<void(void*, const void*, const void*, size_t)> reduce_function(DType dtype,
                                                                             ReduceOp op) {
  const ReduceOp pairwise = op == ReduceOp::avg ? ReduceOp::sum : op;
  return [dtype, pairwise](void* c, const void* a, const void* b, size_t n) {
    const void* srcs[2] = {a, b};
    comm::reduce_buffers(c, srcs, 2, static_cast<int64_t>(n), dtype, pairwise, 1.0);
  };
}

// Note [gloo deadline]: gloo gives up 10% (at most 200 ms) before the timeout, so
// the caller sees its error (the op and gloo's cause) rather than Work::wait's bare one.
std::chrono::milliseconds gloo_timeout(std::chrono::milliseconds timeout) {
  return timeout -
         std::min<std::chrono::milliseconds>(timeout / 10, std::chrono::milliseconds(200));
}

bool is_timeout_text(const std::string& text) {
  return text.find("imeout") != std::string::npos || text.find("Timed out") != std::string::npos;
}

// Distinguishes the rendezvous of several gloo communicators on one store: the
// n-th made in this process uses keys "gloo/<n>/...", so every rank must create
// them in the same order (as torch.distributed's group counter).
std::atomic<int> g_gloo_instances{0};

// Note [gloo hostname]: gloo's lookupAddrForHostname (Debian 12's 0.0~git20220518)
// checks getaddrinfo's result only against -1, so a name that does not resolve
// (EAI_NONAME is -2) sends it walking an uninitialised result list: a segfault now
// and then (multirank.GlooCommunicator.UnresolvableHostname... crashed in 2 of 80
// runs on a loaded machine, and once in a full suite). Upstream later checks for 0. The name is
// resolved here first, and a failure is the CommError gloo's own would have been.
void check_resolves(const std::string& host, const GlooOptions& options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rv = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rv == 0) {
    freeaddrinfo(found);
    return;
  }
  throw CommError(
      fmt::format("rank {}: gloo cannot use host '{}': it does not resolve ({}). Set "
                  "GlooOptions::hostname (for train and other programs of a launcher, export "
                  "DDP_GLOO_HOSTNAME=<this node's address>) to a name or address of this node "
                  "that the other ranks reach",
                  options.rank, host, gai_strerror(rv)),
      options.rank, "gloo rendezvous", -1, 0);
}

// Connects every pair of ranks; world size 1 without a store rendezvouses in memory.
std::shared_ptr<gloo::Context> connect(std::shared_ptr<Store> store, const GlooOptions& options) {
  gloo::transport::tcp::attr attr;
  attr.hostname = options.hostname.empty() ? this_host_name() : options.hostname;
  check_resolves(attr.hostname, options);  // Note [gloo hostname]
  auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(gloo_timeout(options.comm.timeout));
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    if (store == nullptr) {
      gloo::rendezvous::HashStore local;
      context->connectFullMesh(local, device);
    } else {
      GlooStore adapter(std::move(store),
                        options.store_prefix.empty() ? fmt::format("gloo/{}/", g_gloo_instances++)
                                                     : options.store_prefix,
                        options.abandon);
      context->connectFullMesh(adapter, device);
    }
  } catch (const Error&) {
    throw;                             // ours, e.g. a StoreTimeoutError naming the missing key
  } catch (const std::exception& e) {  // gloo::Exception, gloo::EnforceNotMet
    throw CommError(
        fmt::format("rank {}: gloo could not connect to the other {} ranks from host "
                    "'{}': {}. Check that every rank's hostname resolves to an address "
                    "the others reach (GlooOptions::hostname; for train and other programs of a "
                    "launcher, export DDP_GLOO_HOSTNAME=<this node's address>)",
                    options.rank, options.size - 1, attr.hostname, e.what()),
        options.rank, "gloo rendezvous", -1, 0);
  }
  return context;
}

// The collective this process's gloo communicator is running (Note [gloo
// mismatch]); its Collective lives on the communication thread's stack, which
// is blocked inside gloo when the network thread fails.
// The last collective a gloo communicator of this process started, copied
// (not pointed to: it may finish while the handler reads), under a mutex the
// handler only tries. With several gloo communicators it is the latest one's.
struct InFlight {
  int rank = -1;
  Collective c;  // kind, op, root, sequence; no tensors
  int64_t count = 0;
  DType dtype = DType::u8;
  bool has_input = false;
};
std::mutex g_in_flight_mutex;
InFlight g_in_flight;
std::terminate_handler g_previous_terminate = nullptr;

void note_in_flight(int rank, const Collective& c) {
  std::lock_guard<std::mutex> lock(g_in_flight_mutex);
  g_in_flight.rank = rank;
  g_in_flight.c.kind = c.kind;
  g_in_flight.c.op = c.op;
  g_in_flight.c.root = c.root;
  g_in_flight.c.sequence = c.sequence;
  g_in_flight.count = c.count();
  g_in_flight.dtype = c.dtype();
  g_in_flight.has_input = c.input.defined();
}

// (rank, "all_reduce(sum) #3 of 7 f32"), or (-1, "") when it cannot tell.
std::pair<int, std::string> describe_in_flight() {
  std::unique_lock<std::mutex> lock(g_in_flight_mutex, std::try_to_lock);
  if (!lock.owns_lock() || g_in_flight.rank < 0) return {-1, ""};
  std::string text = g_in_flight.c.describe();
  if (g_in_flight.has_input) {
    text += fmt::format(" of {} {}", g_in_flight.count, dtype_name(g_in_flight.dtype));
  }
  return {g_in_flight.rank, text};
}

std::string explain_gloo_network_failure(const std::string& gloo_text, int rank,
                                         const std::string& collective) {
  const std::string who = rank >= 0 ? fmt::format("rank {}", rank) : "this rank";
  const std::string during =
      collective.empty() ? std::string("a collective") : fmt::format("its {}", collective);
  std::smatch m;
  static const std::regex kLonger(R"(preamble\.length <= op\.nbytes\.\s*(\d+) vs (\d+))");
  if (std::regex_search(gloo_text, m, kLonger)) {
    return fmt::format(
        "{}: collective mismatch on the gloo backend: a peer sent {} bytes where {} expected at "
        "most {} during {}. The ranks issued different collectives, sizes or dtypes here; every "
        "rank must issue the same collectives in the same order with the same shapes. Run with "
        "DDP_DEBUG=detail to compare every collective across ranks and name the one that "
        "differs. (gloo: {})",
        who, m[1].str(), who, m[2].str(), during, gloo_text);
  }
  return fmt::format(
      "{}: the gloo backend failed in its network thread during {}: {}. A peer may have issued a "
      "different collective (DDP_DEBUG=detail compares them) or died",
      who, during, gloo_text);
}

[[noreturn]] void on_terminate() {
  std::optional<std::string> text;  // set for gloo's own exceptions only
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const gloo::EnforceNotMet& ex) {
      text = ex.what();
    } catch (const gloo::Exception& ex) {
      text = ex.what();
    } catch (...) {
    }
  }
  if (text) {
    const auto [rank, collective] = describe_in_flight();
    const std::string message = explain_gloo_network_failure(*text, rank, collective);
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

void install_terminate_handler() {
  static std::once_flag once;
  std::call_once(once, [] { g_previous_terminate = std::set_terminate(on_terminate); });
}

class GlooCommunicator : public ThreadedCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<Store> store, const GlooOptions& options)
      : ThreadedCommunicator(options.rank, options.size, options.comm) {
    DDP_CHECK(store != nullptr || options.size == 1,
              "gloo: world size {} needs a rendezvous store (only world size 1 works without one)",
              options.size);
    const comm::SigpipeBlock block;  // Note [gloo SIGPIPE]
    context_ = connect(std::move(store), options);
    install_terminate_handler();
    start_thread();
  }
  ~GlooCommunicator() override { stop_thread(); }
  std::string backend() const override { return "gloo"; }

 protected:
  void run(const Collective& c) override;

 private:
  void dispatch(const Collective& c);
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op, uint32_t tag);
  void broadcast(const Collective& c, uint32_t tag);
  void all_gather(const Collective& c, uint32_t tag);
  void reduce_scatter(const Collective& c, uint32_t tag);
  void reduce(const Collective& c, uint32_t tag);
  void scale_for_avg(void* data, int64_t count, DType dtype) const;

  std::shared_ptr<gloo::Context> context_;
};

void GlooCommunicator::run(const Collective& c) {
  const comm::SigpipeBlock block;  // this may be a waiter's thread: Note [gloo SIGPIPE]
  note_in_flight(rank(), c);       // Note [gloo mismatch]
  try {
    dispatch(c);
  } catch (const gloo::IoException& e) {
    const std::string text = e.what();
    if (is_timeout_text(text)) {
      fail_timeout(c, fmt::format("{}. A peer rank stopped, is stuck or issued a different "
                                  "collective; DDP_DEBUG=detail compares collectives across ranks",
                                  text));
    }
    fail(c, fmt::format("{}. A peer rank probably died or closed its connection", text));
  } catch (const gloo::Exception& e) {
    fail(c, e.what());
  } catch (const gloo::EnforceNotMet& e) {
    fail(c, e.what());
  }
}

void GlooCommunicator::dispatch(const Collective& c) {
  const auto tag = static_cast<uint32_t>(c.sequence);
  if (c.kind == CollectiveKind::barrier) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(gloo_timeout(options().timeout));
    gloo::barrier(opts);
    return;
  }
  if (c.count() == 0) return;  // every rank has the same count: nothing to move
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      all_reduce(c.input.data_ptr(), c.count(), c.dtype(), c.op, tag);
      if (c.op == ReduceOp::avg) scale_for_avg(c.input.data_ptr(), c.count(), c.dtype());
      return;
    case CollectiveKind::broadcast:
      return broadcast(c, tag);
    case CollectiveKind::all_gather:
      return all_gather(c, tag);
    case CollectiveKind::reduce_scatter:
      return reduce_scatter(c, tag);
    case CollectiveKind::reduce:
      return reduce(c, tag);
    case CollectiveKind::barrier:
      return;
  }
}

void GlooCommunicator::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op,
                                  uint32_t tag) {
  gloo::AllreduceOptions opts(context_);
  with_element_type(dtype, [&](auto element) {
    using T = decltype(element);
    opts.setOutput(static_cast<T*>(data), static_cast<size_t>(count));
  });
  opts.setReduceFunction(reduce_function(dtype, op));
  opts.setTag(tag);
  opts.setTimeout(gloo_timeout(options().timeout));
  gloo::allreduce(opts);
}

void GlooCommunicator::broadcast(const Collective& c, uint32_t tag) {
  gloo::BroadcastOptions opts(context_);
  with_element_type(c.dtype(), [&](auto element) {
    using T = decltype(element);
    opts.setOutput(static_cast<T*>(c.input.data_ptr()), static_cast<size_t>(c.count()));
  });
  opts.setRoot(c.root);
  opts.setTag(tag);
  opts.setTimeout(gloo_timeout(options().timeout));
  gloo::broadcast(opts);
}

void GlooCommunicator::all_gather(const Collective& c, uint32_t tag) {
  gloo::AllgatherOptions opts(context_);
  with_element_type(c.dtype(), [&](auto element) {
    using T = decltype(element);
    opts.setInput(static_cast<T*>(c.input.data_ptr()), static_cast<size_t>(c.count()));
    opts.setOutput(static_cast<T*>(c.output.data_ptr()), static_cast<size_t>(c.output.numel()));
  });
  opts.setTag(tag);
  opts.setTimeout(gloo_timeout(options().timeout));
  gloo::allgather(opts);
}

// gloo's reduce-scatter is an old-style templated algorithm without timeouts;
// an all-reduce of a scratch copy followed by taking this rank's block costs
// about twice the bytes on the wire but keeps one tested path.
void GlooCommunicator::reduce_scatter(const Collective& c, uint32_t tag) {
  Tensor scratch = c.input.clone();
  all_reduce(scratch.data_ptr(), scratch.numel(), c.dtype(), c.op, tag);
  const int64_t n = c.output.numel();
  Tensor out = c.output;
  copy_uncounted_(out, scratch.flat_view(rank() * n, c.output.shape()));  // Note [version counter]
  if (c.op == ReduceOp::avg) scale_for_avg(out.data_ptr(), n, c.dtype());
}

void GlooCommunicator::reduce(const Collective& c, uint32_t tag) {
  gloo::ReduceOptions opts(context_);
  with_element_type(c.dtype(), [&](auto element) {
    using T = decltype(element);
    opts.setOutput(static_cast<T*>(c.input.data_ptr()), static_cast<size_t>(c.count()));
  });
  opts.setRoot(c.root);
  opts.setReduceFunction(reduce_function(c.dtype(), c.op));
  opts.setTag(tag);
  opts.setTimeout(gloo_timeout(options().timeout));
  gloo::reduce(opts);
  if (c.op == ReduceOp::avg && rank() == c.root) {
    scale_for_avg(c.input.data_ptr(), c.count(), c.dtype());
  }
}

void GlooCommunicator::scale_for_avg(void* data, int64_t count, DType dtype) const {
  const void* srcs[1] = {data};
  comm::reduce_buffers(data, srcs, 1, count, dtype, ReduceOp::avg, 1.0 / size());
}

}  // namespace

std::shared_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store,
                                                     const GlooOptions& options) {
  check_comm_options(options.comm, "gloo backend");
  return std::make_shared<GlooCommunicator>(std::move(store), options);
}

}  // namespace ddp
