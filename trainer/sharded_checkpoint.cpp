#include "trainer/sharded_checkpoint.h"

#include "runtime/checkpoint/safetensors.h"
#include "runtime/ops/ops.h"

#include <fmt/ranges.h>
#include "runtime/fmt.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <unordered_map>

namespace ddp::train {
namespace {

int64_t meta_int(const SafetensorsFile& f, const std::string& path, const char* key) {
  auto it = f.metadata.find(key);
  DDP_CHECK(it != f.metadata.end(), "{}: not a shard written by train --save-sharded (no '{}')",
            path, key);
  return std::stoll(it->second);
}

std::string meta_text(const SafetensorsFile& f, const std::string& path, const char* key) {
  auto it = f.metadata.find(key);
  DDP_CHECK(it != f.metadata.end(), "{}: not a shard written by train --save-sharded (no '{}')",
            path, key);
  return it->second;
}

// A shard of the save the manifest `path` names (save_id; "" for an older
// manifest, which names none).
void check_save_id(const SafetensorsFile& f, const std::string& file, const std::string& path,
                   const std::string& save_id) {
  if (save_id.empty()) return;
  const auto it = f.metadata.find("save_id");
  const std::string got = it == f.metadata.end() ? std::string("none") : it->second;
  DDP_CHECK(got == save_id,
            "{}: a shard of another save (its save_id is {}, the checkpoint {} names {}): a file "
            "of another run, or of another save of this one, was put in its place; put back the "
            "shard files written with {}, or resume from another checkpoint",
            file, got, path, save_id, path);
}

std::vector<std::string> split_names(const std::string& joined) {
  std::vector<std::string> names;
  for (size_t begin = 0; !joined.empty() && begin <= joined.size();) {
    const size_t end = std::min(joined.find(',', begin), joined.size());
    names.push_back(joined.substr(begin, end - begin));
    begin = end + 1;
  }
  return names;
}

// Rank r's shard file of the checkpoint `path` of `world` shards and step `step`,
// which must exist; a file of the naming before Note [shard generations] (no
// ".step<N>") is taken where the step's is absent (its step is checked as any).
std::string shard_file(const std::string& path, int64_t world, int64_t r, int64_t step) {
  const std::string file = shard_path(path, static_cast<int>(r), static_cast<int>(world), step);
  std::error_code ec;
  if (std::filesystem::exists(file, ec)) return file;
  const std::string unnumbered = fmt::format("{}.shard{}of{}", path, r, world);
  if (std::filesystem::exists(unnumbered, ec)) return unnumbered;
  throw ValueError(fmt::format(
      "{}: the checkpoint names {} optimizer shards of step {}, but {} is missing; copy every "
      "shard file next to it",
      path, world, step, file));
}

// The names of the sharded parameters in the optimizer's order (that of "step").
std::vector<std::string> optimizer_param_names(const ZeroOptimizer& zero,
                                               const FullyShardedParameters& fsdp) {
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t e = 0; e < fsdp.parameters().size(); ++e) {
    index.emplace(&fsdp.parameters()[e].impl(), e);
  }
  std::vector<std::string> names;
  for (const Tensor& p : zero.params()) {
    auto it = index.find(&p.impl());
    DDP_ASSERT(it != index.end(), "an optimizer parameter is not sharded (attach() checks it)");
    names.push_back(fsdp.parameter_names()[it->second]);
  }
  return names;
}

// Note [zero-3 shard files].
void save_zero3_shard(const std::string& file, const ZeroOptimizer& zero, int64_t step,
                      const std::string& save_id) {
  const FullyShardedParameters* fsdp = zero.fully_sharded();
  DDP_CHECK(fsdp != nullptr,
            "--save-sharded at --zero 3: the ZeroOptimizer is not attached to the DDP yet "
            "(attach() shards the parameters)");
  const auto& units = fsdp->units();
  const std::vector<int64_t>& offsets = zero.unit_state_offsets();
  const nn::NamedTensors state = zero.shard_state();
  nn::NamedTensors tensors;
  std::map<std::string, std::string> metadata{
      {"format", kShardFormat},
      {"layout", kZero3Layout},
      {"rank", std::to_string(zero.rank())},
      {"world_size", std::to_string(zero.world_size())},
      {"step", std::to_string(step)},
      {"save_id", save_id},
      {"optimizer_params", fmt::format("{}", fmt::join(optimizer_param_names(zero, *fsdp), ","))}};
  for (size_t u = 0; u < units.size(); ++u) {
    const auto& unit = units[u];
    if (unit.params.empty()) continue;
    std::vector<std::string> names;
    for (size_t e : unit.params) names.push_back(fsdp->parameter_names()[e]);
    metadata[fmt::format("unit{}", u)] = fmt::format("{}", fmt::join(names, ","));
    tensors.emplace_back(fmt::format("unit{}.param", u), unit.shard.cpu());
    for (const auto& [buffer, t] : state) {
      if (buffer == "step") continue;
      tensors.emplace_back(fmt::format("unit{}.{}", u, buffer),
                           t.flat_view(offsets[u], {unit.block}).cpu());
    }
  }
  for (const auto& [buffer, t] : state) {
    if (buffer == "step") tensors.emplace_back(buffer, t.cpu());
  }
  save_safetensors(file, tensors, metadata);
}

// The W files of a --zero 3 checkpoint, read: per unit ("unit<u>") its parameter
// names, and per tensor ("unit<u>.param", "unit<u>.exp_avg", ...) its W blocks
// concatenated.
struct Zero3Files {
  std::vector<std::pair<std::string, std::vector<std::string>>> units;  // in unit order
  std::map<std::string, Tensor> flats;
  std::vector<std::string> buffers;  // the optimizer state's, as rank 0's first unit has them
  Tensor steps;                      // AdamW's, one per optimizer parameter of the saving run
  std::vector<std::string> step_names;
};

// The "unit<u>" metadata of a --zero 3 shard file, by u.
std::map<int64_t, std::string> unit_entries(const SafetensorsFile& f) {
  std::map<int64_t, std::string> units;
  for (const auto& [key, value] : f.metadata) {
    const std::string digits = key.starts_with("unit") ? key.substr(4) : "";
    if (!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos) {
      units[std::stoll(digits)] = value;
    }
  }
  return units;
}

void check_zero3_shard(const SafetensorsFile& f, const std::string& file, const std::string& path,
                       int64_t world, int64_t step, int64_t r, const std::string& save_id) {
  auto layout = f.metadata.find("layout");
  DDP_CHECK(layout != f.metadata.end() && layout->second == kZero3Layout,
            "{}: not a --zero 3 shard (no metadata layout '{}'), but the checkpoint {} names "
            "--zero 3 shard files (zero3_shards): files of another run",
            file, kZero3Layout, path);
  DDP_CHECK(meta_int(f, file, "step") == step && meta_int(f, file, "world_size") == world &&
                meta_int(f, file, "rank") == r,
            "{}: shard of step {}, rank {} of {}; the checkpoint {} is step {} of {} ranks, so "
            "this file should be rank {}'s of step {} (a save that did not finish, or files of "
            "another run)",
            file, meta_int(f, file, "step"), meta_int(f, file, "rank"),
            meta_int(f, file, "world_size"), path, step, world, r, step);
  check_save_id(f, file, path, save_id);
}

// Rank 0's file sets the units and the tensors' block sizes; every file's blocks
// go to their place in the flats.
Zero3Files read_zero3_files(const std::string& path, int64_t world, int64_t step,
                            const std::string& save_id) {
  Zero3Files out;
  const std::string first = shard_path(path, 0, static_cast<int>(world), step);
  std::map<int64_t, std::string> units;
  std::map<std::string, int64_t> blocks;  // tensor name -> elements per rank
  for (int64_t r = 0; r < world; ++r) {
    const std::string file = shard_file(path, world, r, step);
    const SafetensorsFile f = load_safetensors(file);
    check_zero3_shard(f, file, path, world, step, r, save_id);
    if (r == 0) {
      units = unit_entries(f);
      for (const auto& [u, names] : units) {
        out.units.emplace_back(fmt::format("unit{}", u), split_names(names));
      }
      out.step_names = split_names(meta_text(f, file, "optimizer_params"));
      for (const auto& [name, t] : f.tensors) {
        if (name == "step") {
          out.steps = t.reshape({t.numel()});
          continue;
        }
        blocks[name] = t.numel();
        out.flats[name] = empty({world * t.numel()}, {.dtype = t.dtype()});
        const std::string prefix = out.units.empty() ? "" : out.units.front().first + ".";
        if (!prefix.empty() && name.starts_with(prefix) && name != prefix + "param") {
          out.buffers.push_back(name.substr(prefix.size()));
        }
      }
    }
    DDP_CHECK(unit_entries(f) == units,
              "{}: its units (metadata unit<u>) differ from those of {}: files of another run",
              file, first);
    size_t seen = 0;
    for (const auto& [name, t] : f.tensors) {
      if (name == "step") continue;
      auto it = blocks.find(name);
      DDP_CHECK(it != blocks.end() && it->second == t.numel(),
                "{}: '{}' of {} elements, where {} has {}: files of another run", file, name,
                t.numel(), first,
                it == blocks.end() ? std::string("none") : std::to_string(it->second));
      Tensor dst = out.flats[name].flat_view(r * t.numel(), {t.numel()});
      copy_(dst, t.reshape({t.numel()}));
      ++seen;
    }
    DDP_CHECK(seen == blocks.size(), "{}: {} of the {} unit tensors {} holds: files of another run",
              file, seen, blocks.size(), first);
  }
  return out;
}

// Cuts each unit's flats by parameter name: name -> tensor ("param", buffers) -> values.
std::map<std::string, std::map<std::string, Tensor>> cut_units(const Zero3Files& files,
                                                               const std::string& path,
                                                               int64_t world, int64_t step,
                                                               const nn::Module& model) {
  const std::string first = shard_path(path, 0, static_cast<int>(world), step);
  std::map<std::string, Tensor> params;
  for (const auto& [name, t] : model.named_parameters()) params.emplace(name, t);
  std::vector<std::string> tensors{"param"};
  tensors.insert(tensors.end(), files.buffers.begin(), files.buffers.end());
  std::map<std::string, std::map<std::string, Tensor>> values;
  for (const auto& [unit, names] : files.units) {
    std::vector<int64_t> starts{0};
    for (const std::string& name : names) {
      auto it = params.find(name);
      DDP_CHECK(it != params.end(),
                "{}: {} holds parameter '{}', which this model does not have (a checkpoint of "
                "another model?)",
                first, unit, name);
      DDP_CHECK(values.count(name) == 0, "{}: parameter '{}' is in two units", first, name);
      values[name];
      starts.push_back(starts.back() + it->second.numel());
    }
    for (const std::string& what : tensors) {
      const std::string key = unit + "." + what;
      auto flat = files.flats.find(key);
      DDP_CHECK(flat != files.flats.end(), "{}: no '{}' (every unit has '{}' and its state)", first,
                key, what);
      DDP_CHECK(starts.back() <= flat->second.numel(),
                "{}: the {} blocks of '{}' hold {} elements, but its parameters ({}) have {} in "
                "this model; the blocks must cover them (files of another model or run)",
                first, world, key, flat->second.numel(), fmt::join(names, ", "), starts.back());
      for (size_t k = 0; k < names.size(); ++k) {
        values[names[k]][what] = flat->second.flat_view(starts[k], params.at(names[k]).shape());
      }
    }
  }
  return values;
}

}  // namespace

