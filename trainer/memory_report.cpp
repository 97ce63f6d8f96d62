#include "trainer/memory_report.h"

#include "collectives/collective_events.h"
#include "runtime/autograd/autograd.h"
#include "runtime/memory/allocator.h"

#include <set>

namespace ddp::train {
namespace {

// Bytes of the optimizer's state on this rank: a ZeroOptimizer's shard, or every
// tensor of a plain optimizer's state().
int64_t optimizer_state_bytes(const Run& r) {
  if (r.zero != nullptr) return r.zero->state_bytes();
  int64_t total = 0;
  for (const auto& [name, t] : r.optimizer->state()) total += bytes_of(t);
  return total;
}

// Bytes of the gradients this rank holds: every parameter's .grad (under DDP
// views of its buckets, counted once per storage) and a ZeRO-2 gradient shard.
int64_t gradient_bytes(const Run& r) {
  int64_t total = r.zero != nullptr ? r.zero->grad_shard_bytes() : 0;
  std::set<const void*> seen;
  for (const Tensor& p : r.model->parameters()) {
    const Tensor g = grad(p);
    if (g.defined() && seen.insert(g.data_ptr()).second) total += bytes_of(g);
  }
  return total;
}

// Bytes of parameters this rank keeps between steps: ZeRO-3's shards (the units
// it gathers come and go), else every parameter.
int64_t parameter_bytes(const Run& r) {
  if (r.zero != nullptr && r.zero->fully_sharded() != nullptr) {
    return r.zero->fully_sharded()->shard_bytes();
  }
  int64_t total = 0;
  for (const Tensor& p : r.model->parameters()) total += static_cast<int64_t>(p.nbytes());
  return total;
}

}  // namespace

void measure_memory(Run& r, EpochMetrics& m) {
  const std::vector<int64_t> mine = {static_cast<int64_t>(max_memory_allocated(r.device)),
                                     optimizer_state_bytes(r), gradient_bytes(r),
                                     parameter_bytes(r)};
  std::vector<int64_t> all = mine;
  if (r.pg != nullptr && r.world_size > 1) {
    Communicator& comm = *r.pg->comm;
    const auto n = static_cast<int64_t>(mine.size());
    Tensor input = from_vector<int64_t>(mine, {n}, {.dtype = DType::i64, .device = comm.device()});
    Tensor output = empty({n * comm.size()}, {.dtype = DType::i64, .device = comm.device()});
    const CollectiveLabel labelled("train memory report");
    comm.all_gather(input, output)->wait();
    all = output.to_vector<int64_t>();
  }
  m.rank_peak_allocated.clear();
  m.rank_optimizer_state.clear();
  m.rank_gradient_bytes.clear();
  m.rank_parameter_bytes.clear();
  for (size_t k = 0; k + 3 < all.size(); k += 4) {
    m.rank_peak_allocated.push_back(all[k]);
    m.rank_optimizer_state.push_back(all[k + 1]);
    m.rank_gradient_bytes.push_back(all[k + 2]);
    m.rank_parameter_bytes.push_back(all[k + 3]);
  }
}

}  // namespace ddp::train
