#include "trainer/run_log.h"

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

// A metrics row: (key, value as JSON writes it), in column order.
using Fields = std::vector<std::pair<std::string, std::string>>;

// Note [straggler report]: ddp rows with every rank's figures.
void straggler_fields(const EpochMetrics& m, Fields& f) {
  if (m.rank_compute_ms.empty()) return;
  const auto list = [](const std::vector<double>& v) {
    std::string out;
    for (double x : v) out += fmt::format("{}{:.4f}", out.empty() ? "" : ", ", x);
    return "[" + out + "]";
  };
  f.emplace_back("rank_compute_ms", list(m.rank_compute_ms));
  f.emplace_back("rank_wait_ms", list(m.rank_wait_ms));
  f.emplace_back("stragglers", fmt::format("[{}]", fmt::join(m.stragglers, ", ")));
}

// Bytes per rank (trainer/memory_report.h).
void memory_fields(const EpochMetrics& m, Fields& f) {
  if (m.rank_peak_allocated.empty()) return;
  f.emplace_back("rank_peak_allocated",
                 fmt::format("[{}]", fmt::join(m.rank_peak_allocated, ", ")));
  f.emplace_back("rank_optimizer_state",
                 fmt::format("[{}]", fmt::join(m.rank_optimizer_state, ", ")));
  f.emplace_back("rank_gradient_bytes",
                 fmt::format("[{}]", fmt::join(m.rank_gradient_bytes, ", ")));
  f.emplace_back("rank_parameter_bytes",
                 fmt::format("[{}]", fmt::join(m.rank_parameter_bytes, ", ")));
}

bool is_csv(const std::string& path) {
  return path.size() > 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
}

// A CSV cell: strings lose their JSON quotes; lists ("[1, 2]") are quoted, as
// their commas would split them.
std::string csv_cell(const std::string& json) {
  if (json.size() >= 2 && json.front() == '"') return json.substr(1, json.size() - 2);
  if (json.find(',') != std::string::npos) return "\"" + json + "\"";
  return json;
}

// The integer in the CSV row's second column (step); -1 when it is not one (the header).
int64_t csv_step(const std::string& row) {
  const auto comma = row.find(',');
  if (comma == std::string::npos) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(row.c_str() + comma + 1, &end, 10);
  return end != row.c_str() + comma + 1 && *end == ',' ? v : -1;
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

MetricsLog::MetricsLog(const std::string& path, const std::optional<RunPosition>& start)
    : path_(path), csv_(is_csv(path)) {
  if (path.empty()) return;
  if (start) {
    cut_ = cut_back("--metrics", path, [&](const std::string& row) {
      return (csv_ ? csv_step(row) : json_int_field(row, "step")) > start->step;
    });
  }
  if (csv_) {
    std::ifstream in(path);
    std::getline(in, header_);  // "" for a new or empty file
  }
  file_ = open_for_append("--metrics", path);
}

void MetricsLog::drop_evaluations_at(int64_t step, int64_t keep) {
  if (path_.empty() || !file_.is_open()) return;
  file_.close();
  std::vector<std::string> lines;
  {
    std::ifstream in(path_, std::ios::binary);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  // The file's tail from the last row of an earlier step on: membership rows and
  // rows of `step` (rows beyond it were cut when this writer opened the file).
  auto row_step = [&](const std::string& line) {
    return csv_ ? csv_step(line) : json_int_field(line, "step");
  };
  auto membership = [](const std::string& line) {
    return line.find("\"event\": \"membership\"") != std::string::npos;
  };
  size_t tail = lines.size();
  while (tail > 0 && (membership(lines[tail - 1]) || row_step(lines[tail - 1]) >= step)) --tail;
  std::string kept;
  int64_t seen = 0, dropped = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i >= tail && !membership(lines[i]) && row_step(lines[i]) == step && ++seen > keep) {
      ++dropped;
      continue;
    }
    kept += lines[i] + "\n";
  }
  if (dropped > 0) {  // a new file renamed over the old one: never half of either
    const std::string temporary = fmt::format("{}.tmp.{}", path_, ::getpid());
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out << kept;
      out.flush();
      DDP_CHECK(out.good(), "--metrics {}: cannot write {} to drop the rows of step {}", path_,
                temporary, step);
    }
    std::error_code ec;
    std::filesystem::rename(temporary, path_, ec);
    DDP_CHECK(!ec, "--metrics {}: cannot replace it with {}: {}", path_, temporary, ec.message());
  }
  file_ = open_for_append("--metrics", path_);
}

