#include "trainer/checkpoint.h"

#include "trainer/sharded_checkpoint.h"

#include "runtime/checkpoint/crc32c.h"
#include "runtime/checkpoint/json.h"
#include "runtime/checkpoint/safetensors.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace ddp::train {
namespace {

// Note [resume mid-epoch]: the data order of an epoch is a pure function of
// (seed, epoch) (Note [sampler shuffle]), and the zoo's models draw no random
// numbers while training (no dropout; a gpt spec with dropout= does, and its mask
// streams restart from their seeds on resume, docs/checkpoints.md), so (seed, epoch,
// epoch_step) restore the data position exactly: a resumed run starts epoch `epoch`, passes over
// the first epoch_step x grad_accum batches (under --drop-last false at most the rank's own,
// which then shadows the rest: Note [uneven epochs] in uneven.h), and continues. The optimizer
// state (momentum, AdamW's moments and step) is in the tensors, the step count and the partial
// epoch loss in the metadata, so the final weights equal an uninterrupted run's bit for bit on the
// CPU (e2e.train_restart_resume). A mid-epoch checkpoint only continues with the same --seed and
// global batch; both are checked.
template <typename T>
T meta_number(const std::map<std::string, std::string>& m, const std::string& path, const char* key,
              std::optional<T> fallback = std::nullopt) {
  auto it = m.find(key);
  if (it == m.end() && fallback) return *fallback;
  DDP_CHECK(it != m.end(), "{}: checkpoint metadata has no '{}'", path, key);
  T v{};
  const char* end = it->second.data() + it->second.size();
  auto [ptr, ec] = std::from_chars(it->second.data(), end, v);
  DDP_CHECK(ec == std::errc() && ptr == end, "{}: checkpoint metadata '{}' = '{}' is not a number",
            path, key, it->second);
  return v;
}

std::string meta_str(const std::map<std::string, std::string>& m, const std::string& path,
                     const char* key) {
  auto it = m.find(key);
  DDP_CHECK(it != m.end(), "{}: checkpoint metadata has no '{}'", path, key);
  return it->second;
}

// The "__metadata__" object of a safetensors header, without reading the tensors.
std::map<std::string, std::string> read_metadata(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DDP_CHECK(f.good(), "{}: cannot open: {}", path, std::strerror(errno));
  unsigned char size_bytes[8] = {};
  f.read(reinterpret_cast<char*>(size_bytes), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | size_bytes[i];
  DDP_CHECK(f.good() && n <= 100'000'000, "{}: not a safetensors file (no valid header length)",
            path);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  DDP_CHECK(f.good(), "{}: the header is cut short ({} bytes expected)", path, n);
  const json::Value root = json::parse(header);
  std::map<std::string, std::string> out;
  const json::Value* meta = root.find("__metadata__");
  if (meta == nullptr || meta->kind != json::Value::Kind::object) return out;
  for (const auto& [key, value] : meta->object) {
    if (value.kind == json::Value::Kind::string) out[key] = value.string;
  }
  return out;
}

// Note [stale temporary files]: save_safetensors writes `<path>.tmp.<pid>` and
// renames it; a process killed in between leaves the temporary file behind. The
// next save removes those of processes that no longer exist on this host (a live
// pid may be another writer; a reused pid keeps its file until a later save).
std::vector<std::string> remove_stale_tmp_files(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string prefix = target.filename().string() + ".tmp.";
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string digits = name.substr(prefix.size());
    pid_t pid = 0;
    auto [ptr, err] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (err != std::errc() || ptr != digits.data() + digits.size() || pid <= 0) continue;
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code removing;
    if (fs::remove(entry.path(), removing)) removed.push_back(entry.path().string());
  }
  return removed;
}

// Note [metadata checksum]: the tensors have their crc32c/ checksums, and the
// metadata of a train checkpoint (its position: step, epoch, epoch_step, seed, the
// loss sum, the best so far) has one of its own: a flipped digit there resumes at
// another step without a word. "metadata_crc32c" is the crc32c, in hex, of every
// other entry as "key=value\n" in key order. Files without it (older) load unchecked.
constexpr const char* kMetadataCrc = "metadata_crc32c";
std::string metadata_crc(const std::map<std::string, std::string>& metadata) {
  uint32_t crc = 0;
  for (const auto& [key, value] : metadata) {
    if (key == kMetadataCrc) continue;
    const std::string line = key + "=" + value + "\n";
    crc = crc32c(line.data(), line.size(), crc);
  }
  return fmt::format("{:08x}", crc);
}

}  // namespace

