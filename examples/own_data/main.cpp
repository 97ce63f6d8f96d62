// own_data: data that comes from no file -- two interleaved spirals generated in
// memory -- and a model of its own, trained by train_main, so it gets train's
// flags: ddprun with DDP or ZeRO, --resume, --metrics, --save-best, `scale
// --program` sweeps. --synthetic-size sets the number of training points.
#include "runtime/autograd/functions.h"
#include "runtime/data/file_dataset.h"
#include "runtime/nn/layers.h"
#include "trainer/train_main.h"

#include <cmath>
#include <memory>
#include <random>

namespace {

using namespace ddp;

// n points of two spirals of one turn each, class 1 turned half a circle from class 0,
// with noise.
Dataset spirals(int64_t n, uint32_t seed, const std::string& name) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> turn(0.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<float> xy(static_cast<size_t>(2 * n));
  std::vector<int64_t> label(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % 2;
    const float t = turn(gen), angle = 2.0f * 3.14159265f * t + 3.14159265f * static_cast<float>(c);
    xy[2 * i] = t * std::cos(angle) + noise(gen);
    xy[2 * i + 1] = t * std::sin(angle) + noise(gen);
    label[i] = c;
  }
  return make_dataset(from_vector<float>(xy, {n, 2}),
                      from_vector<int64_t>(label, {n}, {.dtype = DType::i64}), name,
                      TargetKind::classify);
}

}  // namespace

int main(int argc, char** argv) {
  auto data = std::make_shared<train::UserData>();
  data->name = "spirals";
  data->load = [](const train::TrainOptions& o) {
    return std::make_pair(spirals(o.synthetic_size, 1, "spirals/train"),
                          spirals(std::max<int64_t>(o.synthetic_size / 5, 100), 2, "spirals/test"));
  };
  auto model = std::make_shared<train::UserModel>();
  model->name = "tanh-mlp";
  model->build = [](const Shape& sample, int64_t outputs, Generator& gen) {
    auto net = std::make_shared<nn::Sequential>();
    net->add(std::make_shared<nn::Linear>(sample.at(0), 64, gen));
    net->add(std::make_shared<nn::Tanh>());
    net->add(std::make_shared<nn::Linear>(64, 64, gen));
    net->add(std::make_shared<nn::Tanh>());
    net->add(std::make_shared<nn::Linear>(64, outputs, gen));
    return net;
  };
  return train::train_main(argc, argv, {.name = "own_data", .model = model, .data = data});
}
