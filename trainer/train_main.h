// The `train` program as one library call, for programs of one's own: parse
// train's flags (docs/train.md), train, print the report lines and the summary,
// return the exit code (0; 1 a failure while running; 2 a usage error). With a
// UserModel the program trains it in place of a catalog's and gets everything else
// train has: --data (NumPy, CSV, Fashion-MNIST, synthetic), DDP and ZeRO under
// ddprun, --resume, --metrics, --save-best, --early-stop, traces, and `scale
// --program` sweeps (docs/scaling.md). docs/api.md "Your own model" shows a
// whole program.
//
//   int main(int argc, char** argv) {
//     auto model = std::make_shared<ddp::train::UserModel>();
//     model->name = "tanh-mlp";
//     model->build = [](const ddp::Shape& sample, int64_t outputs, ddp::Generator& gen) {...};
//     return ddp::train::train_main(argc, argv, {.name = "mine", .model = model});
//   }
#pragma once

#include "trainer/task.h"
#include "trainer/train_options.h"

#include <memory>
#include <string>
#include <vector>

namespace ddp::train {

struct TrainProgram {
  std::string name = "train";                        // in messages: "NAME: error: ..."
  std::shared_ptr<const UserModel> model = nullptr;  // null: the zoo's (--model)
  // Flags applied before the command line's (which win): a program's own
  // defaults, e.g. {"--data", "mine.csv", "--epochs", "5"}.
  std::vector<std::string> defaults = {};
  // Data of its own (train_options.h) in place of --data; null: --data's.
  std::shared_ptr<const UserData> data = nullptr;
  // The models --model chooses from: train's is the zoo's (models::zoo_catalog());
  // null for a program that trains its own model.
  std::shared_ptr<const ModelCatalog> catalog = nullptr;
};

int train_main(int argc, const char* const* argv, const TrainProgram& program = {});

}  // namespace ddp::train