std::string task_kind(bool language_model, bool regression) {
  return language_model ? "language model" : regression ? "regression" : "classification";
}

std::optional<CheckpointHeader> read_checkpoint_header(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    const auto meta = read_metadata(path);
    const std::string format = meta_str(meta, path, "format");
    DDP_CHECK(format == kCheckpointFormat, "format '{}' is not {}", format, kCheckpointFormat);
    return CheckpointHeader{meta_number<int64_t>(meta, path, "step"),
                            meta_number<int64_t>(meta, path, "epoch")};
  } catch (const ValueError& e) {
    throw ValueError(fmt::format(
        "{} exists but is not a readable train checkpoint ({}); remove it or choose another path",
        path, e.what()));
  }
}

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer& optimizer, const CheckpointInfo& info,
                     std::vector<std::string>* removed, bool never_older) {
  // Note [never older]: a restarted run that did not resume, or resumed from an
  // older file, must not overwrite later progress; equal steps hold the same state.
  if (const auto existing = never_older ? read_checkpoint_header(path) : std::nullopt) {
    DDP_CHECK(existing->step <= info.step,
              "refusing to replace {} (step {}, epoch {}) with an older checkpoint (step {}): "
              "resume from it with --resume auto, or remove it to start over",
              path, existing->step, existing->epoch, info.step);
  }
  auto stale = remove_stale_tmp_files(path);
  if (removed != nullptr) *removed = std::move(stale);
  // Note [zero-3 shard files]: the parameters are in the shard files, sharded.
  NamedTensors tensors = info.zero3_shards ? model.named_buffers() : model.state_dict();
  if (info.optimizer_shards == 0) {
    for (auto& [name, t] : optimizer.state()) tensors.emplace_back(kOptimizerPrefix + name, t);
  }
  std::map<std::string, std::string> metadata{
      {"format", kCheckpointFormat},
      {"model", info.model},
      {"optimizer", info.optimizer},
      {"epoch", std::to_string(info.epoch)},
      {"step", std::to_string(info.step)},
      {"seed", std::to_string(info.seed)},
      {"lr", fmt::format("{}", optimizer.lr())},
      {"epoch_step", std::to_string(info.epoch_step)},
      {"epoch_loss_sum", fmt::format("{}", info.epoch_loss_sum)},
      {"epoch_loss_count", std::to_string(info.epoch_loss_count)},
      {"global_batch", std::to_string(info.global_batch)},
      {"train_size", std::to_string(info.train_size)},
      {"skipped_steps", std::to_string(info.skipped_steps)}};
  if (info.optimizer_shards > 0)
    metadata["optimizer_shards"] = std::to_string(info.optimizer_shards);
  if (info.zero3_shards) metadata.insert_or_assign("zero3_shards", "1");
  if (!info.shard_save_id.empty()) metadata["shard_save_id"] = info.shard_save_id;
  if (!info.text_unit.empty()) metadata["text_unit"] = info.text_unit;
  if (std::isfinite(info.best_metric)) {
    metadata["best_metric"] = fmt::format("{}", info.best_metric);  // shortest round trip
    metadata["evals_since_best"] = std::to_string(info.evals_since_best);
  }
  if (!info.task.empty()) metadata["task"] = info.task;
  if (info.epoch_cursor >= 0) metadata["epoch_cursor"] = std::to_string(info.epoch_cursor);
  if (info.schedule_steps > 0)
    metadata.insert_or_assign("schedule_steps", std::to_string(info.schedule_steps));
  metadata[kMetadataCrc] = metadata_crc(metadata);  // Note [metadata checksum]
  save_safetensors(path, tensors, metadata);
}

std::string read_checkpoint_model(const std::string& path) {
  std::error_code ec;
  DDP_CHECK(std::filesystem::exists(path, ec), "{}: no such file", path);
  const auto meta = read_metadata(path);
  DDP_CHECK(meta.count("format") != 0 && meta.at("format") == kCheckpointFormat,
            "{}: not a checkpoint written by train --save (no metadata format {})", path,
            kCheckpointFormat);
  return meta_str(meta, path, "model");
}

std::string read_checkpoint_text_unit(const std::string& path) {
  read_checkpoint_model(path);  // the same checks
  const auto meta = read_metadata(path);
  return meta.count("text_unit") != 0 ? meta.at("text_unit") : "byte";
}

