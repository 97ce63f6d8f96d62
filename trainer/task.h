// What a program trains, behind one seam: a task owns the model, its data (the
// batches of an epoch on this rank), the loss of a batch, the evaluation and the
// optimizer that suits the model. The training loop (epoch.cpp) is the same
// for every task: steps, DDP, schedule, progress, metrics, checkpoints.
//
// The trainer knows no model of its own: a ModelCatalog (the zoo's is
// models/train/zoo_catalog.h, train's) names the models --model may choose and
// builds them, and a program of one's own gives a UserModel (train_main.h).
//
//   supervised     a catalog's or the user's model on a Dataset: Fashion-MNIST,
//                  data files (runtime/data/file_dataset.h), the synthetic set;
//                  classification (test accuracy) or regression (test MSE)
//                  (supervised_task.cpp)
//   language model a catalog's language task (the zoo's gpt models on text or
//                  token shards, models/train/language_task.cpp)
#pragma once

#include "runtime/data/loader.h"
#include "runtime/nn/module.h"
#include "runtime/optim/optimizer.h"
#include "trainer/train_options.h"

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace ddp {
class Communicator;
}

namespace ddp::train {

struct Evaluation {
  double accuracy = 0;  // image: correct / total over every rank's test shard
  // regression: the mean squared error over every element of every rank's test shard.
  // language: mean cross-entropy per token in nats over the evaluated validation
  // windows of every rank (NaN for image tasks).
  double loss = std::numeric_limits<double>::quiet_NaN();
};

// The byte statistics of a text corpus (bits per byte), the bar a language model
// must clear: a model that only counts bytes reaches the unigram entropy, one that
// counts byte pairs the bigram conditional entropy.
struct CorpusEntropy {
  double unigram_bits = 0;
  double bigram_bits = 0;
  std::string unit = "byte";  // "byte" (text as bytes) or "token" (token shards)
};

// Note [lockstep evaluation]: under ZeRO-3 a forward is collective (each unit is
// all-gathered just before it runs), but ranks may hold different numbers of
// evaluation batches. So each round every rank says whether it has a batch (one
// all_reduce), and a rank out of batches shadows the others' forward (the same
// all-gathers, no compute) until no rank has one; only then do the ranks go on
// to the evaluation's closing all_reduce. The trainer sets Task::eval_lockstep at
// ZeRO-3; null: the plain loop.
struct EvalLockstep {
  std::function<int64_t(bool has_batch)> ranks_with_batch;  // collective
  std::function<void()> shadow;  // the collectives of one forward, without it
};
// Calls body(batch) for every batch next(batch) gives, in lockstep with the other
// ranks when `lockstep` is set.
void for_each_eval_batch(const EvalLockstep* lockstep, const std::function<bool(Batch&)>& next,
                         const std::function<void(const Batch&)>& body);

class Task {
 public:
  virtual ~Task() = default;
  // "784-256-10" or "gpt:layers=2,d=64,..."; for logs and the checkpoint's metadata.
  virtual std::string model_spec() const = 0;
  // Whether a checkpoint of the model spec `saved` resumes into this model: the same
  // spec, or (a gpt) one that differs only in what changes speed and not the
  // parameters or the loss (padded_vocab: Note [padded head]).
  virtual bool resumes_from(const std::string& saved) const { return saved == model_spec(); }
  virtual std::shared_ptr<nn::Module> model() const = 0;
  virtual bool is_language_model() const = 0;
  // Targets are values (MSE), evaluated by Evaluation::loss, the test set's mean
  // squared error, in place of accuracy (data files, file_dataset.h).
  virtual bool is_regression() const { return false; }
  // "fashion-mnist (60000 train / 10000 test)" or "brown (... bytes)", for the header.
  virtual std::string data_summary() const = 0;
  // The training set's size (samples; a language model's tokens), on which the
  // epoch's order depends: a checkpoint stopped mid-epoch records it (0: unknown).
  virtual int64_t train_size() const { return 0; }
  // The optimizer the options ask for, over the model's parameters.
  virtual std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o) const = 0;