std::string shard_path(const std::string& path, int rank, int world, int64_t step) {
  return fmt::format("{}.shard{}of{}.step{}", path, rank, world, step);
}

std::vector<std::string> remove_other_shard_generations(const std::string& path, int rank,
                                                        int64_t keep_step) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string prefix = target.filename().string() + ".shard";
  std::vector<std::string> removed;
  std::error_code ec;
  // Best effort, never a throw: the save it follows is committed (increment(ec),
  // not the range-for's throwing ++).
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    // shard<r>of<W>, then ".step<N>" (none: the naming before generations), then
    // ".tmp.<pid>" for a write that did not finish.
    int r = -1, world = 0;
    long long step = -1;
    int used = 0;
    const std::string rest = name.substr(prefix.size());
    if (std::sscanf(rest.c_str(), "%dof%d%n", &r, &world, &used) != 2 || r < 0 || world <= r) {
      continue;
    }
    std::string tail = rest.substr(static_cast<size_t>(used));
    if (tail.starts_with(".step")) {
      int step_used = 0;
      if (std::sscanf(tail.c_str(), ".step%lld%n", &step, &step_used) != 1) continue;
      tail = tail.substr(static_cast<size_t>(step_used));
    }
    if (!tail.empty() && !tail.starts_with(".tmp.")) continue;  // not ours
    if (rank >= 0 && r != rank) continue;
    if (tail.empty() && step == keep_step) continue;  // the generation the manifest names
    if (!tail.empty()) {  // a temporary file: only when its writer is gone
      const int pid = std::atoi(tail.c_str() + 5);
      if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    }
    std::error_code removing;
    if (fs::remove(entry.path(), removing)) removed.push_back(entry.path().string());
  }
  return removed;
}

