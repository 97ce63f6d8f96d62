#include "collectives/ddp/distributed_data_parallel.h"

#include "collectives/collective_events.h"
#include "collectives/ddp/join.h"
#include "collectives/ddp/reducer.h"
#include "runtime/autograd/autograd.h"

#include "runtime/fmt.h"

#include <algorithm>

namespace ddp {
namespace {

// Note [model fingerprint]: every parameter, then every buffer, is described by
// kRecord integers: kind (0 parameter, 1 buffer), dtype, rank of the shape and
// up to kMaxDims sizes (further dims folded into the last). Ranks all_gather
// these records, so each rank can name the first difference and the ranks.
constexpr int64_t kRecord = 8;
constexpr int64_t kMaxDims = kRecord - 3;

void append_record(std::vector<int64_t>& out, int64_t kind, const Tensor& t) {
  out.push_back(kind);
  out.push_back(static_cast<int64_t>(t.dtype()));
  out.push_back(t.dim());
  for (int64_t d = 0; d < kMaxDims; ++d) {
    int64_t size = d < t.dim() ? t.shape()[static_cast<size_t>(d)] : 0;
    for (int64_t e = kMaxDims; d == kMaxDims - 1 && e < t.dim(); ++e) {
      size *= t.shape()[static_cast<size_t>(e)];
    }
    out.push_back(size);
  }
}

std::string describe_record(const int64_t* r, int64_t index, int64_t num_params) {
  if (r[0] < 0) return "absent";
  std::vector<int64_t> dims(r + 3, r + 3 + std::min(r[2], kMaxDims));
  const char* kind = r[0] == 0 ? "parameter" : "buffer";
  const int64_t n = r[0] == 0 ? index : index - num_params;
  return fmt::format("{} {} of dtype {} and shape {}", kind, n,
                     dtype_name(static_cast<DType>(r[1])), shape_str(dims));
}

// Metadata travels on the communicator's device (Note [communicator devices]).
std::vector<int64_t> gather(Communicator& comm, const std::vector<int64_t>& local) {
  const auto n = static_cast<int64_t>(local.size());
  Tensor input = from_vector<int64_t>(local, {n}, {.dtype = DType::i64, .device = comm.device()});
  Tensor output = empty({n * comm.size()}, {.dtype = DType::i64, .device = comm.device()});
  const CollectiveLabel labelled("ddp model check");
  comm.all_gather(input, output)->wait();
  return output.to_vector<int64_t>();
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<Communicator> comm,
                                                 DdpOptions options)
    : module_(std::move(module)), comm_(std::move(comm)), options_(options) {
  DDP_CHECK(module_ != nullptr && comm_ != nullptr,
            "DistributedDataParallel needs a module and a communicator");
  DDP_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_mb > 0,
            "DistributedDataParallel: bucket_cap_mb {} and first_bucket_mb {} must be positive "
            "(MiB; PyTorch's defaults are 25 and 1)",
            options_.bucket_cap_mb, options_.first_bucket_mb);
  DDP_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 3,
            "DistributedDataParallel: zero_stage {} is not a ZeRO stage; valid: 0 (DDP), 1 "
            "(optimizer state sharded), 2 (optimizer state and gradients sharded), 3 (and the "
            "parameters)",
            options_.zero_stage);
  DDP_CHECK(options_.zero_stage < 2 || options_.comm_hook == CommHook::none,
            "DistributedDataParallel: comm_hook {} compresses the all_reduce, which zero_stage "
            "{} replaces by a reduce-scatter; use zero_stage 0 or 1, or comm_hook none",
            comm_hook_name(options_.comm_hook), options_.zero_stage);
  check_devices();
  verify_same_model();
  std::vector<Tensor> state;
  for (auto& [name, t] : module_->named_parameters()) state.push_back(t);
  for (auto& [name, t] : module_->named_buffers()) state.push_back(t);
  broadcast_from_rank0(state);

