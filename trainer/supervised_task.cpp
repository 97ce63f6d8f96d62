// The supervised task: a catalog's model (the zoo's mlp and cnn) or a program's
// own (UserModel) on Fashion-MNIST, the synthetic set or data files of one's own
// (runtime/data/file_dataset.h): classification, evaluated by test accuracy, or
// regression (MSE, evaluated by the test set's mean squared error).
#include "collectives/collective_events.h"
#include "collectives/communicator.h"
#include "runtime/autograd/functions.h"
#include "runtime/data/file_dataset.h"
#include "runtime/ops/ops.h"
#include "trainer/task.h"

namespace ddp::train {
namespace {

struct Data {
  Dataset train, test;
  std::string test_source;  // data files: where the test set came from
};

Data load_data(const TrainOptions& o) {
  if (o.user_data != nullptr) {
    DDP_CHECK(static_cast<bool>(o.user_data->load), "UserData '{}' has no load function",
              o.user_data->name);
    auto [train, test] = o.user_data->load(o);
    check_same_task(train, test, fmt::format("UserData '{}'", o.user_data->name));
    return {std::move(train), std::move(test), ""};
  }
  if (o.data == "synthetic") {
    SyntheticOptions s{.n = o.synthetic_size, .seed = 1234, .noise = 6.0f, .split = Split::train};
    Data d{make_synthetic(s), {}, ""};
    s.n = std::max<int64_t>(o.synthetic_size / 5, 10);
    s.split = Split::test;
    d.test = make_synthetic(s);
    return d;
  }
  if (is_file_data(o.data)) {
    auto files = load_file_data(o.data, {.input_columns = o.input_columns,
                                         .target_columns = o.target_columns,
                                         .kind = parse_target_kind(o.task),
                                         .test_path = o.test_data});
    return {std::move(files.train), std::move(files.test), files.test_source};
  }
  return {load_fashion_mnist(o.data, Split::train), load_fashion_mnist(o.data, Split::test), ""};
}

class SupervisedTask : public Task {
 public:
  SupervisedTask(const TrainOptions& o, const Device& device, int rank, int world_size)
      : data_(load_data(o)),
        // --drop-last (Note [uneven epochs] in uneven.h): pad as PyTorch's sampler,
        // true cuts the set's tail and each rank's short last batch, false neither
        // pads nor cuts (uneven shares). The test set is cut never, padded unless false.
        loader_(data_.train,
                {.batch_size = o.batch_size,
                 .device = device,
                 .drop_last = o.drop_last == DropLast::drop},
                DistributedSampler(data_.train.size(), rank, world_size,
                                   {.shuffle = true,
                                    .seed = o.seed,
                                    .drop_last = o.drop_last == DropLast::drop,
                                    .pad = o.drop_last != DropLast::uneven})),
        test_loader_(
            data_.test, {.batch_size = 1000, .device = device},
            DistributedSampler(data_.test.size(), rank, world_size,
                               {.shuffle = false, .pad = o.drop_last != DropLast::uneven})) {
    const auto& in = data_.train.inputs.shape();
    const Shape sample(in.begin() + 1, in.end());
    // A regression has one output per target column.
    const int64_t outputs =
        regression() ? data_.train.labels.numel() / data_.train.size() : data_.train.num_classes;
    Generator gen(o.seed);
    if (o.user_model != nullptr) {
      DDP_CHECK(static_cast<bool>(o.user_model->build), "UserModel '{}' has no build function",
                o.user_model->name);
      model_ = o.user_model->build(sample, outputs, gen);
      DDP_CHECK(model_ != nullptr, "UserModel '{}': build returned no module", o.user_model->name);
      user_loss_ = o.user_model->loss;
      // The checkpoint's "model": a resume must build the same thing.
      spec_ = fmt::format("{} {} -> {}", o.user_model->name, shape_str(sample), outputs);
    } else {
      DDP_CHECK(o.catalog != nullptr && o.catalog->build,
                "no model to train: --model {} needs a model catalog (train has the zoo's), or "
                "give the program a UserModel (train_main.h)",
                o.model.name);
      BuiltModel built = o.catalog->build(o.model, sample, outputs, gen);
      model_ = std::move(built.module);
      spec_ = std::move(built.spec);
    }
    model_->to(device);
  }

  std::string model_spec() const override { return spec_; }
  std::shared_ptr<nn::Module> model() const override { return model_; }
  bool is_language_model() const override { return false; }
  bool is_regression() const override { return regression(); }
  std::string data_summary() const override {
    return fmt::format("{} ({} train / {} test{}{})", data_.train.name, data_.train.size(),
                       data_.test.size(), data_.test_source.empty() ? "" : ": ", data_.test_source);
  }
  int64_t train_size() const override { return data_.train.size(); }

  std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o) const override {
    if (o.optimizer == "adamw") {
      return std::make_unique<optim::AdamW>(
          model_->parameters(), optim::AdamWOptions{.lr = o.lr, .weight_decay = o.weight_decay});
    }
    return std::make_unique<optim::SGD>(model_->parameters(),
                                        optim::SgdOptions{.lr = o.lr,
                                                          .momentum = o.momentum,
                                                          .weight_decay = o.weight_decay,
                                                          .nesterov = o.nesterov});
  }