void save_optimizer_shard(const std::string& path, const ZeroOptimizer& zero, int64_t step,
                          const std::string& save_id) {
  // Note [shard generations]: a file of its own per step; never an earlier one replaced.
  const std::string file = shard_path(path, zero.rank(), zero.world_size(), step);
  if (zero.stage() == 3) {
    save_zero3_shard(file, zero, step, save_id);
    return;
  }
  const ShardRange s = zero.shard();
  nn::NamedTensors tensors;
  for (const auto& [name, t] : zero.shard_state()) tensors.emplace_back(name, t.cpu());
  save_safetensors(file, tensors,
                   {{"format", kShardFormat},
                    {"rank", std::to_string(zero.rank())},
                    {"world_size", std::to_string(zero.world_size())},
                    {"begin", std::to_string(s.begin)},
                    {"numel", std::to_string(zero.numel())},
                    {"step", std::to_string(step)},
                    {"save_id", save_id}});
}

nn::NamedTensors load_sharded_state(const std::string& path, int64_t world, int64_t step,
                                    const std::vector<Tensor>& params, const std::string& save_id) {
  std::vector<int64_t> starts{0};
  for (const Tensor& p : params) starts.push_back(starts.back() + p.numel());
  const int64_t numel = starts.back();
  std::vector<std::string> order;  // buffer names, as the shards list them
  std::map<std::string, Tensor> wholes;
  std::map<std::string, int64_t> covered;
  Tensor steps;
  for (int64_t r = 0; r < world; ++r) {
    const std::string file = shard_file(path, world, r, step);
    const SafetensorsFile f = load_safetensors(file);
    DDP_CHECK(meta_int(f, file, "step") == step && meta_int(f, file, "world_size") == world &&
                  meta_int(f, file, "rank") == r && meta_int(f, file, "numel") == numel,
              "{}: shard of step {}, rank {} of {}, {} elements; the checkpoint {} is step {} of "
              "{} ranks and the model has {} elements (a save that did not finish, or files "
              "of another run)",
              file, meta_int(f, file, "step"), meta_int(f, file, "rank"),
              meta_int(f, file, "world_size"), meta_int(f, file, "numel"), path, step, world,
              numel);
    check_save_id(f, file, path, save_id);
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

Zero3Checkpoint load_zero3_shards(const std::string& path, int64_t world, int64_t step,
                                  const nn::Module& model,
                                  const std::vector<Tensor>& optimizer_params,
                                  const std::string& save_id) {
  const Zero3Files files = read_zero3_files(path, world, step, save_id);
  auto values = cut_units(files, path, world, step, model);
  Zero3Checkpoint out;
  std::unordered_map<const TensorImpl*, std::string> name_of;
  for (const auto& [name, t] : model.named_parameters()) {
    auto it = values.find(name);
    DDP_CHECK(it != values.end(),
              "the shard files of {} hold no parameter '{}' of the model (files of another "
              "model?)",
              path, name);
    out.parameters.emplace_back(name, it->second.at("param"));
    name_of.emplace(&t.impl(), name);
  }
  if (files.buffers.empty()) return out;  // saved before the first step
  std::map<std::string, int64_t> step_of;
  for (size_t j = 0; j < files.step_names.size(); ++j) {
    step_of.emplace(files.step_names[j], static_cast<int64_t>(j));
  }
  DDP_CHECK(!files.steps.defined() ||
                files.steps.numel() == static_cast<int64_t>(files.step_names.size()),
            "{}: 'step' has {} counts for {} optimizer parameters: files of another run",
            shard_path(path, 0, static_cast<int>(world), step), files.steps.numel(),
            files.step_names.size());
  for (size_t i = 0; i < optimizer_params.size(); ++i) {
    auto it = name_of.find(&optimizer_params[i].impl());
    DDP_CHECK(it != name_of.end(),
              "optimizer parameter {} is not a parameter of the model; a --zero 3 sharded "
              "checkpoint restores the state of the model's parameters by name",
              i);
    for (const std::string& buffer : files.buffers) {
      out.optimizer.emplace_back(fmt::format("{}.{}", i, buffer), values[it->second].at(buffer));
    }
    auto s = step_of.find(it->second);
    if (files.steps.defined() && s != step_of.end()) {
      out.optimizer.emplace_back(fmt::format("{}.step", i),
                                 files.steps.flat_view(s->second, {1}).clone());
    }
  }
  return out;
}

}  // namespace ddp::train
