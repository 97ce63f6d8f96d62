// own_model: a model that is not the zoo's (two tanh layers and a linear skip, an
// L1 loss for a regression) trained by train_main, so it gets train's flags:
// data files, ddprun with DDP or ZeRO, --resume, --metrics, --save-best, and
// `scale --program` sweeps. The model and the loss are all this program writes.
#include "runtime/autograd/functions.h"
#include "runtime/nn/layers.h"
#include "trainer/train_main.h"

#include <memory>

namespace {

using namespace ddp;

class SkipNet : public nn::Module {
 public:
  SkipNet(int64_t in, int64_t out, Generator& gen)
      : hidden_(register_module("hidden", std::make_shared<nn::Linear>(in, 64, gen))),
        mix_(register_module("mix", std::make_shared<nn::Linear>(64, 64, gen))),
        head_(register_module("head", std::make_shared<nn::Linear>(64, out, gen))),
        skip_(register_module("skip", std::make_shared<nn::Linear>(in, out, gen))) {}

  std::string name() const override { return "SkipNet"; }
  Tensor forward(const Tensor& x) override {
    const Tensor h = functional::tanh((*mix_)(functional::tanh((*hidden_)(x))));
    return functional::add((*head_)(h), (*skip_)(x));  // a linear path around the tanh layers
  }

 private:
  std::shared_ptr<nn::Linear> hidden_, mix_, head_, skip_;
};

}  // namespace

int main(int argc, char** argv) {
  auto model = std::make_shared<train::UserModel>();
  model->name = "skipnet";
  model->build = [](const Shape& sample, int64_t outputs, Generator& gen) {
    return std::make_shared<SkipNet>(sample.at(0), outputs, gen);
  };
  model->loss = [](const Tensor& output, const Tensor& target) {
    return functional::l1_loss(output, target);
  };
  return train::train_main(argc, argv, {.name = "own_model", .model = model});
}
