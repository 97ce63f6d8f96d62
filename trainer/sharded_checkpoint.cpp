#include "trainer/sharded_checkpoint.h"

#include "runtime/checkpoint/safetensors.h"
#include "runtime/ops/ops.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>

namespace ddp::train {
namespace {

int64_t meta_int(const SafetensorsFile& f, const std::string& path, const char* key) {
  auto it = f.metadata.find(key);
  DDP_CHECK(it != f.metadata.end(), "{}: not a shard written by train --save-sharded (no '{}')",
            path, key);
  return std::stoll(it->second);
}

}  // namespace

std::string shard_path(const std::string& path, int rank, int world) {
  return fmt::format("{}.shard{}of{}", path, rank, world);
}

void save_optimizer_shard(const std::string& path, const ZeroOptimizer& zero, int64_t step) {
  const ShardRange s = zero.shard();
  const std::string file = shard_path(path, zero.rank(), zero.world_size());
  std::error_code ec;
  if (std::filesystem::exists(file, ec)) {
    const SafetensorsFile old = load_safetensors(file);
    const int64_t old_step = meta_int(old, file, "step");
    DDP_CHECK(old_step <= step,
              "refusing to replace {} (step {}) with an older shard (step {}): resume from its "
              "checkpoint with --resume auto, or remove it to start over",
              file, old_step, step);
  }
  nn::NamedTensors tensors;
  for (const auto& [name, t] : zero.shard_state()) tensors.emplace_back(name, t.cpu());
  save_safetensors(file, tensors,
                   {{"format", kShardFormat},
                    {"rank", std::to_string(zero.rank())},
                    {"world_size", std::to_string(zero.world_size())},
                    {"begin", std::to_string(s.begin)},
                    {"numel", std::to_string(zero.numel())},
                    {"step", std::to_string(step)}});
}

nn::NamedTensors load_sharded_state(const std::string& path, int64_t world, int64_t step,
                                    const std::vector<Tensor>& params) {
  std::vector<int64_t> starts{0};
  for (const Tensor& p : params) starts.push_back(starts.back() + p.numel());
  const int64_t numel = starts.back();
  std::vector<std::string> order;  // buffer names, as the shards list them
  std::map<std::string, Tensor> wholes;
  std::map<std::string, int64_t> covered;
  Tensor steps;
  for (int64_t r = 0; r < world; ++r) {
    const std::string file = shard_path(path, static_cast<int>(r), static_cast<int>(world));
    std::error_code ec;
    DDP_CHECK(std::filesystem::exists(file, ec),
              "{}: the checkpoint names {} optimizer shards, but {} is missing; copy every "
              "shard file next to it",
              path, world, file);
    const SafetensorsFile f = load_safetensors(file);
    DDP_CHECK(meta_int(f, file, "step") == step && meta_int(f, file, "world_size") == world &&
                  meta_int(f, file, "rank") == r && meta_int(f, file, "numel") == numel,
              "{}: shard of step {}, rank {} of {}, {} elements; the checkpoint {} is step {} of "
              "{} ranks and the model has {} elements (a save that did not finish, or files "
              "of another run)",
              file, meta_int(f, file, "step"), meta_int(f, file, "rank"),
              meta_int(f, file, "world_size"), meta_int(f, file, "numel"), path, step, world,
              numel);
    const int64_t begin = meta_int(f, file, "begin");
    for (const auto& [name, t] : f.tensors) {
      if (name == "step") {
        if (r == 0) steps = t;
        continue;
      }
      DDP_CHECK(begin >= 0 && begin + t.numel() <= numel,
                "{}: '{}' of {} elements at {} exceeds {}", file, name, t.numel(), begin, numel);
      if (wholes.count(name) == 0) {
        order.push_back(name);
        wholes[name] = zeros({numel});
      }
      Tensor dst = wholes[name].flat_view(begin, {t.numel()});
      copy_(dst, t.reshape({t.numel()}));
      covered[name] += t.numel();
    }
  }
  nn::NamedTensors state;
  for (const auto& [name, n] : covered) {
    DDP_CHECK(n == numel, "{}: the shards hold {} of the {} elements of '{}'", path, n, numel,
              name);
  }
  if (order.empty()) return state;  // saved before the first step
  for (size_t i = 0; i < params.size(); ++i) {
    for (const std::string& name : order) {
      state.emplace_back(fmt::format("{}.{}", i, name),
                         wholes[name].flat_view(starts[i], params[i].shape()));
    }
    if (steps.defined()) {
      state.emplace_back(fmt::format("{}.step", i),
                         steps.flat_view(static_cast<int64_t>(i), {1}).clone());
    }
  }
  return state;
}

}  // namespace ddp::train