void MetricsLog::write_membership(int64_t step, int64_t epoch, int64_t membership,
                                  const std::vector<int>& ranks, const std::vector<int>& left,
                                  const std::vector<int>& joined, double regroup_s) {
  if (!file_.is_open() || csv_) return;
  file_ << fmt::format(
      "{{\"event\": \"membership\", \"step\": {}, \"epoch\": {}, \"membership\": {}, "
      "\"ranks\": [{}], \"left\": [{}], \"joined\": [{}], \"world_size\": {}, "
      "\"regroup_s\": {:.4f}}}\n",
      step, epoch, membership, fmt::join(ranks, ", "), fmt::join(left, ", "),
      fmt::join(joined, ", "), ranks.size(), regroup_s);
  file_.flush();
}

void MetricsLog::write(const EpochMetrics& m, int64_t step, int world_size,
                       const std::string& mode) {
  if (!file_.is_open()) return;
  Fields f{{"epoch", fmt::format("{}", m.epoch)},
           {"step", fmt::format("{}", step)},
           {"train_loss", std::isfinite(m.train_loss) ? fmt::format("{:.6f}", m.train_loss)
                          : csv_                      ? ""
                                                      : "null"}};
  // Language models: their evaluation in place of test_acc (docs/train.md);
  // regressions: test_loss.
  if (m.language) {
    f.emplace_back("val_loss", fmt::format("{:.6f}", m.val_loss));
    f.emplace_back(m.unit == "byte" ? "val_bpb" : "val_bits_per_token",
                   fmt::format("{:.6f}", m.val_bpb));
    f.emplace_back("tokens_per_s", fmt::format("{:.1f}", m.tokens_per_s));
    f.emplace_back("unigram_bits", fmt::format("{:.4f}", m.unigram_bits));
    f.emplace_back("bigram_bits", fmt::format("{:.4f}", m.bigram_bits));
    f.emplace_back("grad_norm",
                   std::isfinite(m.grad_norm) ? fmt::format("{:.6g}", m.grad_norm) : "null");
  } else if (m.regression) {
    f.emplace_back("test_loss", fmt::format("{:.6f}", m.test_loss));
  } else {
    f.emplace_back("test_acc", fmt::format("{:.6f}", m.test_acc));
  }
  f.insert(f.end(), {{"samples_per_s", fmt::format("{:.1f}", m.samples_per_s)},
                     {"step_ms", fmt::format("{:.4f}", m.step_ms)},
                     {"time_s", fmt::format("{:.3f}", m.time_s)},
                     {"lr", fmt::format("{}", m.lr)},
                     {"steps", fmt::format("{}", m.steps)},
                     {"skipped_steps", fmt::format("{}", m.skipped_steps)},
                     {"world_size", fmt::format("{}", world_size)},
                     {"mode", fmt::format("\"{}\"", mode)},
                     {"data_ms", fmt::format("{:.4f}", m.data_ms)},
                     {"forward_ms", fmt::format("{:.4f}", m.forward_ms)},
                     {"backward_ms", fmt::format("{:.4f}", m.backward_ms)},
                     {"comm_exposed_ms", fmt::format("{:.4f}", m.comm_exposed_ms)},
                     {"optimizer_ms", fmt::format("{:.4f}", m.optimizer_ms)},
                     {"comm_ms", fmt::format("{:.4f}", m.comm_ms)},
                     {"overlap", fmt::format("{:.4f}", m.overlap())}});
  straggler_fields(m, f);
  memory_fields(m, f);
  if (!csv_) {
    std::string row;
    for (const auto& [key, value] : f) {
      row += fmt::format("{}\"{}\": {}", row.empty() ? "{" : ", ", key, value);
    }
    file_ << row << "}\n";
    file_.flush();
    return;
  }
  // Note [metrics csv]: one header line, the keys of the first row; a file that
  // has one already (a resumed or repeated run) must have the same columns.
  std::string header, cells;
  for (const auto& [key, value] : f) {
    if (!header.empty()) {
      header += ',';
      cells += ',';
    }
    header += key;
    cells += csv_cell(value);
  }
  if (header_.empty()) {
    file_ << header << "\n";
    header_ = header;
  }
  DDP_CHECK(header_ == header,
            "--metrics {}: the file's header names the columns {}, this run's rows have {}; "
            "write to another file (a different model, evaluation or world size changes them)",
            path_, header_, header);
  file_ << cells << "\n";
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
  if (flush_each_row_) file_.flush();
}

void LossLog::flush() {
  if (file_.is_open()) file_.flush();
}

}  // namespace ddp::train
