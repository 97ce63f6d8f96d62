// The language-model task: the gpt models on the Brown corpus's bytes (or a
// synthetic byte stream) or on token shards (--data FILE.bin|DIR, Note [token
// shards] in runtime/data/token_shards.h), next-token prediction, evaluated by
// the validation loss.
//
// Note [language model batches]: a batch is --batch-size windows of the model's
// context (runtime/data/text_windows.h) from this rank's TextWindowSampler
// share: rank-disjoint, reshuffled with new window boundaries every epoch, all
// from --seed. An epoch is one pass over the train windows; a batch that would
// be partial is dropped so every rank takes the same number of steps, except
// under --drop-last false: uneven shares, the partial last batch kept, and
// the ranks' step counts may differ (Note [uneven epochs] in uneven.h). The loss
// is the mean cross-entropy over the batch's B x T next-byte predictions.
// After an elastic regroup (ddprun --on-failure continue, Note [elastic
// training] in trainer/elastic.h) both samplers are resharded for the new world
// and the epoch goes on from the group's cursor: the windows it had not taken,
// on the epoch's boundaries, none twice.
//
// Note [validation windows]: the evaluation reads the same validation windows
// every time: those of a TextWindowSampler shuffled from a fixed seed (so they
// come from every part of the split, not from its first documents), rank r
// taking its disjoint share, at most --eval-batches batches of --batch-size
// per rank (0: all of them). The loss sum and the token count are all-reduced,
// so val_loss is the mean over every evaluated token of every rank.
#include "models/gpt.h"
#include "models/train/zoo_catalog.h"
#include "runtime/autograd/functions.h"
#include "runtime/data/text_corpus.h"
#include "runtime/data/text_windows.h"
#include "runtime/data/token_shards.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

