// The training loop behind `train`: data, model, optimizer, schedule, progress,
// evaluation, metrics and checkpoints on one device.
#pragma once

#include "runtime/device.h"
#include "runtime/optim/optimizer.h"
#include "trainer/train_options.h"

#include <algorithm>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

namespace ddp::train {

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based (a row of an evaluation inside an epoch: that epoch)
  double train_loss = 0;
  double test_acc = 0;
  // Regression on data files (regression): the test set's mean squared error in
  // place of test_acc.
  bool regression = false;
  double test_loss = 0;
  double samples_per_s = 0;  // training samples / training time (evaluation excluded)
  // Language models (language): the validation loss in nats per token, val_bpb =
  // val_loss / ln 2 (a token is a byte), training tokens / training time, and the
  // validation text's byte entropies (bits per byte) to judge them by.
  // On token shards (unit "token") the same figures are per token: val_bpb is
  // then bits per token and is reported as val_bits_per_token.
  bool language = false;
  std::string unit = "byte";
  double val_loss = 0, val_bpb = 0, tokens_per_s = 0;
  double unigram_bits = 0, bigram_bits = 0;
  // The last update's global gradient norm before clipping (--clip-grad-norm only;
  // NaN otherwise, written as null).
  double grad_norm = 0;
  double step_ms = 0;
  double time_s = 0;  // the epoch's wall time, evaluation included
  float lr = 0;
  int64_t steps = 0;          // the epoch's steps, those before a resume included
  int64_t skipped_steps = 0;  // of the whole run so far (--on-nonfinite skip)
  // The mean optimizer step split into phases, in milliseconds (docs/train.md):
  // data (next batch), forward (model and loss), backward (autograd, DDP's hooks
  // and launches included), comm_exposed (ddp: waiting for the all_reduces after
  // backward), optimizer; comm (ddp: the backend's time running the
  // all_reduces, hidden or not). On CUDA the phases are separated by device
  // synchronizations only when TrainOptions::sync_timing is set.
  double data_ms = 0, forward_ms = 0, backward_ms = 0, comm_exposed_ms = 0, optimizer_ms = 0;
  double comm_ms = 0;
  // ddp: every rank's compute and wait time per step (ms, by rank) and the
  // stragglers (compute > 1.1 x the median; Note [straggler report]); empty
  // without a flight recorder.
  std::vector<double> rank_compute_ms, rank_wait_ms;
  std::vector<int> stragglers;
  // By rank (trainer/memory_report.h): the allocator's peak of the run so
  // far, the optimizer state and the gradients held after the epoch's last step.
  std::vector<int64_t> rank_peak_allocated, rank_optimizer_state, rank_gradient_bytes,
      rank_parameter_bytes;
  // Share of the communication time hidden behind backward: 1 - exposed / comm
  // (0 when nothing was communicated).
  double overlap() const {
    return comm_ms <= 0 ? 0.0 : std::clamp(1.0 - comm_exposed_ms / comm_ms, 0.0, 1.0);
  }
};

struct TrainResult {
  std::vector<EpochMetrics> epochs;  // the epochs run by this call (not those resumed from)
  Device device;
  int64_t num_parameters = 0;
  double total_s = 0;
  int rank = 0;  // under a launcher with WORLD_SIZE > 1; only rank 0 reports
  int world_size = 1;
  std::string mode;            // single | ddp | dp, as resolved from --mode
  int64_t steps = 0;           // training steps of the whole run at its end (resumed ones included)
  bool stopped_early = false;  // --early-stop ended the run before its epochs
  // The monitored metric's best of the whole run, a resumed checkpoint's included
  // (Note [best so far]; NaN: no evaluation), and whether this run wrote --save-best.
  double best_metric = std::numeric_limits<double>::quiet_NaN();
  bool saved_best = false;
  // Nothing was left to train, and --save was written from the checkpoint as
  // resumed (save_as_resumed in run.h: a sharded checkpoint written whole, say).
  bool saved_as_resumed = false;
};

// Resolves --device: "auto" is default_device(); others are parsed and checked.
Device resolve_device(const std::string& text);
// The learning-rate schedule of a run whose task has `micro_batches` batches per
// epoch on this rank; it counts optimizer steps (grad_accum micro-batches each).
optim::LrSchedule make_schedule(const TrainOptions& o, int64_t micro_batches);
// After a resume: a line for a schedule that spanned `saved_span` steps when the
// checkpoint was written and spans another number now ("" otherwise, or for 0).
std::string schedule_span_note(const optim::LrSchedule& s, int64_t saved_span, int64_t step,
                               const std::string& name);
// A line for a cosine or linear warmup as long as the run or longer ("" otherwise).
std::string warmup_note(const optim::LrSchedule& s);
// Runs the whole training; progress and the summary go to `out`.
TrainResult run_training(const TrainOptions& options, std::ostream& out);

}  // namespace ddp::train
