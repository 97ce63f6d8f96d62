#include "models/train/zoo_catalog.h"

#include "models/gpt_config.h"
#include "models/zoo.h"
#include "runtime/error.h"

namespace ddp::models {

std::shared_ptr<const train::ModelCatalog> zoo_catalog() {
  static const std::shared_ptr<const train::ModelCatalog> catalog = [] {
    auto c = std::make_shared<train::ModelCatalog>();
    c->names = "mlp|cnn|gpt-tiny|gpt-mini|gpt2|gpt:layers=L,d=D,heads=H,ctx=T";
    c->check = [](const std::string& name) {
      if (is_gpt_model(name)) {
        gpt_config(name);  // a bad spec names what is wrong with it
        return;
      }
      DDP_CHECK(name == "mlp" || name == "cnn",
                "--model '{}': valid values are mlp, cnn, gpt-tiny, gpt-mini, gpt2, gpt:...", name);
    };
    c->is_language_model = [](const std::string& name) { return is_gpt_model(name); };
    // The mlp flattens [D] or [C, H, W]; the cnn takes [C, H, W] (28 x 28 images).
    c->build = [](const train::ModelChoice& choice, const Shape& sample, int64_t outputs,
                  Generator& gen) {
      ModelConfig config{.name = choice.name, .hidden = choice.hidden};
      const bool image = sample.size() == 3;
      config.in_channels = image ? sample[0] : 1;
      config.height = image ? sample[1] : sample[0];
      config.width = image ? sample[2] : 1;
      config.num_classes = outputs;
      auto model = make_model(config, gen);
      return train::BuiltModel{model, describe(config)};
    };
    c->make_language_task = train::make_language_task;
    return c;
  }();
  return catalog;
}

}  // namespace ddp::models
