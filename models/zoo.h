// The model zoo: models for Fashion-MNIST-shaped inputs [N, 1, 28, 28].
//
//   mlp  Flatten, Linear(784, h1), ReLU, ..., Linear(h_last, 10)   (default h = 256)
//   cnn  Conv2d(1, 32, 3, pad 1), ReLU, MaxPool2d(2), Conv2d(32, 64, 3, pad 1), ReLU,
//        MaxPool2d(2), Flatten, Linear(3136, 128), ReLU, Linear(128, 10)   (421,642 parameters)
//
// The same layers as torch.nn.Sequential, so state_dict names ("1.weight", ...) match
// the equivalent torch model (models/torch_models.py builds it).
#pragma once

#include "runtime/nn/layers.h"

#include <memory>
#include <string>
#include <vector>

namespace ddp::models {

struct ModelConfig {
  std::string name = "mlp";             // mlp | cnn
  std::vector<int64_t> hidden = {256};  // mlp hidden sizes
  int64_t in_channels = 1, height = 28, width = 28;
  int64_t num_classes = 10;
};

// Throws ValueError naming the model and the valid names.
std::shared_ptr<nn::Sequential> make_model(const ModelConfig& config, Generator& gen);
// "784-256-10" style description for logs and checkpoint metadata.
std::string describe(const ModelConfig& config);

}  // namespace ddp::models
