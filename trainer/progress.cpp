#include "trainer/progress.h"

#include <unistd.h>

#include "runtime/fmt.h"

#include <cstdio>

namespace ddp::train {
namespace {

// The step breakdown in milliseconds, for the report lines. Under DDP "comm X (step
// waited Y)": X the collectives' own time, Y the time the step waited for them,
// which includes waiting for a slower rank and so may exceed X.
std::string phases(const EpochMetrics& m, const std::string& mode) {
  return fmt::format(" (ms: data {:.3f} forward {:.3f} backward {:.3f}{} optimizer {:.3f})",
                     m.data_ms, m.forward_ms, m.backward_ms,
                     mode == "single" ? ""
                                      : fmt::format(" comm {:.3f} (step waited {:.3f})", m.comm_ms,
                                                    m.comm_exposed_ms),
                     m.optimizer_ms);
}

}  // namespace

Progress::Progress(const TrainOptions& o, std::ostream& out, const char* unit)
    : out_(out),
      quiet_(o.quiet),
      every_(o.log_every),
      bar_(o.log_every == 0 && isatty(2)),
      unit_(unit) {}

void Progress::step(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss,
                    double rate) {
  if (quiet_) return;
  if (bar_ && (step % 10 == 0 || step == steps)) {
    const int width = 30;
    const int filled = static_cast<int>(width * step / std::max<int64_t>(steps, 1));
    std::fprintf(stderr, "\repoch %lld/%lld [%s%s] %lld/%lld loss %.4f %.0f %s/s ",
                 static_cast<long long>(epoch), static_cast<long long>(epochs),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(),
                 static_cast<long long>(step), static_cast<long long>(steps), loss, rate, unit_);
    if (step == steps) std::fprintf(stderr, "\r%*s\r", 90, "");
  } else if (!bar_ && every_ > 0 && step % every_ == 0) {
    out_ << fmt::format("epoch {} step {}/{} loss {:.4f} {:.0f} {}/s\n", epoch, step, steps, loss,
                        rate, unit_);  // stdout is line-buffered (main.cpp)
  }
}
std::string report_line(const EpochMetrics& m, const TrainOptions& o, int64_t step,
                        const std::string& mode) {
  if (m.language) {
    // The corpus's byte entropies next to val_bpb: the bars of counting bytes and
    // byte pairs (task.h).
    // On token shards the same per token.
    const bool bytes = m.unit == "byte";
    return fmt::format(
        "epoch {}/{} step {}: train_loss {:.4f} val_loss {:.4f} {} {:.4f} (validation "
        "{}s: unigram {:.2f}, bigram {:.2f} bits/{}) lr {:.3g} {:.0f} tokens/s {:.3f} "
        "ms/step {:.1f} s{}\n",
        m.epoch, o.epochs, step, m.train_loss, m.val_loss, bytes ? "val_bpb" : "val_bits_per_token",
        m.val_bpb, m.unit, m.unigram_bits, m.bigram_bits, m.unit, m.lr, m.tokens_per_s, m.step_ms,
        m.time_s, phases(m, mode));
  }
  return fmt::format(
      "epoch {}/{}: train_loss {:.4f} {} {:.0f} samples/s {:.3f} ms/step "
      "{:.1f} s{}\n",
      m.epoch, o.epochs, m.train_loss,
      m.regression ? fmt::format("test_loss {:.4f}", m.test_loss)
                   : fmt::format("test_acc {:.4f}", m.test_acc),
      m.samples_per_s, m.step_ms, m.time_s,
      mode == "single"
          ? ""
          : fmt::format(" (ms: forward {:.3f} backward {:.3f} comm {:.3f} (step waited {:.3f}) "
                        "optimizer {:.3f})",
                        m.forward_ms, m.backward_ms, m.comm_ms, m.comm_exposed_ms, m.optimizer_ms));
}

}  // namespace ddp::train
