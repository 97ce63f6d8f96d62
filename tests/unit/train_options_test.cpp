// train's options for the gpt models (defaults and overrides) and the learning-rate
// schedule's span (Note [schedule span] in trainer/trainer.cpp).
#include "trainer/train_options.h"

#include "models/train/zoo_catalog.h"
#include "runtime/data/text_corpus.h"
#include "runtime/error.h"
#include "runtime/fmt.h"
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

namespace ddp::train {
namespace {

TrainOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "train");
  auto o = parse_train_args(static_cast<int>(args.size()), args.data(), models::zoo_catalog());
  EXPECT_TRUE(o.has_value());
  return *o;
}

// The ValueError's message of parsing `args`, or "no error".
std::string error(std::vector<const char*> args) {
  args.insert(args.begin(), "train");
  try {
    parse_train_args(static_cast<int>(args.size()), args.data(), models::zoo_catalog());
  } catch (const ValueError& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

TEST(TrainOptions, MlpKeepsItsDefaults) {
  const TrainOptions o = parse({});
  EXPECT_EQ(o.optimizer, "sgd");
  EXPECT_FLOAT_EQ(o.lr, 0.02f);
  EXPECT_EQ(o.clip_grad_norm, 0.0f);
  EXPECT_EQ(o.eval_every, 0);
  EXPECT_EQ(o.epochs, 10);
  EXPECT_FALSE(o.auto_warmup);
  EXPECT_FLOAT_EQ(o.beta2, 0.999f);
}

TEST(TrainOptions, GptDefaults) {
  const TrainOptions o = parse({"--model", "gpt-tiny"});
  EXPECT_EQ(o.optimizer, "adamw");
  EXPECT_FLOAT_EQ(o.lr, 1e-3f);
  EXPECT_FLOAT_EQ(o.weight_decay, 0.1f);
  EXPECT_FLOAT_EQ(o.clip_grad_norm, 1.0f);
  EXPECT_FLOAT_EQ(o.beta2, 0.99f);
  EXPECT_EQ(o.epochs, 1);
  EXPECT_EQ(o.batch_size, 16);
  EXPECT_TRUE(o.auto_warmup);
  const char* dir = std::getenv("DDP_BROWN_DIR");
  EXPECT_EQ(o.data, dir != nullptr && *dir != '\0' ? dir : kBrownCorpusDir);
}

TEST(TrainOptions, ExplicitFlagsBeatGptDefaults) {
  const TrainOptions o =
      parse({"--model=gpt:layers=1,d=32,heads=2,ctx=16", "--lr", "0.01", "--clip-grad-norm", "0",
             "--warmup-steps", "0", "--optimizer", "sgd", "--weight-decay", "0", "--data",
             "synthetic", "--epochs", "3"});
  EXPECT_FLOAT_EQ(o.lr, 0.01f);
  EXPECT_EQ(o.clip_grad_norm, 0.0f);
  EXPECT_FALSE(o.auto_warmup);
  EXPECT_EQ(o.optimizer, "sgd");
  EXPECT_EQ(o.weight_decay, 0.0f);
  EXPECT_EQ(o.data, "synthetic");
  EXPECT_EQ(o.epochs, 3);
}

// --drop-last (Note [uneven epochs] in trainer/uneven.h): pad for the mlp, true
// for gpt (its windows are never padded, so pad is a usage error); --join-divide
// only with --drop-last false.
// Output flags on one file, however spelled, are refused (a metrics file with loss
// rows in it; a best checkpoint overwritten by the latest).
TEST(TrainOptions, OutputFilesMustBeDistinct) {
  EXPECT_NE(error({"--save", "ck.st", "--save-best", "./ck.st"})
                .find("--save ck.st and --save-best ./ck.st are one file"),
            std::string::npos);
  EXPECT_NE(error({"--metrics", "m.jsonl", "--loss-log", "sub/../m.jsonl"})
                .find("--metrics m.jsonl and --loss-log sub/../m.jsonl are one file"),
            std::string::npos);
  EXPECT_NE(error({"--save", "x.st", "--metrics", "x.st"}).find("are one file"), std::string::npos);
  EXPECT_EQ(error({"--save", "a.st", "--save-best", "b.st", "--metrics", "m.jsonl", "--loss-log",
                   "l.txt"}),
            "no error");
}

// A misspelt --devices list is a usage error, as --device's spelling.
TEST(TrainOptions, DevicesListSpellingIsCheckedAtParse) {
  EXPECT_NE(error({"--mode", "dp", "--devices", "tpu,tpu"}).find("--devices tpu,tpu: "),
            std::string::npos);
  EXPECT_NE(error({"--mode", "dp", "--devices", "cpu,,cpu"}).find("empty entry"),
            std::string::npos);
  EXPECT_EQ(error({"--mode", "dp", "--devices", "cpu,cpu"}), "no error");
}

TEST(TrainOptions, DropLastDefaultsAndErrors) {
  EXPECT_EQ(parse({}).drop_last, DropLast::pad);
  EXPECT_EQ(parse({"--model", "gpt-tiny"}).drop_last, DropLast::drop);
  EXPECT_EQ(parse({"--drop-last", "true"}).drop_last, DropLast::drop);
  EXPECT_EQ(parse({"--drop-last", "false"}).join_divide, JoinDivide::world);
  EXPECT_EQ(parse({"--drop-last", "false", "--join-divide", "active"}).join_divide,
            JoinDivide::active);
  EXPECT_EQ(parse({"--model", "gpt-tiny", "--drop-last", "false"}).drop_last, DropLast::uneven);
  EXPECT_STREQ(drop_last_name(DropLast::uneven), "false");
  EXPECT_STREQ(join_divide_name(JoinDivide::active), "active");
  EXPECT_NE(error({"--drop-last", "maybe"})
                .find("--drop-last 'maybe': valid values are pad, true, "
                      "false"),
            std::string::npos);
  EXPECT_NE(error({"--model", "gpt-tiny", "--drop-last", "pad"}).find("windows are never padded"),
            std::string::npos);
  EXPECT_NE(error({"--join-divide", "active"})
                .find("--join-divide active applies with --drop-last false"),
            std::string::npos);
  EXPECT_NE(error({"--drop-last", "true", "--join-divide", "world"})
                .find("--join-divide world applies with --drop-last false (ranks with different "
                      "step counts); this run has --drop-last true"),
            std::string::npos);
}

TEST(TrainOptions, CudaGraphNamesWhatItCannotCapture) {
  EXPECT_FALSE(parse({}).cuda_graph);
  EXPECT_TRUE(parse({"--cuda-graph", "--device", "cuda:0", "--model", "gpt-tiny"}).cuda_graph);
  const auto graph_error = [](std::vector<const char*> args) {
    args.push_back("--cuda-graph");
    return error(args);
  };
  EXPECT_NE(graph_error({"--device", "cpu"}).find("this run has --device cpu"), std::string::npos);
  EXPECT_NE(
      graph_error({"--mode", "dp", "--devices", "cuda:0,cuda:1"}).find("this run has --mode dp"),
      std::string::npos);
  EXPECT_NE(graph_error({"--grad-accum", "4"}).find("this run has --grad-accum 4"),
            std::string::npos);
  EXPECT_NE(
      graph_error({"--on-nonfinite", "skip"}).find("use --on-nonfinite stop with --cuda-graph"),
      std::string::npos);
  EXPECT_NE(graph_error({"--cuda-graph=yes"}).find("--cuda-graph takes no value"),
            std::string::npos);
}

TEST(TrainOptions, ProfileStepsNameTheirValues) {
  EXPECT_EQ(parse({}).profile_steps, 0);
  const TrainOptions o = parse({"--profile-steps", "4", "--profile-start", "7"});
  EXPECT_EQ(o.profile_steps, 4);
  EXPECT_EQ(o.profile_start, 7);
  EXPECT_EQ(parse({"--profile-steps", "2"}).profile_start, 3);
  EXPECT_NE(error({"--profile-steps", "-1"}).find("--profile-steps -1: must be >= 0"),
            std::string::npos);
  EXPECT_NE(error({"--profile-steps", "2", "--profile-start", "0"})
                .find("--profile-start 0: must be >= 1"),
            std::string::npos);
  EXPECT_NE(error({"--profile-start", "5"}).find("give --profile-steps N too"), std::string::npos);
}

TEST(TrainOptions, BadGptSpecIsAUsageError) {
  EXPECT_THROW(
      parse_train_args(3, std::vector<const char*>{"train", "--model", "gpt:layers=0"}.data(),
                       models::zoo_catalog()),
      ValueError);
}

// A number out of its type's range is named so, not "expected a number"; a negative
// value of an unsigned flag likewise.
TEST(TrainOptions, NumbersOutOfRangeAreNamedSo) {
  for (const char* lr : {"1e39", "1e-50", "1e400"}) {
    EXPECT_NE(error({"--lr", lr}).find("out of range (magnitudes from about 1.4e-45 to 3.4e+38"),
              std::string::npos)
        << lr << ": " << error({"--lr", lr});
  }
  EXPECT_NE(error({"--bucket-cap-mb", "1e400"}).find("to 1.8e+308"), std::string::npos);
  EXPECT_NE(error({"--lr", "nan"}).find("must be a finite number"), std::string::npos);
  EXPECT_NE(error({"--lr", "1e3x"}).find("expected a number"), std::string::npos);
  EXPECT_NE(error({"--epochs", "99999999999999999999"})
                .find("out of range (a whole number from -9223372036854775808 to "),
            std::string::npos);
  EXPECT_NE(error({"--seed", "-1"}).find("out of range (a whole number from 0 to "),
            std::string::npos);
  EXPECT_NE(error({"--seed", "-x"}).find("expected a whole number"), std::string::npos);
}

// Bounds that keep the step arithmetic in range, and flags that would change nothing.
TEST(TrainOptions, UnusableValuesAndFlagsThatChangeNothingAreRefused) {
  EXPECT_NE(
      error({"--epochs", "4611686018427387904"}).find("--epochs 4611686018427387904: at most"),
      std::string::npos);
  EXPECT_NE(error({"--batch-size", "9223372036854775807"}).find("at most 2147483647"),
            std::string::npos);
  EXPECT_EQ(error({"--epochs", "1000000000", "--batch-size", "2147483647"}), "no error");
  for (const char* schedule : {"constant", "step"}) {
    EXPECT_NE(error({"--lr-schedule", schedule, "--warmup-steps", "3"}).find("has no warmup"),
              std::string::npos)
        << schedule;
    EXPECT_EQ(error({"--lr-schedule", schedule, "--warmup-steps", "0"}), "no error");
  }
  EXPECT_EQ(error({"--lr-schedule", "linear", "--warmup-steps", "3"}), "no error");
  EXPECT_NE(error({"--optimizer", "adamw", "--momentum", "0.5"})
                .find("--optimizer adamw has no momentum to set (AdamW's is its betas, here 0.9 "
                      "and 0.999)"),
            std::string::npos);
  EXPECT_NE(error({"--model", "gpt-tiny", "--momentum", "0.5"}).find("here 0.9 and 0.99"),
            std::string::npos);
  EXPECT_EQ(error({"--optimizer", "sgd", "--momentum", "0.5"}), "no error");
}

// onecycle's rise longer than the run is refused (PyTorch: pct_start <= 1); a cosine
// or linear warmup as long as the run gets a note.
TEST(LrScheduleSpan, AWarmupAsLongAsTheRunIsNamed) {
  TrainOptions o = parse({"--lr-schedule", "onecycle", "--warmup-steps", "5", "--epochs", "1"});
  EXPECT_EQ(make_schedule(o, 5).total_steps, 5);  // a rise over the whole run: allowed
  try {
    make_schedule(o, 4);
    ADD_FAILURE() << "a rise of 5 over 4 steps was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("--warmup-steps 5: onecycle's rise is longer than the "
                                         "run's 4 optimizer steps"),
              std::string::npos)
        << e.what();
  }
  o = parse({"--lr-schedule", "cosine", "--warmup-steps", "50", "--epochs", "1"});
  const std::string note = warmup_note(make_schedule(o, 4));
  EXPECT_NE(note.find("--warmup-steps 50 is not shorter than the run's 4 optimizer steps"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("nor reaches --lr"), std::string::npos) << note;
  EXPECT_NE(warmup_note(make_schedule(o, 50)).find("it reaches --lr at the last step"),
            std::string::npos);
  EXPECT_EQ(warmup_note(make_schedule(o, 51)), "");
  o = parse({"--model", "gpt-tiny", "--max-steps", "3"});  // the automatic warmup: no note
  EXPECT_EQ(warmup_note(make_schedule(o, 100)), "");
}

// A resume whose run spans the schedule over other steps says where the lr moves.
TEST(LrScheduleSpan, AResumeThatPlansAnotherSpanSaysSo) {
  const TrainOptions o = parse({"--epochs", "4"});
  const optim::LrSchedule s = make_schedule(o, 4);  // 16 steps of cosine from 0.02
  const std::string note = schedule_span_note(s, 8, 8, "cosine");
  EXPECT_NE(note.find("spanned 8 optimizer steps in the checkpoint's run and spans 16"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find(fmt::format("the lr at step 8 is {:g} where it was to be 0", s.lr_at(8))),
            std::string::npos)
      << note;
  EXPECT_EQ(schedule_span_note(s, 16, 8, "cosine"), "");
  EXPECT_EQ(schedule_span_note(s, 0, 8, "cosine"), "");  // an older checkpoint
  const optim::LrSchedule constant = make_schedule(parse({"--lr-schedule", "constant"}), 4);
  EXPECT_EQ(schedule_span_note(constant, 8, 8, "constant"), "");
}

TEST(LrScheduleSpan, CosineSpansMaxStepsNotTheWholeEpoch) {
  TrainOptions o = parse({"--model", "gpt-tiny", "--max-steps", "50", "--epochs", "2"});
  const optim::LrSchedule s = make_schedule(o, /*micro_batches=*/1000);
  EXPECT_EQ(s.total_steps, 100);  // 2 epochs x 50 steps, not 2 x 1000
  EXPECT_EQ(s.warmup_steps, 10);  // a tenth of the run
  EXPECT_FLOAT_EQ(s.min_lr, 1e-4f);
  EXPECT_NEAR(s.lr_at(99), 1e-4f, 1e-6f);  // the last step reaches lr / 10
  EXPECT_FLOAT_EQ(s.lr_at(9), 1e-3f);      // the end of the warmup: the peak
  // The warmup is at most 100 steps; an epoch shorter than --max-steps counts as is.
  o.max_steps = 0;
  EXPECT_EQ(make_schedule(o, 5000).warmup_steps, 100);
  o.max_steps = 400;
  o.grad_accum = 2;
  EXPECT_EQ(make_schedule(o, 300).total_steps, 2 * 150);
}

TEST(LrScheduleSpan, MlpWarmupAndFloorUnchanged) {
  const TrainOptions o = parse({"--max-steps", "7", "--epochs", "2"});
  const optim::LrSchedule s = make_schedule(o, 100);
  EXPECT_EQ(s.total_steps, 14);
  EXPECT_EQ(s.warmup_steps, 0);
  EXPECT_EQ(s.min_lr, 0.0f);
}

}  // namespace
}  // namespace ddp::train