  int64_t num_batches() const override { return loader_.num_batches(); }
  int64_t num_batches_of(int rank) const override { return loader_.num_batches_of(rank); }
  int64_t batch_rows(int rank, int64_t batch) const override {
    return loader_.batch_rows_of(rank, batch);
  }
  void start_epoch(int64_t epoch) override { loader_.start_epoch(epoch); }
  bool reshardable() const override { return true; }
  void reshard(int rank, int world_size) override {
    loader_.reshard(rank, world_size);
    test_loader_.reshard(rank, world_size);
  }
  void start_epoch_at(int64_t epoch, int64_t start) override { loader_.start_epoch(epoch, start); }
  bool next(Batch& batch) override { return loader_.next(batch); }
  Tensor loss(const Tensor& output, const Batch& batch) const override {
    if (user_loss_) return user_loss_(output, batch.labels);
    if (regression()) return functional::mse_loss(output, batch.labels);
    return functional::cross_entropy(output, batch.labels);
  }
  int64_t tokens_per_sample() const override { return 1; }

  // comm (world size > 1): every rank evaluates its shard; correct and total are summed.
  Evaluation evaluate(nn::Module& model, Communicator* comm) override {
    NoGradGuard no_grad;
    model.eval();
    test_loader_.start_epoch(0);
    if (regression()) return evaluate_regression(model, comm);
    int64_t correct = 0, total = 0;
    for_each_eval_batch(
        eval_lockstep, [&](Batch& b) { return test_loader_.next(b); },
        [&](const Batch& batch) {
          const auto predicted = argmax(model(batch.inputs), 1).to_vector<int64_t>();
          const auto labels = batch.labels.to_vector<int64_t>();
          for (size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i] ? 1 : 0;
          total += static_cast<int64_t>(labels.size());
        });
    model.train();
    if (comm != nullptr) {
      Tensor counts = from_vector<int64_t>({correct, total}, {2},
                                           {.dtype = DType::i64, .device = comm->device()});
      const CollectiveLabel labelled("eval counts");
      comm->all_reduce(counts)->wait();
      const auto summed = counts.to_vector<int64_t>();
      correct = summed[0];
      total = summed[1];
    }
    Evaluation e;
    e.accuracy = total == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(total);
    return e;
  }

 private:
  bool regression() const { return data_.train.num_classes == 0; }

  // The mean squared error over every element of every rank's test shard.
  Evaluation evaluate_regression(nn::Module& model, Communicator* comm) {
    double squared = 0, count = 0;
    for_each_eval_batch(
        eval_lockstep, [&](Batch& b) { return test_loader_.next(b); },
        [&](const Batch& batch) {
          const Tensor out = model(batch.inputs);
          DDP_CHECK(out.numel() == batch.labels.numel(),
                    "evaluation: the model's output {} does not match the targets {}: a "
                    "regression needs one output per target",
                    shape_str(out.shape()), shape_str(batch.labels.shape()));
          const auto predicted = out.to(DType::f32).to_vector<float>();
          const auto targets = batch.labels.to(DType::f32).to_vector<float>();
          for (size_t i = 0; i < targets.size(); ++i) {
            const double d = static_cast<double>(predicted[i]) - targets[i];
            squared += d * d;
          }
          count += static_cast<double>(targets.size());
        });
    model.train();
    const auto summed = sum_over_ranks(comm, {squared, count}, "eval sums");
    squared = summed[0];
    count = summed[1];
    Evaluation e;
    e.loss = count == 0 ? 0.0 : squared / count;
    return e;
  }

  Data data_;
  DataLoader loader_, test_loader_;
  std::shared_ptr<nn::Module> model_;
  std::function<Tensor(const Tensor&, const Tensor&)> user_loss_;  // UserModel::loss
  std::string spec_;  // model_spec(): the catalog's, or the UserModel's name and shapes
};

}  // namespace

void Task::reshard(int /*rank*/, int /*world_size*/) {
  throw ValueError(fmt::format(
      "the task of {} cannot share its data out again among other ranks (an elastic regroup)",
      model_spec()));
}

void Task::start_epoch_at(int64_t epoch, int64_t start) {
  DDP_CHECK(start == 0, "the task of {} cannot start epoch {} at sample position {}", model_spec(),
            epoch + 1, start);
  start_epoch(epoch);
}

void for_each_eval_batch(const EvalLockstep* lockstep, const std::function<bool(Batch&)>& next,
                         const std::function<void(const Batch&)>& body) {
  Batch batch;
  bool have = true;
  while (true) {
    have = have && next(batch);
    if (lockstep == nullptr) {
      if (!have) return;
      body(batch);
    } else if (lockstep->ranks_with_batch(have) == 0) {
      return;  // every rank is out of batches
    } else if (have) {
      body(batch);
    } else {
      lockstep->shadow();
    }
  }
}

std::vector<double> sum_over_ranks(Communicator* comm, std::vector<double> values,
                                   const char* label) {
  if (comm == nullptr) return values;
  const std::vector<float> narrow(values.begin(), values.end());
  Tensor sums = from_vector<float>(narrow, {static_cast<int64_t>(narrow.size())},
                                   {.dtype = DType::f32, .device = comm->device()});
  const CollectiveLabel labelled(label);
  comm->all_reduce(sums)->wait();
  const std::vector<float> summed = sums.to_vector<float>();
  return {summed.begin(), summed.end()};
}

std::unique_ptr<Task> make_supervised_task(const TrainOptions& o, const Device& device, int rank,
                                           int world_size) {
  return std::make_unique<SupervisedTask>(o, device, rank, world_size);
}

std::unique_ptr<Task> make_task(const TrainOptions& o, const Device& device, int rank,
                                int world_size) {
  if (o.user_model == nullptr && is_language_model(o)) {
    DDP_CHECK(static_cast<bool>(o.catalog->make_language_task),
              "--model {}: the catalog names it a language model but has no language task",
              o.model.name);
    return o.catalog->make_language_task(o, device, rank, world_size);
  }
  return make_supervised_task(o, device, rank, world_size);
}

}  // namespace ddp::train
