// Command-line options of `train`. Every flag is documented in kTrainUsage
// (printed by --help) and docs/train.md.
#pragma once

#include "runtime/data/dataset.h"
#include "runtime/nn/module.h"
#include "runtime/rng/generator.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ddp::train {

// A model of one's own in place of the zoo's (train_main.h, docs/api.md "Your own
// model"): built for one sample's input shape ([D], or [C, H, W] for images) and
// the outputs the data asks for (its classes, or a regression's target columns),
// with the loss of an output and its targets (empty: cross-entropy for class ids,
// MSE for values, as train's mlp). Everything else is train's: data (--data:
// files, Fashion-MNIST, synthetic), DDP/ZeRO, resume, metrics, evaluation.
struct UserModel {
  std::string name = "custom";  // in logs and the checkpoint's metadata
  std::function<std::shared_ptr<nn::Module>(const Shape& sample, int64_t outputs, Generator& gen)>
      build = {};
  std::function<Tensor(const Tensor& output, const Tensor& target)> loss = {};
};

// --model and --hidden as given: the name a ModelCatalog (task.h) builds, and the
// hidden layer sizes of an mlp-like model of it.
struct ModelChoice {
  std::string name = "mlp";
  std::vector<int64_t> hidden = {256};
};

// A module a catalog or a UserModel built, and its spec ("784-256-10", "gpt:...")
// for logs and the checkpoint's metadata.
struct BuiltModel {
  std::shared_ptr<nn::Module> module;
  std::string spec;
};

struct ModelCatalog;

// Data of one's own in place of --data (train_main.h, docs/api.md "Your own
// model"): the train and test Datasets (runtime/data/dataset.h; make_dataset in
// runtime/data/file_dataset.h builds one from tensors: class ids [N] for a
// classification, values [N, K] for a regression), made on every rank from the
// options (--seed, --synthetic-size...); the trainer shards them over the ranks
// as it shards --data's.
struct TrainOptions;
struct UserData {
  std::string name = "custom";  // in messages
  std::function<std::pair<Dataset, Dataset>(const TrainOptions& options)> load = {};
};

// --drop-last (Note [uneven epochs] in uneven.h): pad | true | false.
enum class DropLast { pad, drop, uneven };
// --join-divide: a step's gradient under a Join is the sum over the ranks that
// still train divided by the world size or by their count.
enum class JoinDivide { world, active };
const char* drop_last_name(DropLast d);      // "pad", "true", "false": the flag's value
const char* join_divide_name(JoinDivide d);  // "world", "active"

