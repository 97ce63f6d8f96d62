#include "models/train/run_log.h"

#include "runtime/error.h"

#include <fmt/ranges.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <sstream>

namespace ddp::train {
namespace {

// Note [rows cut back]: a run killed after its last checkpoint wrote rows for the
// steps after it (and maybe half a row: a SIGKILL lands between two writes of
// the stream's buffer). The resumed run trains those steps again, so it first
// cuts the file back to the checkpoint: from the end, an unterminated last line
// and every row beyond the checkpoint's position go; the replay writes them
// again. Rows up to a checkpoint are flushed before it is written, so the file
// never lacks rows the checkpoint covers. A fresh start under --resume auto (no
// checkpoint yet) cuts back to step 0: an attempt that died before its first
// checkpoint leaves no rows twice. With --resume the files thus belong to the
// job; a run without --resume appends everything (a new run's rows).
// Returns the rows cut.
template <typename Beyond>
int64_t cut_back(const std::string& flag, const std::string& path, Beyond beyond) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return 0;  // none yet
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t last_newline = text.rfind('\n');
  size_t keep = last_newline == std::string::npos ? 0 : last_newline + 1;
  int64_t cut = keep < text.size() ? 1 : 0;  // the unterminated last line
  while (keep > 0) {
    const size_t before = keep == 1 ? std::string::npos : text.rfind('\n', keep - 2);
    const size_t begin = before == std::string::npos ? 0 : before + 1;
    const std::string line = text.substr(begin, keep - 1 - begin);
    if (line.empty() || !beyond(line)) break;
    keep = begin;
    ++cut;
  }
  if (cut == 0) return 0;
  std::error_code ec;
  std::filesystem::resize_file(path, keep, ec);
  DDP_CHECK(!ec, "{} {}: cannot cut it back to the resumed step ({} rows beyond it): {}", flag,
            path, cut, ec.message());
  return cut;
}

// The integer after `"key": ` in a metrics row; -1 when absent.
int64_t json_int_field(const std::string& row, const std::string& key) {
  const std::string needle = "\"" + key + "\": ";
  const auto at = row.find(needle);
  if (at == std::string::npos) return -1;
  return std::strtoll(row.c_str() + at + needle.size(), nullptr, 10);
}

// Note [straggler report]: ddp rows with every rank's figures.
std::string straggler_fields(const EpochMetrics& m) {
  if (m.rank_compute_ms.empty()) return "";
  const auto list = [](const std::vector<double>& v) {
    std::string out;
    for (double x : v) out += fmt::format("{}{:.4f}", out.empty() ? "" : ", ", x);
    return "[" + out + "]";
  };
  return fmt::format(", \"rank_compute_ms\": {}, \"rank_wait_ms\": {}, \"stragglers\": [{}]",
                     list(m.rank_compute_ms), list(m.rank_wait_ms), fmt::join(m.stragglers, ", "));
}

// Bytes per rank (models/train/memory_report.h).
std::string memory_fields(const EpochMetrics& m) {
  if (m.rank_peak_allocated.empty()) return "";
  return fmt::format(
      ", \"rank_peak_allocated\": [{}], \"rank_optimizer_state\": [{}], "
      "\"rank_gradient_bytes\": [{}]",
      fmt::join(m.rank_peak_allocated, ", "), fmt::join(m.rank_optimizer_state, ", "),
      fmt::join(m.rank_gradient_bytes, ", "));
}

}  // namespace

std::ofstream open_for_append(const std::string& flag, const std::string& path) {
  errno = 0;
  std::ofstream f(path, std::ios::app);
  DDP_CHECK(f.good(),
            "{} {}: cannot open for appending: {}; the directory must exist and be writable", flag,
            path, errno != 0 ? std::strerror(errno) : "unknown error");
  return f;
}

