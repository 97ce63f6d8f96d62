// train_main: the `train` program as a library call (train_main.h).
#include "trainer/train_main.h"

#include "collectives/elastic.h"
#include "runtime/error.h"
#include "runtime/trace.h"
#include "trainer/elastic.h"
#include "trainer/trainer.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <iostream>
#include <string>
#include <string_view>

namespace ddp::train {

int train_main(int argc, const char* const* argv, const TrainProgram& program) {
  // Line-buffered even into a pipe (ddprun's): a rank stopped by SIGTERM, whose
  // default action ends the process without flushing stdio, loses no complete line.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string& name = program.name;
  std::optional<TrainOptions> options;
  try {
    // The program's defaults first: the command line's flags come after and win.
    std::vector<const char*> args{argc > 0 ? argv[0] : name.c_str()};
    for (const auto& d : program.defaults) args.push_back(d.c_str());
    for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
    // The flags the program's own model or data replace, refused by name before
    // train's checks of them ("--task classify needs --data FILE.npz" named a flag
    // the program refuses).
    const auto refuse = [&](std::initializer_list<std::string_view> flags, const std::string& why) {
      for (int i = 1; i < argc; ++i) {  // --help first: it says which flags apply
        const std::string_view a = argv[i];
        if (a == "-h" || a == "--help") return;
      }
      for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        for (const std::string_view flag : flags) {
          const bool given = arg == flag || (arg.starts_with(flag) && arg.size() > flag.size() &&
                                             arg[flag.size()] == '=');
          DDP_CHECK(!given, "{} {}", flag, why);
        }
      }
    };
    if (program.model != nullptr) {
      refuse({"--model", "--hidden"},
             fmt::format("chooses a model of the zoo; {} trains its own ({})", name,
                         program.model->name));
    }
    if (program.data != nullptr) {
      refuse({"--data", "--test-data", "--target-columns", "--input-columns", "--task"},
             fmt::format("names data to read; {} reads its own ({})", name, program.data->name));
    }
    options = parse_train_args(static_cast<int>(args.size()), args.data(), program.catalog);
    if (options) options->program_name = name;
    if (options && program.model != nullptr) {
      for (const char* zoo_flag : {"--model", "--hidden"}) {
        DDP_CHECK(options->given.count(zoo_flag) == 0,
                  "{} chooses a model of the zoo; {} trains its own ({})", zoo_flag, name,
                  program.model->name);
      }
      options->user_model = program.model;
    }
    if (options && program.data != nullptr) {
      for (const char* data_flag :
           {"--data", "--test-data", "--target-columns", "--input-columns", "--task"}) {
        DDP_CHECK(options->given.count(data_flag) == 0,
                  "{} names data to read; {} reads its own ({})", data_flag, name,
                  program.data->name);
      }
      options->user_data = program.data;
    }
  } catch (const Error& e) {
    // One line naming the flag, the value and the rule; the usage is one command away
    // (115 lines after the error buried it, under ddprun above all).
    std::cerr << name << ": " << e.what() << "\n"
              << name << ": run '" << name << " --help' for every option\n";
    return 2;
  }
  if (!options) {
    if (program.model != nullptr) {
      std::cout << fmt::format(
          "{} trains its own model ({}) with train's options below; --model and --hidden do "
          "not apply.\n\n",
          name, program.model->name);
    }
    // train's usage, under the program's own name.
    std::string usage = kTrainUsage;
    if (constexpr std::string_view kHead = "usage: train "; usage.starts_with(kHead))
      usage.replace(0, kHead.size(), "usage: " + name + " ");
    if (program.data != nullptr) {
      usage.insert(usage.find('\n') + 1,
                   fmt::format("\n{} reads its own data ({}); --data, --test-data, --task "
                               "and the column flags do not apply.\n",
                               name, program.data->name));
    }
    std::cout << usage;
    return 0;
  }
  trace::start_from_env();  // DDP_TRACE=DIR (docs/observability.md), also without ranks
  try {
    const auto result = run_training(*options, std::cout);
    if (result.rank != 0) return 0;  // rank 0 reports for the group
    if (result.epochs.empty()) {
      std::cout << fmt::format(
          "nothing to do: the checkpoint has trained --epochs {} already (or further); raise "
          "--epochs to train on{}\n",
          options->epochs,
          result.saved_as_resumed
              ? fmt::format("; wrote {} from it as it was (step {}, no step trained){}",
                            options->save, result.steps,
                            options->save_sharded && options->zero > 0 ? " as shards"
                                                                       : ", a whole checkpoint")
              : "");
      return 0;
    }
    const auto& last = result.epochs.back();
    double best = 0, best_loss = last.val_loss, rate = 0, token_rate = 0;
    for (const auto& m : result.epochs) {
      best = std::max(best, m.test_acc);
      best_loss = std::min(best_loss, m.val_loss);
      rate += m.samples_per_s / static_cast<double>(result.epochs.size());
      token_rate += m.tokens_per_s / static_cast<double>(result.epochs.size());
    }
    std::string checkpoint = options->save.empty() ? "" : "; checkpoint " + options->save;
    if (!options->save_best.empty()) {
      checkpoint += result.saved_best
                        ? "; best " + options->save_best
                        : "; no --save-best written (no evaluation beat the best so far)";
    }
    if (result.stopped_early) checkpoint += "; stopped early (--early-stop)";
    // A run that skipped most of its updates is no success: say how many.
    if (last.skipped_steps > 0) {
      checkpoint = fmt::format(
                       "; {} of {} steps skipped (--on-nonfinite skip: their loss or gradient "
                       "norm was not finite)",
                       last.skipped_steps, result.steps) +
                   checkpoint;
    }
    if (last.language && std::isfinite(result.best_metric)) best_loss = result.best_metric;
    if (last.language) {
      std::cout << fmt::format(
          "summary: {} epoch{}, {} steps on {} in {:.1f} s; final val_loss {:.4f} nats "
          "({} {:.4f}; the validation {}s' bigram entropy is {:.4f}, unigram {:.4f} "
          "bits/{}), best val_loss {:.4f}; train_loss {:.4f}; {:.0f} tokens/s{}\n",
          result.epochs.size(), result.epochs.size() == 1 ? "" : "s", result.steps,
          result.device.str(), result.total_s, last.val_loss,
          last.unit == "byte" ? "val_bpb" : "val_bits_per_token", last.val_bpb, last.unit,
          last.bigram_bits, last.unigram_bits, last.unit, best_loss, last.train_loss, token_rate,
          checkpoint);
      return 0;
    }
    // The evaluation the report lines lead with: test_acc (higher is better), or a
    // regression's test_loss (lower).
    double final_value = last.test_acc, best_value = best;
    if (last.regression) {
      final_value = best_value = last.test_loss;
      for (const auto& m : result.epochs) best_value = std::min(best_value, m.test_loss);
    }
    // The run's best, a resumed checkpoint's included (Note [best so far]).
    if (std::isfinite(result.best_metric)) best_value = result.best_metric;
    std::cout << fmt::format(
        "summary: {} epoch{} on {} in {:.1f} s; final {} {:.4f} (best {:.4f}); "
        "train_loss {:.4f}; {:.0f} samples/s{}\n",
        result.epochs.size(), result.epochs.size() == 1 ? "" : "s", result.device.str(),
        result.total_s, last.regression ? "test_loss" : "test_acc", final_value, best_value,
        last.train_loss, rate, checkpoint);
    return 0;
  } catch (const GroupStopped&) {  // Note [group stop]: it said where it stopped
    return elastic::kGroupStopExit;
  } catch (const Error& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ddp::train
