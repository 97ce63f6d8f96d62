#include "tests/multirank/ddp_parity.h"

#include "models/zoo.h"
#include "runtime/autograd/functions.h"
#include "runtime/optim/optimizer.h"
#include "tests/multirank/conformance.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>

namespace ddp::test {
namespace {

using functional::cross_entropy;

optim::SGD make_sgd(nn::Module& model) {
  return optim::SGD(model.parameters(), {.lr = 0.1f, .momentum = 0.9f});
}

}  // namespace

std::shared_ptr<nn::Sequential> tiny_mlp(uint64_t seed, std::vector<int64_t> hidden) {
  models::ModelConfig config;
  config.hidden = std::move(hidden);
  Generator gen(seed);
  return models::make_model(config, gen);
}

Batch global_batch(int world, int step, int micro) {
  const int64_t n = world * kRowsPerRank;
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = (i * 7 + step * 3 + micro) % 10;
  const auto seed = static_cast<uint64_t>(1000 + step * 10 + micro);
  return {randn({n, 1, 28, 28}, seed), from_vector<int64_t>(labels, {n})};
}

Batch rank_batch(int world, int rank, int step, int micro) {
  return global_batch(world, step, micro).rows(rank * kRowsPerRank, (rank + 1) * kRowsPerRank);
}

std::shared_ptr<nn::Sequential> train_reference(int world, int micro_batches) {
  auto model = tiny_mlp(1);
  optim::SGD sgd = make_sgd(*model);
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad(true);
    for (int m = 0; m < micro_batches; ++m) {
      const Batch b = global_batch(world, step, m);
      backward(cross_entropy(model->forward(b.x), b.labels));
    }
    sgd.step();
  }
  return model;
}

void train_ddp(DistributedDataParallel& ddp, int rank, int world, int micro_batches) {
  optim::SGD sgd = make_sgd(ddp.module());
  const Device device = ddp.comm()->device();  // the model lives there too
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad(true);
    for (int m = 0; m < micro_batches; ++m) {
      const Batch host = rank_batch(world, rank, step, m);
      const Batch b{host.x.to(device), host.labels.to(device)};
      if (m + 1 < micro_batches) {
        auto guard = ddp.no_sync();
        ddp.backward(cross_entropy(ddp(b.x), b.labels));
      } else {
        ddp.backward(cross_entropy(ddp(b.x), b.labels));
      }
    }
    sgd.step();
  }
}

void expect_close(const nn::Module& got, const nn::Module& want, int rank, double rel_tol) {
  const nn::NamedTensors g = got.named_parameters(), w = want.named_parameters();
  require(g.size() == w.size(), "parameter counts differ");
  for (size_t k = 0; k < g.size(); ++k) {
    const std::vector<float> a = g[k].second.to_vector<float>(), b = w[k].second.to_vector<float>();
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(double(b[i])));
      max_diff = std::max(max_diff, std::abs(double(a[i]) - double(b[i])));
    }
    require(max_diff <= rel_tol * max_ref,
            fmt::format("rank {}: parameter '{}' differs from the single-process reference by {} "
                        "(max |reference| {}, tolerance {} relative)",
                        rank, g[k].first, max_diff, max_ref, rel_tol));
  }
}

void check_parity(const std::shared_ptr<Communicator>& comm, const ParityOptions& options) {
  const int rank = comm->rank(), world = comm->size();
  DdpOptions ddp_options = options.ddp;
  ddp_options.first_bucket_mb = std::min(ddp_options.first_bucket_mb, ddp_options.bucket_cap_mb);
  auto model = tiny_mlp(1 + static_cast<uint64_t>(rank));
  model->to(comm->device());  // Note [communicator devices]
  DistributedDataParallel ddp(model, comm, ddp_options);
  if (ddp_options.bucket_cap_mb < 1e-3) {
    require(ddp.buckets().size() == ddp.module().parameters().size(),
            fmt::format("a tiny cap should give one bucket per parameter, got {}",
                        ddp.buckets().size()));
  }
  if (options.comm_hook) ddp.register_comm_hook(options.comm_hook);
  train_ddp(ddp, rank, world, options.micro_batches);
  const int wire_bytes =
      ddp_options.comm_hook != CommHook::none ? 2 : options.wire_bytes_per_element;
  if (wire_bytes != 0) {  // the hook is in effect
    int64_t numel = 0;
    for (const Tensor& p : ddp.module().parameters()) numel += p.numel();
    require(ddp.comm_stats().bytes == wire_bytes * numel,
            fmt::format("comm hook {}: the last backward sent {} bytes for {} elements, expected "
                        "{} per element",
                        comm_hook_name(ddp_options.comm_hook), ddp.comm_stats().bytes, numel,
                        wire_bytes));
  }
  expect_close(ddp.module(), *train_reference(world, options.micro_batches), rank, options.rel_tol);
}

}  // namespace ddp::test