void check_can_create(const std::string& flag, const std::string& path) {
  std::error_code ec;
  DDP_CHECK(!std::filesystem::is_directory(path, ec),
            "{} {}: is a directory; expected a file path such as {}/checkpoint.safetensors", flag,
            path, path);
  const std::string probe = fmt::format("{}.tmp.{}", path, ::getpid());
  // This process has written nothing yet: a file of this name is a temporary of
  // a crashed earlier process that had the same pid (a container's restart).
  ::unlink(probe.c_str());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  DDP_CHECK(fd >= 0,
            "{} {}: cannot create a file there ({}: {}); the directory must exist and be "
            "writable (train does not create it, as torch.save does not)",
            flag, path, probe, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

MetricsLog::MetricsLog(const std::string& path, const std::optional<RunPosition>& start) {
  if (path.empty()) return;
  if (start) {
    cut_ = cut_back("--metrics", path, [&](const std::string& row) {
      return json_int_field(row, "step") > start->step;
    });
  }
  file_ = open_for_append("--metrics", path);
}

void MetricsLog::write(const EpochMetrics& m, int64_t step, int world_size,
                       const std::string& mode) {
  if (!file_.is_open()) return;
  // Language models: their evaluation in place of test_acc (docs/train.md);
  // regressions: test_loss.
  const std::string evaluation =
      m.language ? fmt::format(
                       "\"val_loss\": {:.6f}, \"val_bpb\": {:.6f}, \"tokens_per_s\": {:.1f}, "
                       "\"unigram_bits\": {:.4f}, \"bigram_bits\": {:.4f}, \"grad_norm\": {}",
                       m.val_loss, m.val_bpb, m.tokens_per_s, m.unigram_bits, m.bigram_bits,
                       std::isfinite(m.grad_norm) ? fmt::format("{:.6g}", m.grad_norm) : "null")
      : m.regression ? fmt::format("\"test_loss\": {:.6f}", m.test_loss)
                     : fmt::format("\"test_acc\": {:.6f}", m.test_acc);
  file_ << fmt::format(
      "{{\"epoch\": {}, \"step\": {}, \"train_loss\": {:.6f}, {}, "
      "\"samples_per_s\": {:.1f}, \"step_ms\": {:.4f}, \"time_s\": {:.3f}, \"lr\": {}, "
      "\"steps\": {}, \"skipped_steps\": {}, \"world_size\": {}, \"mode\": \"{}\", "
      "\"data_ms\": {:.4f}, \"forward_ms\": {:.4f}, \"backward_ms\": {:.4f}, "
      "\"comm_exposed_ms\": {:.4f}, \"optimizer_ms\": {:.4f}, \"comm_ms\": {:.4f}, "
      "\"overlap\": {:.4f}{}{}}}\n",
      m.epoch, step, m.train_loss, evaluation, m.samples_per_s, m.step_ms, m.time_s, m.lr, m.steps,
      m.skipped_steps, world_size, mode, m.data_ms, m.forward_ms, m.backward_ms, m.comm_exposed_ms,
      m.optimizer_ms, m.comm_ms, m.overlap(), straggler_fields(m), memory_fields(m));
  file_.flush();
}

LossLog::LossLog(const std::string& path, const std::optional<RunPosition>& start) {
  if (path.empty()) return;
  if (start) {
    cut_ = cut_back("--loss-log", path, [&](const std::string& row) {
      std::istringstream fields(row);
      int64_t epoch = 0, step = 0;
      if (!(fields >> epoch >> step)) return false;  // not a row of ours: kept
      return epoch > start->epoch + 1 || (epoch == start->epoch + 1 && step > start->epoch_step);
    });
  }
  file_ = open_for_append("--loss-log", path);
}

void LossLog::step(int64_t epoch, int64_t step, const Tensor& loss, int64_t grad_accum) {
  if (!file_.is_open()) return;
  file_ << fmt::format("{} {} {:.9g}\n", epoch, step,
                       loss.item<float>() * static_cast<float>(grad_accum));
}

void LossLog::flush() {
  if (file_.is_open()) file_.flush();
}

}  // namespace ddp::train