void load_model_weights(const std::string& path, nn::Module& model) {
  const SafetensorsFile f = load_safetensors(path);
  nn::NamedTensors state;
  for (const auto& [name, t] : f.tensors) {
    if (!name.starts_with(kOptimizerPrefix)) state.emplace_back(name, t);
  }
  try {
    if (f.metadata.count("zero3_shards") != 0) {
      const Zero3Checkpoint shards = load_zero3_shards(
          path, meta_number<int64_t>(f.metadata, path, "optimizer_shards"),
          meta_number<int64_t>(f.metadata, path, "step"), model, {},
          f.metadata.count("shard_save_id") != 0 ? f.metadata.at("shard_save_id") : std::string());
      state.insert(state.end(), shards.parameters.begin(), shards.parameters.end());
    }
    model.load_state_dict(state);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: {}", path, e.what()));
  }
}

CheckpointInfo load_checkpoint(const std::string& path, nn::Module& model,
                               optim::Optimizer& optimizer, const std::string& expected_model,
                               const std::function<bool(const std::string&)>& same_model) {
  const SafetensorsFile f = load_safetensors(path);
  const auto& m = f.metadata;
  const std::string format = meta_str(m, path, "format");
  DDP_CHECK(format == kCheckpointFormat, "{}: format '{}' is not a ddp training checkpoint ({})",
            path, format, kCheckpointFormat);
  CheckpointInfo info;
  info.model = meta_str(m, path, "model");
  info.optimizer = meta_str(m, path, "optimizer");
  info.epoch = meta_number<int64_t>(m, path, "epoch");
  info.step = meta_number<int64_t>(m, path, "step");
  info.seed = meta_number<uint64_t>(m, path, "seed");
  info.epoch_step = meta_number<int64_t>(m, path, "epoch_step", 0);
  info.epoch_loss_sum = meta_number<float>(m, path, "epoch_loss_sum", 0.0f);
  info.epoch_loss_count = meta_number<int64_t>(m, path, "epoch_loss_count", 0);
  info.global_batch = meta_number<int64_t>(m, path, "global_batch", 0);
  info.train_size = meta_number<int64_t>(m, path, "train_size", 0);
  info.skipped_steps = meta_number<int64_t>(m, path, "skipped_steps", 0);
  info.best_metric =
      meta_number<double>(m, path, "best_metric", std::numeric_limits<double>::quiet_NaN());
  info.evals_since_best = meta_number<int64_t>(m, path, "evals_since_best", 0);
  info.task = m.count("task") != 0 ? m.at("task") : "";
  info.epoch_cursor = meta_number<int64_t>(m, path, "epoch_cursor", -1);
  info.schedule_steps = meta_number<int64_t>(m, path, "schedule_steps", 0);
  if (auto crc = m.find(kMetadataCrc); crc != m.end()) {
    DDP_CHECK(crc->second == metadata_crc(m),
              "{}: its metadata (step, epoch, seed, ...) fails its checksum {} (computed {}): the "
              "file's header was damaged; resume from another checkpoint",
              path, crc->second, metadata_crc(m));
  }
  DDP_CHECK(same_model ? same_model(info.model) : info.model == expected_model,
            "{}: the checkpoint holds model '{}', but this run builds '{}'; pass the --model "
            "(and --hidden) it was trained with",
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
  info.optimizer_shards = meta_number<int64_t>(m, path, "optimizer_shards", 0);
  info.zero3_shards = m.count("zero3_shards") != 0;
  if (m.count("shard_save_id") != 0) info.shard_save_id = m.at("shard_save_id");
  DDP_CHECK(!info.zero3_shards || info.optimizer_shards > 0,
            "{}: metadata zero3_shards without optimizer_shards (the number of shard files)", path);
  try {
    if (info.zero3_shards) {
      Zero3Checkpoint shards = load_zero3_shards(path, info.optimizer_shards, info.step, model,
                                                 optimizer.params(), info.shard_save_id);
      model_state.insert(model_state.end(), shards.parameters.begin(), shards.parameters.end());
      optimizer_state = std::move(shards.optimizer);
    }
    model.load_state_dict(model_state);
    if (info.optimizer_shards > 0 && !info.zero3_shards) {
      optimizer_state = load_sharded_state(path, info.optimizer_shards, info.step,
                                           optimizer.params(), info.shard_save_id);
    }
    optimizer.load_state(optimizer_state, info.step - info.skipped_steps);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: {}", path, e.what()));
  }
  return info;
}

}  // namespace ddp::train
