#include "trainer/train_options.h"

#include "collectives/data_parallel/data_parallel.h"

#include "trainer/task.h"

#include "runtime/data/file_dataset.h"
#include "runtime/data/text_corpus.h"
#include "runtime/data/token_shards.h"
#include "runtime/device.h"
#include "runtime/error.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

namespace ddp::train {

const char* drop_last_name(DropLast d) {
  switch (d) {
    case DropLast::pad:
      return "pad";
    case DropLast::drop:
      return "true";
    case DropLast::uneven:
      return "false";
  }
  return "?";
}

const char* join_divide_name(JoinDivide d) {
  return d == JoinDivide::world ? "world" : "active";
}

const char* const kTrainUsage = R"(usage: train [options]

Trains a model of the zoo on Fashion-MNIST (or synthetic data), or a GPT
language model on the Brown corpus, on one device or under ddprun.

model and data:
  --model mlp|cnn|gpt-tiny|gpt-mini|gpt2|gpt:layers=L,d=D,heads=H,ctx=T
           [,vocab=V][,padded_vocab=N][,dropout=P]
                           model to train (default mlp); the gpt models change
                           the defaults marked [gpt] (docs/train.md)
  --hidden N[,N...]        mlp hidden layer sizes (default 256: 784-256-10)
  --data DIR|synthetic     Fashion-MNIST folder with the four IDX .gz files
                           (default /usr/share/datasets/fashion-mnist), or a
                           learnable synthetic data set; [gpt] the Brown corpus
                           folder (default $DDP_BROWN_DIR, else
                           /usr/share/datasets/brown), or a synthetic stream
  --synthetic-size N       training samples of --data synthetic (default 10000)
  --data FILE.npz|FILE.csv|DIR
                           [mlp, cnn] data of one's own: an .npz with arrays x
                           and y (x_test, y_test: the test set), a directory of
                           x.npy and y.npy, or a CSV with a header (docs/train.md)
  --data FILE.bin|DIR      [gpt] token shards (llm.c's .bin form; `tokenize`
                           writes them from text): FILE.bin, or DIR's .bin files,
                           those named *val* for validation (docs/data.md)
  --test-data FILE         the test set, in the form of --data (default: x_test
                           and y_test, else every 10th row held out); [gpt] the
                           validation shards (default: DIR's *val* shards, else
                           the last tenth of the tokens)
  --target-columns A[,B..] CSV: the target columns (default the last)
  --input-columns A[,B..]  CSV: the input columns (default the others)
  --task auto|classify|regress
                           targets as class ids (cross-entropy, test_acc) or
                           values (MSE, test_loss); auto: one column of integers
                           >= 0 is classes (default auto)
optimisation:
  --epochs N               passes over the training data (default 10; [gpt] 1)
  --batch-size N           samples per step and rank (default 64; [gpt] 16
                           sequences of the model's context)
  --lr X                   learning rate (default 0.02; [gpt] 0.001)
  --optimizer sgd|adamw    (default sgd; [gpt] adamw, betas 0.9, 0.99, weight
                           decay on the 2-D weights only)
  --momentum X             SGD momentum (default 0.9)
  --nesterov               SGD with Nesterov momentum
  --weight-decay X         (default 0; [gpt] 0.1; AdamW applies it decoupled)
  --lr-schedule constant|step|cosine|linear|onecycle
                           step: x0.1 every 3 epochs; cosine, linear: to 0
                           ([gpt] to lr/10) over the run's steps; onecycle:
                           torch's OneCycleLR (lr/25 up to lr, down to lr/25e4)
                           (default cosine)
  --warmup-steps N         linear warmup steps for cosine and linear, the rise
                           of onecycle (default 0, onecycle 30%; [gpt] a tenth
                           of the run, at most 100)
  --clip-grad-norm X       scale the gradients down to a global L2 norm of at
                           most X before each update (default 0: off; [gpt] 1)
  --seed N                 model initialisation and shuffling (default 0)
  --max-steps N            stop each epoch after N steps (default: no limit);
                           the schedule spans the steps the run takes
  --drop-last pad|true|false
                           when the ranks cannot share the training set evenly:
                           pad repeats samples (PyTorch's DistributedSampler;
                           default), true drops the set's tail and each rank's
                           short last batch ([gpt] the default), false does
                           neither: ranks may take different step counts and
                           train under a Join (those out of data shadow the
                           others' all-reduces with zeros)
  --join-divide world|active
                           with --drop-last false: a step's gradient sums the
                           ranks that still train and divides by the world size
                           (world, default, as PyTorch's Join) or by their count
  --eval-every N           [gpt] evaluate every N steps too (default 200; 0:
                           at epoch ends only)
  --eval-batches N         [gpt] validation batches per rank and evaluation
                           (default 20; 0: the whole validation split)
device and files:
  --device auto|cpu|cpu:N|cuda|cuda:N|mps
                           (default auto: cuda, then mps, then cpu; DDP_DEVICE
                           overrides auto). Under a launcher, cuda (or cpu with
                           DDP_VIRTUAL_CPU_DEVICES) without an index is each
                           rank's own: cuda:(LOCAL_RANK mod GPUs)
  --precision fp32|bf16    bf16 on CUDA: mixed precision as torch.autocast
                           (matmuls, attention and activations in bf16 on
                           tensor cores, LayerNorm/softmax/loss statistics in
                           f32; weights, gradients and optimizer state f32);
                           needs compute capability 8.0+. bf16 on the CPU: the
                           matmuls and convolutions multiply in bf16 (oneDNN,
                           f32 accumulation, everything else f32); needs
                           oneDNN and a CPU with AVX512_BF16 (default fp32)
  --cuda-graph             on CUDA, capture the training step (zero_grad, forward,
                           loss, backward, clipping, the optimizer's update) in a
                           CUDA graph after 2 eager steps and replay it: one
                           launch a step instead of one per kernel, the same
                           numbers (docs/cuda_graphs.md). One process on one GPU,
                           --grad-accum 1, --on-nonfinite stop; a batch of
                           another shape runs eagerly
  --profile-steps N        the op profile of N training steps (docs/profile.md):
                           each op's time inside the step, by op and shapes, and
                           the time outside any op, printed after them (default 0)
  --profile-start S        the first profiled step of the run (default 3); never
                           one of this process's first 2 steps (3 with
                           --cuda-graph: its capture), which make plans and
                           caches; an evaluation, a checkpoint or the epoch's end
                           inside the window cuts it short
  --save PATH              write a safetensors checkpoint after every epoch (never
                           over a checkpoint of a later step); the directory
                           must exist
  --save-every N           also save every N steps, mid-epoch (default 0: at
                           epoch ends only)
  --save-best PATH         also save at each evaluation that improves test_acc
                           (test_loss, [gpt] val_loss): the best model so far
  --early-stop N           stop after N evaluations in a row without improving
                           it (default 0: never)
  --resume PATH|auto       continue from a checkpoint written by --save, mid-epoch
                           included; auto: from --save's file if it exists, else
                           start fresh (for ddprun --max-restarts); cuts
                           --metrics and --loss-log back to its step first
  --metrics FILE           append one JSON object per epoch ([gpt] and per
                           --eval-every evaluation); FILE.csv: CSV rows
  --loss-log FILE          append "epoch step loss" for every step (full
                           precision; reads the loss each step, which
                           synchronizes a GPU: for parity checks)
parallelism:
  --mode auto|single|ddp|dp
                           single: one device; ddp: DistributedDataParallel over
                           the ranks of ddprun/mpirun/srun; dp: DataParallel over
                           --devices in this process (default auto: ddp when
                           WORLD_SIZE > 1, else single)
  --devices D[,D...]       dp: the devices, e.g. cpu,cpu or cuda:0,cuda:1 (the
                           first holds the model and gathers the outputs)
  --backend auto|local|shm|gloo|mpi|nccl
                           ddp: the communicator (default DDP_BACKEND, else
                           auto: nccl for CUDA, mpi under mpirun, shm on one
                           node, gloo across nodes). Several ranks on one GPU:
                           shm or gloo
  --bucket-cap-mb X        ddp: gradient bucket size in MiB (default 25)
  --comm-hook none|bf16|fp16
                           ddp: compress each bucket for the all_reduce
                           (default none)
  --zero 0|1|2|3           ddp: 0 DistributedDataParallel (default); 1 ZeRO-1:
                           each rank keeps AdamW/SGD-momentum state for its
                           1/W shard of the parameters, updates it and
                           all-gathers the parameters; 2 ZeRO-2: the gradients
                           are reduce-scattered too, each rank keeps its shard;
                           3 ZeRO-3 (FSDP): the parameters too, each unit
                           gathered just before its forward and backward
                           (docs/ddp.md: when to pick which)
  --zero-replicas 1|2      --zero 1|2: 2 keeps a second copy of each rank's
                           optimizer shard on the rank before it, so that
                           ddprun --on-failure continue can go on after a rank
                           dies (docs/elastic.md); state memory 2/W instead of
                           1/W, and at --zero 2 (W-1)/W more elements moved per
                           step (default 1)
  --zero3-units A,B,...    --zero 3: the modules gathered as one unit, by
                           dotted name (transformer.h.0); default: each child
                           of a Sequential (each gpt block, each mlp layer),
                           the rest in the root unit
  --zero3-reshard-after-forward true|false
                           --zero 3: release a unit after its forward and
                           gather it again for its backward (true, default),
                           or keep it until its backward (faster, more memory)
  --save-sharded           with --zero 1|2|3 and --save PATH: every rank writes
                           its shard of the optimizer state (--zero 3: and of
                           the parameters) to PATH.shard<r>of<W>.step<N>, PATH
                           holds the model (--zero 3: no parameters) and names
                           them (no rank gathers the whole state or model);
                           resumes at any world size
  --on-nonfinite stop|skip a NaN or infinite loss or gradient norm stops the
                           run naming the step and rank (stop, default) or its
                           update is left out on every rank (skip)
  --grad-accum K           micro-batches of --batch-size per optimizer step;
                           under ddp the first K-1 run under no_sync()
                           (default 1)
output:
  --log-every N            a progress line every N steps (default: a progress
                           bar on a terminal, one line per epoch otherwise)
  --quiet                  only the summary
  --summary                print the model's layers and parameter counts first
  -h, --help               this text
)";

namespace {

template <typename T>
T parse_number(const std::string& flag, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  std::from_chars_result r;
  r = std::from_chars(text.data(), end, value);
  const bool whole = r.ptr == end && r.ec != std::errc::invalid_argument;
  if constexpr (std::is_floating_point_v<T>) {
    // A number out of the type's range (1e39, 1e-50 for a float) is a number: say
    // what the range is.
    DDP_CHECK(!whole || r.ec != std::errc::result_out_of_range,
              "{} '{}': out of range (magnitudes from about {:.2g} to {:.2g}, or 0)", flag, text,
              std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::max());
    DDP_CHECK(r.ec == std::errc() && r.ptr == end, "{} '{}': expected a number", flag, text);
    DDP_CHECK(std::isfinite(value), "{} '{}': must be a finite number", flag, text);
  } else {
    // "-1" for an unsigned flag, or 99999999999999999999: a whole number out of range.
    const bool negative_unsigned = std::is_unsigned_v<T> && text.starts_with('-') &&
                                   text.size() > 1 &&
                                   text.find_first_not_of("0123456789", 1) == std::string::npos;
    DDP_CHECK((!whole || r.ec != std::errc::result_out_of_range) && !negative_unsigned,
              "{} '{}': out of range (a whole number from {} to {})", flag, text,
              std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
    DDP_CHECK(r.ec == std::errc() && r.ptr == end, "{} '{}': expected a whole number", flag, text);
  }
  return value;
}

void check_choice(const std::string& flag, const std::string& value,
                  std::initializer_list<const char*> valid) {
  for (const char* v : valid) {
    if (value == v) return;
  }
  std::string list;
  for (const char* v : valid) list += (list.empty() ? "" : ", ") + std::string(v);
  throw ValueError(fmt::format("{} '{}': valid values are {}", flag, value, list));
}

// "a,b,c" -> {a, b, c}; an empty name (",," or a trailing comma) is an error.
std::vector<std::string> parse_column_list(const std::string& flag, const std::string& value) {
  std::vector<std::string> names;
  size_t start = 0;
  while (true) {
    const size_t comma = value.find(',', start);
    names.push_back(value.substr(start, comma == std::string::npos ? comma : comma - start));
    DDP_CHECK(!names.back().empty(), "{} '{}': expected column names separated by commas", flag,
              value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

// --hidden: "256" or "256,128"; throws ValueError naming the text.
std::vector<int64_t> parse_hidden(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    DDP_CHECK(
        ec == std::errc() && ptr == part.data() + part.size() && v > 0,
        "--hidden '{}': expected positive layer sizes separated by commas, like 256 or 512,256",
        text);
    out.push_back(v);
  }
  DDP_CHECK(!out.empty(), "--hidden '{}': expected at least one layer size", text);
  return out;
}

using Setter = std::function<void(TrainOptions&, const std::string&)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"--model",
       [](auto& o, auto& v) {
         // A bad name or spec is a usage error, named now. Without a catalog the
         // program trains its own model, and train_main refuses --model.
         if (o.catalog != nullptr && o.catalog->check) o.catalog->check(v);
         o.model.name = v;
       }},
      {"--hidden", [](auto& o, auto& v) { o.model.hidden = parse_hidden(v); }},
      {"--data", [](auto& o, auto& v) { o.data = v; }},
      {"--synthetic-size",
       [](auto& o, auto& v) { o.synthetic_size = parse_number<int64_t>("--synthetic-size", v); }},
      {"--test-data", [](auto& o, auto& v) { o.test_data = v; }},
      {"--save-best", [](auto& o, auto& v) { o.save_best = v; }},
      {"--early-stop",
       [](auto& o, auto& v) { o.early_stop = parse_number<int64_t>("--early-stop", v); }},
      {"--target-columns",
       [](auto& o, auto& v) { o.target_columns = parse_column_list("--target-columns", v); }},
      {"--input-columns",
       [](auto& o, auto& v) { o.input_columns = parse_column_list("--input-columns", v); }},
      {"--task",
       [](auto& o, auto& v) {
         check_choice("--task", v, {"auto", "classify", "regress"});
         o.task = v;
       }},
      {"--epochs", [](auto& o, auto& v) { o.epochs = parse_number<int64_t>("--epochs", v); }},
      {"--batch-size",
       [](auto& o, auto& v) { o.batch_size = parse_number<int64_t>("--batch-size", v); }},
      {"--lr", [](auto& o, auto& v) { o.lr = parse_number<float>("--lr", v); }},
      {"--optimizer",
       [](auto& o, auto& v) {
         check_choice("--optimizer", v, {"sgd", "adamw"});
         o.optimizer = v;
       }},
      {"--momentum", [](auto& o, auto& v) { o.momentum = parse_number<float>("--momentum", v); }},
      {"--weight-decay",
       [](auto& o, auto& v) { o.weight_decay = parse_number<float>("--weight-decay", v); }},
      {"--lr-schedule",
       [](auto& o, auto& v) {
         check_choice("--lr-schedule", v, {"constant", "step", "cosine", "linear", "onecycle"});
         o.lr_schedule = v;
       }},
      {"--warmup-steps",
       [](auto& o, auto& v) { o.warmup_steps = parse_number<int64_t>("--warmup-steps", v); }},
      {"--clip-grad-norm",
       [](auto& o, auto& v) { o.clip_grad_norm = parse_number<float>("--clip-grad-norm", v); }},
      {"--eval-every",
       [](auto& o, auto& v) { o.eval_every = parse_number<int64_t>("--eval-every", v); }},
      {"--eval-batches",
       [](auto& o, auto& v) { o.eval_batches = parse_number<int64_t>("--eval-batches", v); }},
      {"--seed", [](auto& o, auto& v) { o.seed = parse_number<uint64_t>("--seed", v); }},
      {"--max-steps",
       [](auto& o, auto& v) { o.max_steps = parse_number<int64_t>("--max-steps", v); }},
      {"--profile-steps",
       [](auto& o, auto& v) { o.profile_steps = parse_number<int64_t>("--profile-steps", v); }},
      {"--profile-start",
       [](auto& o, auto& v) { o.profile_start = parse_number<int64_t>("--profile-start", v); }},
      {"--drop-last",
       [](auto& o, auto& v) {
         check_choice("--drop-last", v, {"pad", "true", "false"});
         o.drop_last = v == "pad" ? DropLast::pad : v == "true" ? DropLast::drop : DropLast::uneven;
       }},
      {"--join-divide",
       [](auto& o, auto& v) {
         check_choice("--join-divide", v, {"world", "active"});
         o.join_divide = v == "world" ? JoinDivide::world : JoinDivide::active;
       }},
      {"--device", [](auto& o, auto& v) { o.device = v; }},
      {"--precision",
       [](auto& o, auto& v) {
         check_choice("--precision", v, {"fp32", "bf16"});
         o.precision = v;
       }},
      {"--save", [](auto& o, auto& v) { o.save = v; }},
      {"--resume", [](auto& o, auto& v) { o.resume = v; }},
      {"--save-every",
       [](auto& o, auto& v) { o.save_every = parse_number<int64_t>("--save-every", v); }},
      {"--on-nonfinite",
       [](auto& o, auto& v) {
         check_choice("--on-nonfinite", v, {"stop", "skip"});
         o.on_nonfinite = v;
       }},
      {"--metrics", [](auto& o, auto& v) { o.metrics = v; }},
      {"--loss-log", [](auto& o, auto& v) { o.loss_log = v; }},
      {"--mode",
       [](auto& o, auto& v) {
         check_choice("--mode", v, {"auto", "single", "ddp", "dp"});
         o.mode = v;
       }},
      {"--devices", [](auto& o, auto& v) { o.devices = v; }},
      {"--backend",
       [](auto& o, auto& v) {
         check_choice("--backend", v, {"auto", "local", "shm", "gloo", "mpi", "nccl"});
         o.backend = v;
       }},
      {"--bucket-cap-mb",
       [](auto& o, auto& v) { o.bucket_cap_mb = parse_number<double>("--bucket-cap-mb", v); }},
      {"--comm-hook",
       [](auto& o, auto& v) {
         check_choice("--comm-hook", v, {"none", "bf16", "fp16"});
         o.comm_hook = v;
       }},
      {"--zero",
       [](auto& o, auto& v) {
         check_choice("--zero", v, {"0", "1", "2", "3"});
         o.zero = std::stoi(v);
       }},
      {"--zero-replicas",
       [](auto& o, auto& v) {
         check_choice("--zero-replicas", v, {"1", "2"});
         o.zero_replicas = std::stoi(v);
       }},
      {"--zero3-units",
       [](auto& o, auto& v) {
         o.zero3_units.clear();
         for (size_t start = 0; start <= v.size();) {
           const size_t comma = std::min(v.find(',', start), v.size());
           const std::string name = v.substr(start, comma - start);
           DDP_CHECK(!name.empty(),
                     "--zero3-units '{}': an empty module name; give dotted names separated by "
                     "commas, e.g. transformer.h.0,transformer.h.1",
                     v);
           o.zero3_units.push_back(name);
           start = comma + 1;
         }
       }},
      {"--zero3-reshard-after-forward",
       [](auto& o, auto& v) {
         check_choice("--zero3-reshard-after-forward", v, {"true", "false"});
         o.zero3_reshard_after_forward = v == "true";
       }},
      {"--grad-accum",
       [](auto& o, auto& v) { o.grad_accum = parse_number<int64_t>("--grad-accum", v); }},
      {"--log-every",
       [](auto& o, auto& v) { o.log_every = parse_number<int64_t>("--log-every", v); }},
  };
  return table;
}

// Note [gpt defaults]: nanoGPT's recipe for small character-level models, the
// nearest to ours (bytes, 1-10M parameters): AdamW with betas (0.9, 0.99) (a
// shorter second-moment memory for small batches of tokens), weight decay 0.1 on
// the 2-D weights, lr 1e-3 with a linear warmup and a cosine decay to lr/10,
// gradients clipped to norm 1. An epoch of the corpus's 5.4 MB is long on a CPU
// (1300 steps of 16 windows of 256 bytes for gpt-mini), so --epochs is 1 and
// --max-steps, when given, ends the run. Batches of 16 sequences keep a gpt-mini
// step near a second here. A flag given on the command line always wins.
void apply_model_defaults(TrainOptions& o) {
  const auto unset = [&](const char* flag) { return o.given.count(flag) == 0; };
  if (!is_language_model(o)) {
    if (unset("--eval-every")) o.eval_every = 0;
    if (unset("--drop-last")) o.drop_last = DropLast::pad;
    return;
  }
  if (unset("--drop-last")) o.drop_last = DropLast::drop;
  if (unset("--data")) {
    const char* dir = std::getenv("DDP_BROWN_DIR");
    o.data = dir != nullptr && *dir != '\0' ? dir : kBrownCorpusDir;
  }
  if (unset("--epochs")) o.epochs = 1;
  if (unset("--batch-size")) o.batch_size = 16;
  if (unset("--optimizer")) o.optimizer = "adamw";
  if (unset("--lr")) o.lr = 1e-3f;
  if (unset("--weight-decay")) o.weight_decay = 0.1f;
  if (unset("--clip-grad-norm")) o.clip_grad_norm = 1.0f;
  if (unset("--eval-every")) o.eval_every = 200;
  o.auto_warmup = unset("--warmup-steps");
  o.min_lr_fraction = 0.1f;
  o.beta2 = 0.99f;
}

// The files a run writes must be distinct, however they are spelled (./ck.st and
// ck.st, a symbolic link): two flags on one file interleave or overwrite each
// other (a metrics file with loss rows in it; a best checkpoint replaced by the
// latest).
void check_distinct_outputs(const TrainOptions& o) {
  const std::pair<const char*, const std::string*> outputs[] = {{"--save", &o.save},
                                                                {"--save-best", &o.save_best},
                                                                {"--metrics", &o.metrics},
                                                                {"--loss-log", &o.loss_log}};
  const auto identity = [](const std::string& path) {
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(path).lexically_normal();
    const std::filesystem::path p = std::filesystem::weakly_canonical(absolute, ec);
    return ec ? absolute : p;
  };
  for (size_t i = 0; i < std::size(outputs); ++i) {
    for (size_t j = i + 1; j < std::size(outputs); ++j) {
      const std::string& a = *outputs[i].second;
      const std::string& b = *outputs[j].second;
      if (a.empty() || b.empty()) continue;
      DDP_CHECK(identity(a) != identity(b),
                "{} {} and {} {} are one file: each needs a path of its own", outputs[i].first, a,
                outputs[j].first, b);
    }
  }
}

void validate(const TrainOptions& o) {
  DDP_CHECK(o.epochs >= 1, "--epochs {}: must be at least 1", o.epochs);
  DDP_CHECK(o.batch_size >= 1, "--batch-size {}: must be at least 1", o.batch_size);
  DDP_CHECK(o.lr > 0, "--lr {}: must be positive", o.lr);
  DDP_CHECK(o.momentum >= 0 && o.momentum < 1, "--momentum {}: must be in [0, 1)", o.momentum);
  DDP_CHECK(o.weight_decay >= 0, "--weight-decay {}: must be >= 0", o.weight_decay);
  DDP_CHECK(!o.nesterov || (o.optimizer == "sgd" && o.momentum > 0),
            "--nesterov needs --optimizer sgd with --momentum > 0");
  DDP_CHECK(o.synthetic_size >= 10, "--synthetic-size {}: must be at least 10", o.synthetic_size);
  DDP_CHECK(o.log_every >= 0, "--log-every {}: must be >= 0 (0: a progress bar)", o.log_every);
  DDP_CHECK(o.max_steps >= 0, "--max-steps {}: must be >= 0 (0: every step of the epochs)",
            o.max_steps);
  DDP_CHECK(o.warmup_steps >= 0, "--warmup-steps {}: must be >= 0", o.warmup_steps);
  // Bounds that keep the step and sample arithmetic (epochs x steps, n + batch - 1) in
  // range; no run comes near them.
  constexpr int64_t kMaxEpochs = 1'000'000'000, kMaxBatch = 2'147'483'647;
  DDP_CHECK(o.epochs <= kMaxEpochs, "--epochs {}: at most {}", o.epochs, kMaxEpochs);
  DDP_CHECK(o.batch_size <= kMaxBatch, "--batch-size {}: at most {} samples per rank", o.batch_size,
            kMaxBatch);
  // A flag that would change nothing is refused, as --eval-every for the mlp is.
  DDP_CHECK(o.given.count("--warmup-steps") == 0 || o.warmup_steps == 0 ||
                (o.lr_schedule != "constant" && o.lr_schedule != "step"),
            "--warmup-steps {}: --lr-schedule {} has no warmup (it warms up cosine, linear and "
            "onecycle); pass one of those, or drop --warmup-steps",
            o.warmup_steps, o.lr_schedule);
  DDP_CHECK(o.given.count("--momentum") == 0 || o.optimizer == "sgd",
            "--momentum {}: --optimizer {} has no momentum to set (AdamW's is its betas, "
            "here {} and {}); pass --optimizer sgd, or drop --momentum",
            o.momentum, o.optimizer, o.beta1, o.beta2);
  DDP_CHECK(o.bucket_cap_mb > 0, "--bucket-cap-mb {}: must be positive (MiB, e.g. 25)",
            o.bucket_cap_mb);
  DDP_CHECK(o.clip_grad_norm >= 0, "--clip-grad-norm {}: must be >= 0 (0: off)", o.clip_grad_norm);
  DDP_CHECK(o.eval_every >= 0 && o.eval_batches >= 0,
            "--eval-every {} and --eval-batches {}: must be >= 0", o.eval_every, o.eval_batches);
  const bool gpt = is_language_model(o);
  DDP_CHECK(gpt || (o.given.count("--eval-every") == 0 && o.given.count("--eval-batches") == 0),
            "--eval-every and --eval-batches are for the gpt models (--model {} is evaluated by "
            "test accuracy at each epoch's end)",
            o.model.name);
  DDP_CHECK(!gpt || o.mode != "dp",
            "--mode dp runs the mlp and cnn only; train --model {} with ddprun (--mode ddp)",
            o.model.name);
  DDP_CHECK(!gpt || o.drop_last != DropLast::pad,
            "--drop-last pad: the gpt models' windows are never padded (a repeated window "
            "would count twice); use --drop-last true (their default: the partial last batch "
            "is dropped) or false (uneven shares under a Join)");
  DDP_CHECK(o.given.count("--join-divide") == 0 || o.drop_last == DropLast::uneven,
            "--join-divide {} applies with --drop-last false (ranks with different step "
            "counts); this run has --drop-last {}",
            join_divide_name(o.join_divide), drop_last_name(o.drop_last));
  const bool file_flags = o.given.count("--test-data") + o.given.count("--target-columns") +
                              o.given.count("--input-columns") + o.given.count("--task") >
                          0;
  // A folder of .npy files is file data even beside a stray .bin (notes.bin); the
  // loader names what it lacks (X.npy for x.npy, say).
  std::error_code npy_ec;
  const bool npy_dir = std::filesystem::is_directory(o.data, npy_ec) && is_file_data(o.data);
  const bool shards = !npy_dir && is_token_shard_data(o.data);
  DDP_CHECK(gpt || !shards,
            "--data {} holds token shards (.bin), which the gpt models train on; use --model "
            "gpt-tiny, gpt-mini, gpt2 or gpt:..., or give the mlp and cnn an .npz, .csv or "
            "IDX folder",
            o.data);
  if (std::error_code ec; !shards && std::filesystem::is_regular_file(o.data, ec)) {
    DDP_CHECK(!gpt,
              "--data {0} is a file: a gpt model trains on token shards (.bin, which `tokenize "
              "--out DIR {0}` writes from text) or the Brown corpus folder; {1}",
              o.data,
              is_file_data(o.data) ? "an .npz or .csv is data for the mlp and cnn"
                                   : "tokenize the text, then pass --data DIR");
    DDP_CHECK(is_file_data(o.data),
              "--data {} is a file the mlp and cnn cannot read: expected an .npz (arrays x, y), "
              "a .csv with a header, a directory of .npy files, or the Fashion-MNIST folder; a "
              "gpt model (--model gpt-tiny ...) trains on token shards",
              o.data);
  }
  const bool shard_flags_only = shards && o.given.count("--target-columns") +
                                                  o.given.count("--input-columns") +
                                                  o.given.count("--task") ==
                                              0;
  DDP_CHECK(!gpt || !file_flags || shard_flags_only,
            "--target-columns, --input-columns and --task are for the mlp and cnn on data files "
            "(--data FILE.npz|FILE.csv|DIR), and --test-data for those or token shards (--data "
            "FILE.bin|DIR); --model {} reads {}",
            o.model.name, shards ? "token shards" : "text");
  DDP_CHECK(!file_flags || is_file_data(o.data) || shards,
            "--test-data, --target-columns, --input-columns and --task need --data FILE.npz, "
            "FILE.csv or a directory with x.npy and y.npy; this run has --data {}",
            o.data);
  DDP_CHECK(!gpt || o.given.count("--hidden") == 0,
            "--hidden sets the mlp's layers; a gpt model's size is its spec, e.g. --model "
            "gpt:layers=4,d=128,heads=4,ctx=128");
  DDP_CHECK(o.zero == 0 || o.mode == "auto" || o.mode == "ddp",
            "--zero {} shards over the ranks of --mode ddp; this run has --mode {} (use --mode "
            "ddp or auto, or --zero 0)",
            o.zero, o.mode);
  DDP_CHECK(o.zero_replicas == 1 || o.zero == 1 || o.zero == 2,
            "--zero-replicas {} keeps a second copy of each ZeRO-1/2 optimizer shard; this run has "
            "--zero {} ({}); use --zero 1 or 2, or --zero-replicas 1",
            o.zero_replicas, o.zero,
            o.zero == 0 ? "every rank holds the whole state already"
                        : "ZeRO-3's parameter shards have no replicas");
  DDP_CHECK(o.zero < 2 || o.comm_hook == "none",
            "--comm-hook {} compresses DDP's all_reduce, which --zero {} replaces by a "
            "reduce-scatter; use --zero 1 or --comm-hook none",
            o.comm_hook, o.zero);
  DDP_CHECK(o.zero < 2 || o.drop_last != DropLast::uneven,
            "--drop-last false (uneven shares under a Join) needs DDP's buckets, which --zero {} "
            "does without; use --zero 1 or --drop-last pad/true",
            o.zero);
  DDP_CHECK(!o.save_sharded || (o.zero > 0 && !o.save.empty()),
            "--save-sharded writes each rank's ZeRO shard of the optimizer state (at --zero 3 "
            "of the parameters too) next to --save; it needs --zero 1, 2 or 3 and --save PATH "
            "(this run: --zero {}, {})",
            o.zero, o.save.empty() ? "no --save" : "--save " + o.save);
  DDP_CHECK(
      o.zero == 3 || (o.zero3_units.empty() && o.given.count("--zero3-reshard-after-forward") == 0),
      "--zero3-units and --zero3-reshard-after-forward shape --zero 3; this run has --zero "
      "{} (pass --zero 3, or drop them)",
      o.zero);
  DDP_CHECK(o.grad_accum >= 1, "--grad-accum {}: must be at least 1", o.grad_accum);
  if (o.cuda_graph) {  // Note [graphed steps] in epoch.cpp
    DDP_CHECK(o.device == "auto" || o.device.starts_with("cuda"),
              "--cuda-graph captures CUDA work; this run has --device {} (use --device cuda, or "
              "drop --cuda-graph)",
              o.device);
    DDP_CHECK(o.mode == "auto" || o.mode == "single",
              "--cuda-graph captures one process's step on one GPU; this run has --mode {} (use "
              "--mode single, or drop --cuda-graph)",
              o.mode);
    DDP_CHECK(o.grad_accum == 1,
              "--cuda-graph captures a step of one micro-batch; this run has --grad-accum {} "
              "(raise --batch-size instead, or drop --cuda-graph)",
              o.grad_accum);
    DDP_CHECK(o.on_nonfinite == "stop",
              "--on-nonfinite skip reads each step's verdict on the host, which a replayed "
              "step cannot; use --on-nonfinite stop with --cuda-graph");
  }
  DDP_CHECK(o.profile_steps >= 0,
            "--profile-steps {}: must be >= 0 (the steps to profile; 0: none)", o.profile_steps);
  DDP_CHECK(o.profile_start >= 1, "--profile-start {}: must be >= 1 (the first profiled step)",
            o.profile_start);
  DDP_CHECK(o.profile_steps > 0 || o.given.count("--profile-start") == 0,
            "--profile-start {} says where --profile-steps begins; give --profile-steps N too",
            o.profile_start);
  DDP_CHECK(o.early_stop >= 0,
            "--early-stop {}: must be >= 0 (evaluations without improvement; 0: never)",
            o.early_stop);
  check_distinct_outputs(o);
  DDP_CHECK(o.save_every >= 0, "--save-every {}: must be >= 0 (steps; 0: at epoch ends only)",
            o.save_every);
  DDP_CHECK(o.save_every == 0 || !o.save.empty(),
            "--save-every {} needs --save PATH (where to write the checkpoints)", o.save_every);
  DDP_CHECK(o.resume != "auto" || !o.save.empty(),
            "--resume auto resumes from the --save file; pass --save PATH too");
  DDP_CHECK(o.resume.empty() || o.resume == "auto" || std::filesystem::exists(o.resume),
            "--resume {0}: no such file. {1}", o.resume,
            o.resume == o.save
                ? fmt::format("To resume only when {} exists (a first run or a restart), pass "
                              "--resume auto",
                              o.resume)
                : fmt::format("Check the path; to resume only when a checkpoint exists (a "
                              "first run or a restart), pass --save {} --resume auto",
                              o.resume));
  // The spelling of a device is a usage error (exit 2); whether it exists is checked
  // when the run starts (exit 1).
  if (o.device != "auto") Device::parse(o.device);
  DDP_CHECK(o.mode == "dp" || o.devices.empty(),
            "--devices {} needs --mode dp (ddp and single take --device)", o.devices);
  DDP_CHECK(o.mode != "dp" || !o.devices.empty(),
            "--mode dp needs --devices, e.g. --devices cpu,cpu or --devices cuda:0,cuda:1");
  if (!o.devices.empty()) {  // the list's spelling, as --device's
    try {
      parse_device_list(o.devices);
    } catch (const ValueError& e) {
      throw ValueError(fmt::format("--devices {}: {}", o.devices, e.what()));
    }
  }
}

// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "unknown option '--epoch'; did you mean --epochs?": the nearest flag within two
// edits (or the one the text starts, for an abbreviation), else nothing to suggest.
std::string unknown_option(const std::string& arg) {
  std::vector<std::string> flags = {"--help",         "--quiet",   "--nesterov",
                                    "--save-sharded", "--summary", "--cuda-graph"};
  for (const auto& [flag, setter] : setters()) flags.push_back(flag);
  std::string best;
  size_t best_distance = 3;
  for (const std::string& flag : flags) {
    const size_t d = edit_distance(arg, flag);
    if (d < best_distance || (best.empty() && arg.size() > 3 && flag.starts_with(arg))) {
      best = flag;
      best_distance = std::min(d, best_distance);
    }
  }
  return fmt::format("unknown option '{}'{}", arg,
                     best.empty() ? "" : fmt::format("; did you mean {}?", best));
}

}  // namespace

bool is_language_model(const TrainOptions& o) {
  return o.user_model == nullptr && o.catalog != nullptr && o.catalog->is_language_model &&
         o.catalog->is_language_model(o.model.name);
}

std::optional<TrainOptions> parse_train_args(int argc, const char* const* argv,
                                             std::shared_ptr<const ModelCatalog> catalog) {
  TrainOptions o;
  o.catalog = std::move(catalog);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (arg == "-h" || arg == "--help") return std::nullopt;
    if (arg == "--quiet" || arg == "--nesterov" || arg == "--save-sharded" || arg == "--summary" ||
        arg == "--cuda-graph") {
      DDP_CHECK(!has_value, "{} takes no value", arg);
      (arg == "--quiet"        ? o.quiet
       : arg == "--nesterov"   ? o.nesterov
       : arg == "--summary"    ? o.summary
       : arg == "--cuda-graph" ? o.cuda_graph
                               : o.save_sharded) = true;
      o.given.insert(arg);
      continue;
    }
    auto it = setters().find(arg);
    if (it == setters().end()) throw ValueError(unknown_option(arg));
    if (!has_value) {
      DDP_CHECK(i + 1 < argc, "{} needs a value", arg);
      value = argv[++i];
    }
    it->second(o, value);
    o.given.insert(arg);
  }
  apply_model_defaults(o);
  validate(o);
  return o;
}

}  // namespace ddp::train
