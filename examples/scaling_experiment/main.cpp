// A user's own model and training loop with DistributedDataParallel, built
// against an installed ddp: `ddprun -n 2 scaling_experiment [steps] [batch]`.
#include "collectives/bootstrap.h"
#include "collectives/ddp/distributed_data_parallel.h"
#include "runtime/nn/layers.h"
#include "runtime/optim/optimizer.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

using namespace ddp;

// Two layers, registered like torch.nn.Module attributes.
class TwoLayerNet : public nn::Module {
 public:
  explicit TwoLayerNet(Generator& gen)
      : fc1_(register_module("fc1", std::make_shared<nn::Linear>(32, 64, gen))),
        fc2_(register_module("fc2", std::make_shared<nn::Linear>(64, 4, gen))) {}
  Tensor forward(const Tensor& x) override { return (*fc2_)(functional::relu((*fc1_)(x))); }
  std::string name() const override { return "TwoLayerNet"; }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// Each rank draws its own batch; the label is the quadrant of (x0, x1).
std::pair<Tensor, Tensor> make_batch(int64_t batch, uint64_t seed, const Device& device) {
  Tensor x = randn({batch, 32}, seed);
  std::vector<float> v = x.to_vector<float>();
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (v[i * 32] > 0) * 2 + (v[i * 32 + 1] > 0);
  return {x.to(device), from_vector(labels, {batch}, {.dtype = DType::i64, .device = device})};
}

// argv[i] as a whole number of at least 1, or `fallback` when absent; exits 2
// naming the argument otherwise.
long long positive_arg(int argc, char** argv, int i, const char* what, long long fallback) {
  if (argc <= i) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || errno != 0 || v < 1 || v > 100000000) {
    std::fprintf(stderr,
                 "scaling_experiment: %s '%s': expected a whole number from 1 to 100000000\n"
                 "usage: scaling_experiment [steps (200)] [batch per rank (64)]\n",
                 what, argv[i]);
    std::exit(2);
  }
  return v;
}

int main(int argc, char** argv) try {
  const int steps = static_cast<int>(positive_arg(argc, argv, 1, "steps", 200));
  const int64_t batch = positive_arg(argc, argv, 2, "batch", 64);  // per rank
  ProcessGroup pg = init_process_group();
  const int rank = pg.env.rank, world = pg.comm->size();

  Generator gen(/*seed=*/1);  // DDP broadcasts rank 0's values anyway
  auto model = std::make_shared<TwoLayerNet>(gen);
  model->to(pg.device);
  DistributedDataParallel ddp_model(model, pg.comm);
  optim::SGD opt(model->parameters(), {.lr = 0.05f, .momentum = 0.9f});

  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = make_batch(batch, 1000 + step * world + rank, pg.device);
    opt.zero_grad();
    Tensor loss = functional::cross_entropy(ddp_model(x), y);
    ddp_model.backward(loss);  // every .grad is now the average over ranks
    opt.step();
    if (step == 0 || (step + 1) % 50 == 0 || step + 1 == steps)
      std::printf("rank %d step %d loss %.4f\n", rank, step + 1, loss.item<float>());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  double checksum = 0;  // equal on every rank: DDP keeps the replicas identical
  for (const Tensor& p : model->parameters())
    for (float v : p.cpu().to_vector<float>()) checksum += v;
  std::printf("rank %d parameter checksum %.6f\n", rank, checksum);
  if (rank == 0)
    std::printf(
        "throughput: %.0f samples/s (world size %d, batch %lld per rank, %d steps, %.2f s)\n",
        steps * batch * world / s, world, static_cast<long long>(batch), steps, s);
  return 0;
} catch (const ddp::Error& e) {  // every ddp error is an exception (docs/api.md)
  std::fprintf(stderr, "scaling_experiment: error: %s\n", e.what());
  return 1;
}
