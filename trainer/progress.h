// What `train` prints as it goes: the progress bar or lines between reports, and
// the report line of each evaluation (epoch ends, and --eval-every for gpt).
#pragma once

#include "trainer/train_options.h"
#include "trainer/trainer.h"

#include <ostream>
#include <string>

namespace ddp::train {

class Progress {
 public:
  // unit: "samples" or "tokens", what the rate counts.
  Progress(const TrainOptions& o, std::ostream& out, const char* unit);
  // rate: samples or tokens (the unit) per second.
  void step(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double rate);

 private:
  std::ostream& out_;
  bool quiet_;
  int64_t every_;
  bool bar_;
  const char* unit_;  // samples | tokens
};

// The report line of an evaluation (with its newline): test accuracy (mlp, cnn) or
// the validation loss next to the corpus's entropies (gpt), rates and the step
// breakdown. step: the run's steps so far.
std::string report_line(const EpochMetrics& m, const TrainOptions& o, int64_t step,
                        const std::string& mode);

}  // namespace ddp::train