namespace ddp::train {
namespace {

constexpr uint64_t kValidationSeed = 0x5eed;

// --data synthetic: --synthetic-size windows of the context in the train split (at least
// the generator's 1 MiB) and a fifth as many in the validation split (at least 128 KiB),
// so a sweep asking for N steps of a global batch gets them (bench/scale).
TextCorpus load_corpus(const TrainOptions& o, int64_t context) {
  if (o.data == "synthetic") {
    const SyntheticTextOptions small;
    const int64_t window = context + 1;
    return make_synthetic_text(
        {.train_bytes = std::max(small.train_bytes, o.synthetic_size * window + context),
         .validation_bytes =
             std::max(small.validation_bytes, o.synthetic_size / 5 * window + context),
         .seed = 0});
  }
  try {
    return load_brown_corpus(o.data);
  } catch (const ValueError& e) {
    // A folder of one's own text is not read as it stands: it becomes token shards.
    throw ValueError(fmt::format(
        "{}; or train on a synthetic token stream: --data synthetic. For text of your own, "
        "write token shards first (`tokenize --out DIR FILES...`, docs/data.md) and pass DIR",
        e.what()));
  }
}

// The train and validation streams: token shards (Note [token shards]) or the
// corpus's bytes.
struct LanguageData {
  TokenStream train, validation;
  std::string summary;
  CorpusEntropy entropy;
};

// Note [shard validation]: the validation shards are --test-data's, else the
// "val" shards of --data DIR, else the last tenth of the train stream (a
// contiguous tail, so no window of it overlaps a train window).
LanguageData load_language_data(const TrainOptions& o, int64_t context) {
  LanguageData d;
  if (is_token_shard_data(o.data)) {
    const ShardFiles files = find_token_shards(o.data);
    d.train = TokenStream::open_shards(files.train);
    std::string held_out;
    if (!o.test_data.empty()) {
      const ShardFiles test = find_token_shards(o.test_data, /*for_validation=*/true);
      std::vector<std::string> all = test.validation.empty() ? test.train : test.validation;
      // The same file in both sets: every validation window is a training one.
      for (const auto& v : all) {
        for (const auto& t : files.train) {
          std::error_code ec;
          DDP_CHECK(!std::filesystem::equivalent(v, t, ec),
                    "--test-data {}: shard {} is also a training shard of --data {}: the "
                    "validation loss would be measured on training tokens; give validation "
                    "shards of their own",
                    o.test_data, v, o.data);
        }
      }
      d.validation = TokenStream::open_shards(all);
    } else if (!files.validation.empty()) {
      d.validation = TokenStream::open_shards(files.validation);
    } else {
      const int64_t tail = d.train.size() / 10;
      d.validation = TokenStream::slice(d.train, d.train.size() - tail, tail);
      d.train = TokenStream::slice(d.train, 0, d.train.size() - tail);
      held_out = ", the last tenth held out for validation";
    }
    const TokenEntropy e = token_entropies(d.validation);
    d.entropy = {e.unigram_bits, e.bigram_bits, "token"};
    d.summary = fmt::format("token shards {} ({} train / {} validation tokens{})", o.data,
                            d.train.size(), d.validation.size(), held_out);
    return d;
  }
  TextCorpus corpus = load_corpus(o, context);
  const ByteEntropy e = byte_entropies(corpus.validation);
  d.entropy = {e.unigram_bits, e.bigram_bits, "byte"};
  d.summary = fmt::format("{} ({} train / {} validation bytes{})", corpus.name, corpus.train.size(),
                          corpus.validation.size(),
                          corpus.name == "synthetic" ? ": a synthetic token stream, not text" : "");
  d.train = TokenStream::from_bytes(std::move(corpus.train));
  d.validation = TokenStream::from_bytes(std::move(corpus.validation));
  return d;
}

// Fixed-size batches of window starts, in the sampler's order.
class WindowBatches {
 public:
  WindowBatches(const std::string& split, const TokenStream& stream, int64_t context, int64_t batch,
                int rank, int world_size, SamplerOptions options)
      : stream_(stream),
        sampler_(stream.size(), context, rank, world_size, options),
        batch_(batch),
        rank_(rank) {
    DDP_CHECK(sampler_.uneven() || sampler_.num_windows() >= batch,
              "the {} split has {} windows of context {} per rank ({}, {} rank(s)), fewer "
              "than --batch-size {}; pass a smaller --batch-size or a model with a shorter context",
              split, sampler_.num_windows(), context, stream.describe(), world_size, batch);
  }
  int64_t num_batches() const { return num_batches_of(rank_); }
  // Uneven shares (--drop-last false) keep a partial last batch; else it is dropped.
  int64_t num_batches_of(int rank) const {
    const int64_t w = sampler_.num_windows_of(rank);
    return sampler_.uneven() ? (w + batch_ - 1) / batch_ : w / batch_;
  }
  int64_t rows_of(int rank, int64_t b) const {
    if (b < 0 || b >= num_batches_of(rank)) return 0;
    return std::min(batch_, sampler_.num_windows_of(rank) - b * batch_);
  }
  // start: the window positions a group of another size took (Note [elastic resharding]).
  void start_epoch(int64_t epoch, int64_t start = 0) {
    sampler_.set_epoch(epoch, start);
    starts_ = sampler_.starts();
    next_ = 0;
  }
  // An elastic regroup: this rank's share of the same windows in a world of
  // `world_size`; start_epoch comes before the next batch.
  void reshard(int rank, int world_size) {
    sampler_.reshard(rank, world_size);
    rank_ = rank;
    starts_.clear();
    next_ = num_batches();  // no batch before start_epoch
  }
  bool next(Batch& out, const Device& device) {
    if (next_ >= num_batches()) return false;
    const std::span<const int64_t> starts(starts_.data() + next_ * batch_,
                                          static_cast<size_t>(rows_of(rank_, next_)));
    ++next_;
    TokenBatch b = window_batch(stream_, starts, sampler_.context());
    // non_blocking: staged through pinned memory, so the host does not wait for the
    // device's queued work at every batch (Note [copy semantics] in runtime/ops/copy.cpp).
    out.inputs = b.inputs.to(device, /*non_blocking=*/true);
    out.labels = b.targets.to(device, /*non_blocking=*/true);
    return true;
  }

 private:
  const TokenStream& stream_;
  TextWindowSampler sampler_;
  int64_t batch_;
  int rank_ = 0;
  std::vector<int64_t> starts_;
  int64_t next_ = 0;
};

class LanguageTask : public Task {
 public:
  LanguageTask(const TrainOptions& o, const Device& device, int rank, int world_size)
      : config_(models::gpt_config(o.model.name)),
        data_(load_language_data(o, config_.context)),
        device_(device),
        train_("train", data_.train, config_.context, o.batch_size, rank, world_size,
               {.shuffle = true, .seed = o.seed, .pad = o.drop_last != DropLast::uneven}),
        validation_("validation", data_.validation, config_.context, o.batch_size, rank, world_size,
                    {.shuffle = true, .seed = kValidationSeed}),
        eval_batches_(o.eval_batches) {
    const int64_t needed =
        data_.entropy.unit == "byte"
            ? 256
            : std::max(data_.train.max_token(), data_.validation.max_token()) + 1;
    DDP_CHECK(
        config_.vocab >= needed,
        "--model {}: vocabulary {} is smaller than the data's {} ({}); use a model with "
        "vocab={} or more{}",
        o.model.name, config_.vocab, needed,
        data_.entropy.unit == "byte" ? "the 256 byte values of the text" : "its largest token + 1",
        needed,
        needed > 50257 ? " (GPT-2's vocabulary is 50257 tokens: these shards hold larger ids, so "
                         "another tokenizer wrote them)"
        : needed > 256 ? " (GPT-2 tokens: --model gpt2, or gpt:...,vocab=50257)"
                       : "");
    Generator gen(o.seed);
    model_ = models::make_gpt(config_, gen);
    model_->to(device);
  }

