// What `train` appends to files as it goes: --metrics (a JSON object per epoch) and
// --loss-log (a line per step). A run that resumes, or was asked to resume, first
// cuts the files back to where it starts (Note [rows cut back] in run_log.cpp).
#pragma once

#include "runtime/tensor.h"
#include "trainer/trainer.h"

#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ddp::train {

// Opens `path` for appending now, so an unwritable path fails before the first
// step. ValueError names the flag, the path and the system's reason.
std::ofstream open_for_append(const std::string& flag, const std::string& path);
// Creates and removes `<path>.tmp.<pid>` (the name a save writes first), so a
// directory that is missing or not writable fails before the first step; a path
// that is a directory fails too.
void check_can_create(const std::string& flag, const std::string& path);

// Where a resumed run starts (all 0: a fresh start under --resume auto).
struct RunPosition {
  int64_t step = 0;        // training steps of the whole run
  int64_t epoch = 0;       // completed epochs
  int64_t epoch_step = 0;  // steps taken in the next epoch
};

// --metrics: one row per evaluation (docs/train.md lists the keys). A path ending
// in .csv gets CSV (Lightning's CSVLogger form: a header line of the keys, then one
// line per row; lists quoted), any other JSON lines.
class MetricsLog {
 public:
  // start: set when the run resumes (or was asked to): rows whose "step" is
  // beyond start.step are cut from the file first.
  MetricsLog(const std::string& path, const std::optional<RunPosition>& start);
  // `step`: training steps at the end of the epoch (all epochs counted).
  void write(const EpochMetrics& m, int64_t step, int world_size, const std::string& mode);
  // A change of the group (ddprun --on-failure continue, docs/elastic.md): a row
  // {"event": "membership", "step", "epoch", "membership", "ranks", "left",
  // "joined", "world_size", "regroup_s"} in JSON lines; a CSV file has fixed
  // columns and gets none.
  void write_membership(int64_t step, int64_t epoch, int64_t membership,
                        const std::vector<int>& ranks, const std::vector<int>& left,
                        const std::vector<int>& joined, double regroup_s);
  // Drops the evaluation rows (not membership rows) of step `step` at the end of
  // the file, all but the first `keep` of them: a report the group takes again
  // after a regroup wrote its row already, perhaps (Note [reports committed] in
  // epoch.cpp). Rows before the last row of an earlier step stay (an earlier run's).
  void drop_evaluations_at(int64_t step, int64_t keep);
  int64_t rows_cut() const { return cut_; }

 private:
  std::string path_;
  bool csv_ = false;    // a path ending in .csv: CSV with a header, else JSON lines
  std::string header_;  // csv: the file's header line ("" until written)
  std::ofstream file_;
  int64_t cut_ = 0;
};

// --loss-log: "epoch step loss" per optimizer step, the loss of the step's last
// micro-batch at full float precision (bench/gpu/run.sh compares CPU and CUDA runs
// step by step). Reading the loss synchronizes a GPU every step, so only on request.
class LossLog {
 public:
  // start: as for MetricsLog; rows beyond (start.epoch + 1, start.epoch_step) are cut.
  LossLog(const std::string& path, const std::optional<RunPosition>& start);
  // epoch: 1-based; step: within the epoch.
  void step(int64_t epoch, int64_t step, const Tensor& loss, int64_t grad_accum);
  // Before every checkpoint and at each epoch's end: the rows up to a checkpoint
  // are on disk before it is (Note [rows cut back]).
  void flush();
  // Each row on disk as it is written (elastic training: a writer that dies loses none).
  void set_flush_each_row(bool on) { flush_each_row_ = on; }
  int64_t rows_cut() const { return cut_; }

 private:
  std::ofstream file_;
  int64_t cut_ = 0;
  bool flush_each_row_ = false;
};

}  // namespace ddp::train