  if (options_.zero_stage >= 2) return;  // the ZeroOptimizer reduces (Note [zero stages])
  // Reverse registration order (Note [bucket order]).
  std::vector<Tensor> params;
  std::vector<std::string> names;
  const nn::NamedTensors named = module_->named_parameters();
  for (auto it = named.rbegin(); it != named.rend(); ++it) {
    if (!requires_grad(it->second)) continue;
    names.push_back(it->first);
    params.push_back(it->second);
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  const BucketCaps caps{.first_bucket_bytes = static_cast<size_t>(options_.first_bucket_mb * kMiB),
                        .bucket_bytes = static_cast<size_t>(options_.bucket_cap_mb * kMiB)};
  bucket_names_ = names;
  reducer_ = std::make_shared<Reducer>(
      std::move(params), std::move(names), comm_,
      ReducerOptions{.caps = caps,
                     .find_unused = options_.find_unused_parameters,
                     .gradient_as_bucket_view = options_.gradient_as_bucket_view,
                     .comm_hook = builtin_comm_hook(options_.comm_hook)});
  reducer_->install_hooks();
}

DistributedDataParallel::~DistributedDataParallel() {
  if (join_ != nullptr) join_->model_destroyed();  // its finish() is then a ValueError
}

void DistributedDataParallel::check_devices() const {
  auto check = [this](const char* kind, const std::string& name, const Tensor& t) {
    DDP_CHECK_T(DeviceError, comm_->accepts(t.device()),
                "DistributedDataParallel: {} '{}' is on {}, but rank {}'s {} communicator is "
                "bound to {}; move the model there first (module->to(pg.device)) or create the "
                "process group with this rank's device",
                kind, name, t.device().str(), comm_->rank(), comm_->backend(),
                comm_->device().str());
  };
  for (const auto& [name, t] : module_->named_parameters()) check("parameter", name, t);
  for (const auto& [name, t] : module_->named_buffers()) check("buffer", name, t);
}

void DistributedDataParallel::verify_same_model() {
  std::vector<int64_t> records;
  const nn::NamedTensors params = module_->named_parameters();
  const nn::NamedTensors buffers = module_->named_buffers();
  for (const auto& [name, t] : params) append_record(records, 0, t);
  for (const auto& [name, t] : buffers) append_record(records, 1, t);
  const int size = comm_->size();
  const auto num_params = static_cast<int64_t>(params.size());
  const std::vector<int64_t> counts =
      gather(*comm_, {num_params, static_cast<int64_t>(buffers.size())});
  int64_t most = 0;
  for (int r = 0; r < size; ++r) most = std::max(most, counts[2 * r] + counts[2 * r + 1]);
  records.resize(static_cast<size_t>(most * kRecord), -1);
  const std::vector<int64_t> all = gather(*comm_, records);
  const int64_t stride = most * kRecord;
  for (int r = 1; r < size; ++r) {
    for (int64_t k = 0; k < most; ++k) {
      const int64_t* mine = all.data() + k * kRecord;  // rank 0's record
      const int64_t* theirs = all.data() + r * stride + k * kRecord;
      if (std::equal(mine, mine + kRecord, theirs)) continue;
      // Each rank knows its own names only: it names its entry k.
      const auto own = static_cast<size_t>(k);
      const std::string here = own < params.size()
                                   ? fmt::format("parameter '{}'", params[own].first)
                               : own < params.size() + buffers.size()
                                   ? fmt::format("buffer '{}'", buffers[own - params.size()].first)
                                   : std::string("nothing");
      DDP_CHECK(false,
                "DistributedDataParallel: the model differs across ranks: rank 0 has {} "
                "parameters and {} buffers, rank {} has {} and {}; the first difference is "
                "entry {}: {} on rank 0 but {} on rank {} (on this rank, rank {}, entry {} is "
                "{}). Every rank must build the same model (same layers, sizes and dtypes) "
                "before wrapping it",
                counts[0], counts[1], r, counts[2 * r], counts[2 * r + 1], k,
                describe_record(mine, k, counts[0]), describe_record(theirs, k, counts[2 * r]), r,
                comm_->rank(), k, here);
    }
  }
}

void DistributedDataParallel::broadcast_from_rank0(std::vector<Tensor>& tensors) {
  broadcast_from(0, tensors, "ddp broadcast from rank 0");
}

void DistributedDataParallel::broadcast_from(int root, std::vector<Tensor>& tensors,
                                             const char* label) {
  if (comm_->size() == 1) return;
  std::vector<std::shared_ptr<Work>> works;
  const CollectiveLabel labelled(label);
  for (Tensor& t : tensors) works.push_back(comm_->broadcast(t, root));
  for (const auto& work : works) work->wait();
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  if (reducer_ != nullptr) reducer_->prepare(!no_sync_);
  if (zero_.on_forward && grad_mode_enabled()) zero_.on_forward(!no_sync_);
  if (join_ != nullptr) {
    join_->on_forward(!no_sync_ && grad_mode_enabled());  // Note [join] in join.cpp
  } else if (options_.broadcast_buffers) {
    std::vector<Tensor> buffers;
    for (auto& [name, t] : module_->named_buffers()) buffers.push_back(t);
    if (!buffers.empty()) broadcast_from_rank0(buffers);
  }
  return (*module_)(x);  // its hooks too (ZeRO-3 gathers in them)
}

void DistributedDataParallel::backward(const Tensor& loss) {
  ddp::backward(loss);
  finish_backward();
}

void DistributedDataParallel::finish_backward() {
  if (reducer_ == nullptr) {  // zero_stage 2 or 3: the ZeroOptimizer reduces
    if (zero_.on_finish) zero_.on_finish();
    return;
  }
  // The scale is asked for once every bucket is launched (Reducer::finish).
  reducer_->finish([this] { return join_ != nullptr ? join_->grad_scale() : 1.0; });
}

void DistributedDataParallel::register_comm_hook(CommHookFn hook) {
  DDP_CHECK(!hook_registered_,
            "DistributedDataParallel: register_comm_hook was called twice; a model has one comm "
            "hook (as in PyTorch), so register it once, on every rank");
  DDP_CHECK(options_.comm_hook == CommHook::none,
            "DistributedDataParallel: register_comm_hook on a model whose DdpOptions::comm_hook "
            "is {}; choose one: leave comm_hook at none to register your own hook, or call "
            "bf16_compress_hook/fp16_compress_hook from it",
            comm_hook_name(options_.comm_hook));
  DDP_CHECK(reducer_ != nullptr,
            "DistributedDataParallel: register_comm_hook with zero_stage {}: gradients are "
            "reduce-scattered by the ZeroOptimizer, not by comm hooks; use zero_stage 0 or 1",
            options_.zero_stage);
  reducer_->set_comm_hook(std::move(hook));
  hook_registered_ = true;
}

const std::vector<Bucket>& DistributedDataParallel::buckets() const {
  static const std::vector<Bucket> none;
  return reducer_ != nullptr ? reducer_->buckets() : none;
}

void DistributedDataParallel::set_zero_callbacks(ZeroCallbacks callbacks) {
  DDP_CHECK(options_.zero_stage >= 2,
            "DistributedDataParallel: a ZeroOptimizer attaches to a DDP of zero_stage 2 or 3, "
            "not {}; create the DDP with DdpOptions::zero_stage = 2 or 3",
            options_.zero_stage);
  zero_ = std::move(callbacks);
}

bool DistributedDataParallel::buckets_rebuilt() const {
  return reducer_ != nullptr && reducer_->rebuilt();
}

const CommStats& DistributedDataParallel::comm_stats() const {
  static const CommStats none;
  return reducer_ != nullptr ? reducer_->stats() : none;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.no_sync_) {
  ddp_.no_sync_ = true;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  ddp_.no_sync_ = previous_;
}

}  // namespace ddp