  // Batches per epoch on this rank: the same on every rank, except under
  // --drop-last false (Note [uneven epochs] in uneven.h).
  virtual int64_t num_batches() const = 0;
  // Rank r's batches per epoch, and the samples (sequences for a language model)
  // of its batch b (0 past its last), known on every rank without communication.
  virtual int64_t num_batches_of(int rank) const = 0;
  virtual int64_t batch_rows(int rank, int64_t batch) const = 0;
  virtual void start_epoch(int64_t epoch) = 0;
  // An elastic regroup (Note [elastic training] in trainer/elastic.h): this rank is
  // now `rank` of `world_size`, and epoch `epoch` goes on from sampler position
  // `start` (Note [elastic resharding] in runtime/data/sampler.h). A task that
  // cannot reshard its data says so (ValueError), and the run ends as without it.
  virtual bool reshardable() const { return false; }
  virtual void reshard(int rank, int world_size);
  virtual void start_epoch_at(int64_t epoch, int64_t start);
  // The next batch on the task's device; false when the epoch is over.
  virtual bool next(Batch& batch) = 0;
  // The mean loss of `output` (the model's, or DDP's, forward of batch.inputs).
  virtual Tensor loss(const Tensor& output, const Batch& batch) const = 0;
  // Tokens per sample: the context (language), 1 (image).
  virtual int64_t tokens_per_sample() const = 0;
  // In eval mode without gradients; comm (world size > 1): every rank evaluates its
  // shard and the result is all-reduced, so every rank returns the same values.
  // Its batches go through for_each_eval_batch(eval_lockstep, ...).
  virtual Evaluation evaluate(nn::Module& model, Communicator* comm) = 0;
  virtual CorpusEntropy corpus_entropy() const { return {}; }
  const EvalLockstep* eval_lockstep = nullptr;  // Note [lockstep evaluation]
};

// `values` summed over the ranks through one f32 all_reduce, labelled `label` for the
// flight recorder and traces; comm null (one process): `values` as they are. For
// evaluations that add up sums and counts on every rank.
std::vector<double> sum_over_ranks(Communicator* comm, std::vector<double> values,
                                   const char* label);

// The models a program's --model chooses from (not a flag: train passes the zoo's,
// models::zoo_catalog()).
struct ModelCatalog {
  // For --help and errors: "mlp|cnn|gpt-tiny|gpt-mini|gpt2|gpt:layers=L,d=D,heads=H,ctx=T".
  std::string names;
  // Throws ValueError naming `name` and the valid names when the catalog has no such model.
  std::function<void(const std::string& name)> check;
  // Language models take the language defaults (Note [gpt defaults] in
  // train_options.cpp) and make_language_task; the others are supervised.
  std::function<bool(const std::string& name)> is_language_model;
  // A supervised model for one sample's shape ([D], or [C, H, W]) and the outputs
  // the data asks for (classes, or a regression's targets), and its spec for logs
  // and the checkpoint's metadata (a resume must build the same).
  std::function<BuiltModel(const ModelChoice& choice, const Shape& sample, int64_t outputs,
                           Generator& gen)>
      build;
  std::function<std::unique_ptr<Task>(const TrainOptions& o, const Device& device, int rank,
                                      int world_size)>
      make_language_task;
};

// The task for o.model (or o.user_model) on `device`, data sharded for `rank` of
// `world_size`: the catalog's language task, else the supervised task. ValueError
// for data that cannot be loaded or a batch larger than the data.
std::unique_ptr<Task> make_task(const TrainOptions& o, const Device& device, int rank,
                                int world_size);
std::unique_ptr<Task> make_supervised_task(const TrainOptions& o, const Device& device, int rank,
                                           int world_size);

}  // namespace ddp::train
