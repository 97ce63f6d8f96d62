#include "models/train/run_log.h"

#include "runtime/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace ddp::train {
namespace {

// Note [no replayed rows]: a run killed after its last checkpoint wrote rows for
// the steps after it; the resumed run trains those steps again. It reads the last
// row already in the file and writes only rows beyond it, so every step or epoch
// appears once, with the step numbers of the run as a whole. A fresh run (no
// resume) appends everything: its rows are a new run's.
std::string last_line(const std::string& path) {
  std::ifstream f(path);
  std::string line, last;
  while (std::getline(f, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

// The integer after `"key": ` in a metrics row; -1 when absent.
int64_t json_int_field(const std::string& row, const std::string& key) {
  const std::string needle = "\"" + key + "\": ";
  const auto at = row.find(needle);
  if (at == std::string::npos) return -1;
  return std::strtoll(row.c_str() + at + needle.size(), nullptr, 10);
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
  const std::string probe = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  DDP_CHECK(fd >= 0,
            "{} {}: cannot create a file there ({}: {}); the directory must exist and be "
            "writable (train does not create it, as torch.save does not)",
            flag, path, probe, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

MetricsLog::MetricsLog(const std::string& path, bool resumed) {
  if (path.empty()) return;
  if (resumed) last_step_ = json_int_field(last_line(path), "step");
  file_ = open_for_append("--metrics", path);
}

void MetricsLog::write(const EpochMetrics& m, int64_t step, int world_size,
                       const std::string& mode) {
  if (!file_.is_open() || step <= last_step_) return;
  file_ << fmt::format(
      "{{\"epoch\": {}, \"step\": {}, \"train_loss\": {:.6f}, \"test_acc\": {:.6f}, "
      "\"samples_per_s\": {:.1f}, \"step_ms\": {:.4f}, \"time_s\": {:.3f}, \"lr\": {}, "
      "\"steps\": {}, \"skipped_steps\": {}, \"world_size\": {}, \"mode\": \"{}\", "
      "\"data_ms\": {:.4f}, \"forward_ms\": {:.4f}, \"backward_ms\": {:.4f}, "
      "\"comm_exposed_ms\": {:.4f}, \"optimizer_ms\": {:.4f}, \"comm_ms\": {:.4f}, "
      "\"overlap\": {:.4f}}}\n",
      m.epoch, step, m.train_loss, m.test_acc, m.samples_per_s, m.step_ms, m.time_s, m.lr, m.steps,
      m.skipped_steps, world_size, mode, m.data_ms, m.forward_ms, m.backward_ms, m.comm_exposed_ms,
      m.optimizer_ms, m.comm_ms, m.overlap());
  file_.flush();
}

LossLog::LossLog(const std::string& path, bool resumed) {
  if (path.empty()) return;
  if (resumed) {
    std::istringstream last(last_line(path));
    if (!(last >> last_epoch_ >> last_step_)) last_epoch_ = last_step_ = -1;
  }
  file_ = open_for_append("--loss-log", path);
}

void LossLog::step(int64_t epoch, int64_t step, const Tensor& loss, int64_t grad_accum) {
  if (!file_.is_open()) return;
  if (epoch < last_epoch_ || (epoch == last_epoch_ && step <= last_step_)) return;
  file_ << fmt::format("{} {} {:.9g}\n", epoch, step,
                       loss.item<float>() * static_cast<float>(grad_accum));
}

}  // namespace ddp::train