struct TrainOptions {
  ModelChoice model;
  // mlp | cnn: Fashion-MNIST's folder; gpt: the Brown corpus's; or "synthetic".
  std::string data = "/usr/share/datasets/fashion-mnist";
  int64_t synthetic_size = 10000;  // training samples of --data synthetic (test: a fifth)
  // mlp | cnn on data files (runtime/data/file_dataset.h): --data FILE.npz|FILE.csv|DIR,
  // its test set (else every 10th row held out), CSV columns and the target kind.
  std::string test_data;
  std::vector<std::string> input_columns, target_columns;
  std::string task = "auto";  // auto | classify | regress
  int64_t epochs = 10;
  int64_t batch_size = 64;
  float lr = 0.02f;
  std::string optimizer = "sgd";  // sgd | adamw
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  std::string lr_schedule = "cosine";  // constant | step | cosine
  int64_t warmup_steps = 0;
  bool auto_warmup = false;      // gpt without --warmup-steps: a tenth of the run, at most 100
  float min_lr_fraction = 0.0f;  // cosine ends at lr x this (gpt: 0.1, as nanoGPT)
  // Global gradient-norm clipping before each update (0: off); gpt default 1.0.
  float clip_grad_norm = 0.0f;
  // AdamW's betas (not flags): torch's (0.9, 0.999), for gpt nanoGPT's (0.9, 0.99).
  float beta1 = 0.9f, beta2 = 0.999f;
  // Language models (docs/train.md): an evaluation every N steps (0: at epoch
  // ends only) over at most this many validation batches per rank (0: all).
  int64_t eval_every = 0;
  int64_t eval_batches = 20;
  uint64_t seed = 0;
  std::string device = "auto";        // auto | cpu | cpu:N | cuda | cuda:N | mps
  std::string save;                   // checkpoint written after every epoch (and --save-every)
  std::string resume;                 // checkpoint to continue from, or "auto": --save's, if any
  int64_t save_every = 0;             // also save every N steps (0: at epoch ends only)
  std::string on_nonfinite = "stop";  // stop | skip (nonfinite.h)
  std::string metrics;                // JSON lines, one per epoch
  std::string loss_log;   // one line per optimizer step: epoch, step, loss (parity checks)
  int64_t log_every = 0;  // steps between progress lines (0: a progress bar on a
                          // terminal, else one line per epoch)
  int64_t max_steps = 0;  // stop each epoch after this many steps (0: no limit)
  // Unless given, the model's default: pad (mlp, cnn), true (gpt, whose windows
  // are never padded).
  DropLast drop_last = DropLast::pad;
  JoinDivide join_divide = JoinDivide::world;  // with --drop-last false only
  bool quiet = false;
  // fp32 | bf16: bf16 multiplies the CPU's matmuls and convolutions in bf16 with f32
  // accumulation and f32 weights (Note [cpu bf16] in runtime/ops/cpu/onednn.cpp).
  std::string precision = "fp32";
  // --cuda-graph: capture the training step in a CUDA graph and replay it (Note
  // [graphed steps] in trainer/epoch.cpp).
  bool cuda_graph = false;
  // --profile-steps N from --profile-start S: the op profile of N steps, printed after
  // them (docs/profile.md; 0: none).
  int64_t profile_steps = 0;
  int64_t profile_start = 3;
  // Parallelism (docs/train.md): auto = ddp when WORLD_SIZE > 1, else single.
  std::string mode = "auto";  // auto | single | ddp | dp
  std::string devices;        // dp: comma-separated devices, e.g. "cpu,cpu" or "cuda:0,cuda:1"
  std::string backend;        // ddp: auto|local|shm|gloo|mpi|nccl ("" = DDP_BACKEND, else auto)
  double bucket_cap_mb = 25;  // ddp: gradient bucket cap (the first bucket is min(1, cap))
  std::string comm_hook = "none";  // ddp: none | bf16 | fp16 (compress buckets for the all_reduce)
  int zero = 0;  // ddp: ZeRO stage (collectives/ddp/zero.h): 0 DDP, 1 state, 2 state + gradients,
                 // 3 state + gradients + parameters
  // --zero-replicas 2 (--zero 1|2): each rank also keeps the next rank's optimizer
  // shard (Note [zero replicas] in collectives/ddp/zero.h), for --on-failure continue.
  int zero_replicas = 1;
  // --zero 3: the unit modules (empty: Note [zero-3 units]) and whether a unit is
  // released after its forward (collectives/ddp/fully_shard.h).
  std::vector<std::string> zero3_units{};
  bool zero3_reshard_after_forward = true;
  // --save-sharded (with --zero 1|2|3): every rank writes its shard of the optimizer
  // state (at --zero 3 of the parameters too) next to --save (trainer/sharded_checkpoint.h).
  bool save_sharded = false;
  // Not a flag: --save as given, on every rank (rank 0 writes it; the others'
  // --save is cleared, but they gather or write their ZeRO shard for it).
  std::string save_everywhere;
  // --save-best PATH: a checkpoint (the --save form) at each evaluation that improves
  // the monitored metric (test_acc up; test_loss, val_loss down). Kept on every rank
  // (rank 0 writes it; under ZeRO every rank gathers the state for it).
  std::string save_best;
  // --early-stop N: stop after N evaluations in a row without an improvement (0: never).
  int64_t early_stop = 0;
  int64_t grad_accum = 1;       // micro-batches per optimizer step (ddp: all but the last
                                // under no_sync()); --batch-size is the micro-batch
  bool sync_timing = false;     // not a flag: bench train sets it to time CUDA phases
  bool summary = false;         // --summary: the model's table (nn::Module::summary) first
  std::set<std::string> given;  // the flags on the command line (model defaults skip them)
  // Not a flag: a program's own model (train_main), trained in place of --model.
  std::shared_ptr<const UserModel> user_model;
  // Not a flag: a program's own data (train_main), read in place of --data.
  std::shared_ptr<const UserData> user_data;
  // Not a flag: the models --model chooses from (train: the zoo's); null: none, the
  // program trains its user_model.
  std::shared_ptr<const ModelCatalog> catalog;
  // Not a flag: the program's name for its report lines (train_main's TrainProgram::name).
  std::string program_name = "train";
};

// Throws ValueError (the caller prints it with the usage and exits 2).
// Returns nullopt when --help was asked for (the caller prints the usage, exit 0).
// `catalog` checks --model and tells language models (their defaults) from the others.
std::optional<TrainOptions> parse_train_args(int argc, const char* const* argv,
                                             std::shared_ptr<const ModelCatalog> catalog);
// Whether o.model is one of the catalog's language models (false without a catalog).
bool is_language_model(const TrainOptions& o);
extern const char* const kTrainUsage;

}  // namespace ddp::train
