#include "models/train/checkpoint.h"

#include "runtime/checkpoint/safetensors.h"

#include <charconv>

namespace ddp::train {
namespace {

int64_t meta_int(const SafetensorsFile& f, const std::string& path, const char* key) {
  auto it = f.metadata.find(key);
  DDP_CHECK(it != f.metadata.end(), "{}: checkpoint metadata has no '{}'", path, key);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
  DDP_CHECK(ec == std::errc() && ptr == it->second.data() + it->second.size(),
            "{}: checkpoint metadata '{}' = '{}' is not an integer", path, key, it->second);
  return v;
}

std::string meta_str(const SafetensorsFile& f, const std::string& path, const char* key) {
  auto it = f.metadata.find(key);
  DDP_CHECK(it != f.metadata.end(), "{}: checkpoint metadata has no '{}'", path, key);
  return it->second;
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer& optimizer, const CheckpointInfo& info) {
  NamedTensors tensors = model.state_dict();
  for (auto& [name, t] : optimizer.state()) tensors.emplace_back(kOptimizerPrefix + name, t);
  save_safetensors(path, tensors,
                   {{"format", kCheckpointFormat},
                    {"model", info.model},
                    {"optimizer", info.optimizer},
                    {"epoch", std::to_string(info.epoch)},
                    {"step", std::to_string(info.step)},
                    {"seed", std::to_string(info.seed)},
                    {"lr", fmt::format("{}", optimizer.lr())}});
}

CheckpointInfo load_checkpoint(const std::string& path, nn::Module& model,
                               optim::Optimizer& optimizer, const std::string& expected_model) {
  const SafetensorsFile f = load_safetensors(path);
  const std::string format = meta_str(f, path, "format");
  DDP_CHECK(format == kCheckpointFormat, "{}: format '{}' is not a ddp training checkpoint ({})",
            path, format, kCheckpointFormat);
  CheckpointInfo info;
  info.model = meta_str(f, path, "model");
  info.optimizer = meta_str(f, path, "optimizer");
  info.epoch = meta_int(f, path, "epoch");
  info.step = meta_int(f, path, "step");
  info.seed = static_cast<uint64_t>(meta_int(f, path, "seed"));
  DDP_CHECK(info.model == expected_model,
            "{}: the checkpoint holds model '{}', but this run builds '{}'; pass the same --model "
            "and --hidden",
            path, info.model, expected_model);
  DDP_CHECK(info.optimizer == optimizer.name(),
            "{}: the checkpoint was written with --optimizer {}, this run uses {}", path,
            info.optimizer, optimizer.name());
  nn::NamedTensors model_state, optimizer_state;
  for (const auto& [name, t] : f.tensors) {
    if (name.starts_with(kOptimizerPrefix)) {
      optimizer_state.emplace_back(name.substr(std::string(kOptimizerPrefix).size()), t);
    } else {
      model_state.emplace_back(name, t);
    }
  }
  try {
    model.load_state_dict(model_state);
    optimizer.load_state(optimizer_state, info.step);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: {}", path, e.what()));
  }
  return info;
}

}  // namespace ddp::train