  // The window batches refer to data_: not copied or moved.
  LanguageTask(const LanguageTask&) = delete;
  LanguageTask& operator=(const LanguageTask&) = delete;

  std::string model_spec() const override { return models::describe(config_); }
  int64_t train_size() const override { return data_.train.size(); }
  bool resumes_from(const std::string& saved) const override {
    if (!models::is_gpt_model(saved)) return false;
    try {
      return models::same_model(models::gpt_config(saved), config_);
    } catch (const ValueError&) {
      return false;  // not a spec this build reads: load_checkpoint names both
    }
  }
  std::shared_ptr<nn::Module> model() const override { return model_; }
  bool is_language_model() const override { return true; }
  std::string data_summary() const override { return data_.summary; }
  CorpusEntropy corpus_entropy() const override { return data_.entropy; }

  // Note [gpt optimizer]: AdamW over nanoGPT's two groups, weight decay on the
  // 2-D weights (Linear weights and embeddings) only; biases and LayerNorm
  // parameters do not decay. SGD (explicitly asked for) takes every parameter.
  std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o) const override {
    if (o.optimizer == "sgd") {
      return std::make_unique<optim::SGD>(model_->parameters(),
                                          optim::SgdOptions{.lr = o.lr,
                                                            .momentum = o.momentum,
                                                            .weight_decay = o.weight_decay,
                                                            .nesterov = o.nesterov});
    }
    const models::DecayGroups groups = models::decay_groups(*model_);
    return std::make_unique<optim::AdamW>(
        std::vector<optim::ParamGroup>{{groups.decay, o.weight_decay}, {groups.no_decay, 0.0f}},
        optim::AdamWOptions{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2});
  }

  int64_t num_batches() const override { return train_.num_batches(); }
  int64_t num_batches_of(int rank) const override { return train_.num_batches_of(rank); }
  int64_t batch_rows(int rank, int64_t batch) const override { return train_.rows_of(rank, batch); }
  void start_epoch(int64_t epoch) override { train_.start_epoch(epoch); }
  // Note [elastic training] in trainer/elastic.h: the train windows from the
  // group's cursor on, and the validation windows, shared out over the new world.
  bool reshardable() const override { return true; }
  void reshard(int rank, int world_size) override {
    train_.reshard(rank, world_size);
    validation_.reshard(rank, world_size);
  }
  void start_epoch_at(int64_t epoch, int64_t start) override { train_.start_epoch(epoch, start); }
  bool next(Batch& batch) override { return train_.next(batch, device_); }
  Tensor loss(const Tensor& output, const Batch& batch) const override {
    const int64_t vocab = output.size(output.dim() - 1);
    return functional::cross_entropy(functional::reshape(output, {-1, vocab}),
                                     batch.labels.reshape({-1}));
  }
  int64_t tokens_per_sample() const override { return config_.context; }

  Evaluation evaluate(nn::Module& model, Communicator* comm) override {
    NoGradGuard no_grad;
    model.eval();
    validation_.start_epoch(0);
    const int64_t limit = eval_batches_ > 0 ? eval_batches_ : validation_.num_batches();
    double loss_sum = 0, tokens = 0;
    int64_t taken = 0;
    for_each_eval_batch(
        eval_lockstep, [&](Batch& b) { return taken++ < limit && validation_.next(b, device_); },
        [&](const Batch& batch) {
          const double n = static_cast<double>(batch.labels.numel());
          loss_sum += static_cast<double>(loss(model(batch.inputs), batch).item<float>()) * n;
          tokens += n;
        });
    model.train();
    const auto summed = sum_over_ranks(comm, {loss_sum, tokens}, "eval loss");
    loss_sum = summed[0];
    tokens = summed[1];
    Evaluation e;
    e.loss = tokens == 0 ? 0.0 : loss_sum / tokens;
    return e;
  }

 private:
  models::GptConfig config_;
  LanguageData data_;
  Device device_;
  WindowBatches train_, validation_;
  int64_t eval_batches_;
  std::shared_ptr<models::Gpt> model_;
};

}  // namespace

std::unique_ptr<Task> make_language_task(const TrainOptions& o, const Device& device, int rank,
                                         int world_size) {
  return std::make_unique<LanguageTask>(o, device, rank, world_size);
}

}  // namespace ddp::train
