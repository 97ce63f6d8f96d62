#include "models/zoo.h"

#include <charconv>
#include <sstream>

namespace ddp::models {

std::shared_ptr<nn::Sequential> make_model(const ModelConfig& c, Generator& gen) {
  auto model = std::make_shared<nn::Sequential>();
  if (c.name == "mlp") {
    DDP_CHECK(!c.hidden.empty(), "mlp needs at least one hidden layer size");
    model->add(std::make_shared<nn::Flatten>());
    int64_t in = c.in_channels * c.height * c.width;
    for (int64_t h : c.hidden) {
      model->add(std::make_shared<nn::Linear>(in, h, gen));
      model->add(std::make_shared<nn::ReLU>());
      in = h;
    }
    model->add(std::make_shared<nn::Linear>(in, c.num_classes, gen));
    return model;
  }
  if (c.name == "cnn") {
    DDP_CHECK(c.height % 4 == 0 && c.width % 4 == 0,
              "cnn needs inputs whose height and width divide by 4, got {}x{}", c.height, c.width);
    const functional::Conv2dOptions same{.stride = 1, .padding = 1};
    model->add(std::make_shared<nn::Conv2d>(c.in_channels, 32, 3, gen, same));
    model->add(std::make_shared<nn::ReLU>());
    model->add(std::make_shared<nn::MaxPool2d>(2));
    model->add(std::make_shared<nn::Conv2d>(32, 64, 3, gen, same));
    model->add(std::make_shared<nn::ReLU>());
    model->add(std::make_shared<nn::MaxPool2d>(2));
    model->add(std::make_shared<nn::Flatten>());
    model->add(std::make_shared<nn::Linear>(64 * (c.height / 4) * (c.width / 4), 128, gen));
    model->add(std::make_shared<nn::ReLU>());
    model->add(std::make_shared<nn::Linear>(128, c.num_classes, gen));
    return model;
  }
  throw ValueError(fmt::format("unknown model '{}'; valid models: mlp, cnn", c.name));
}

std::string describe(const ModelConfig& c) {
  if (c.name == "mlp") {
    return fmt::format("mlp {}-{}-{}", c.in_channels * c.height * c.width, fmt::join(c.hidden, "-"),
                       c.num_classes);
  }
  return c.name;
}

}  // namespace ddp::models
