// The scale driver's pure parts: the plan, resuming, series, medians and
// efficiencies, the command lines and the flags. The processes: the
// e2e.scale_smoke test; the CSV and the SVG: scale_csv_test.cpp, scale_svg_test.cpp.
#include "bench/scale/cli.h"
#include "bench/scale/csv.h"
#include "bench/scale/runner.h"
#include "bench/scale/sweep.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace ddp::scaling {
namespace {

std::string error_of(const SweepOptions& o) {
  try {
    plan_sweep(o);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "<no error>";
}

Measurement measured(PointSpec spec, double samples_per_s) {
  Measurement m;
  m.spec = std::move(spec);
  m.samples_per_s = samples_per_s;
  return m;
}

PointSpec point(const std::string& impl, std::string scaling, int world_size, int batch_per_rank,
                int repeat = 0) {
  return {.impl = impl,
          .model = "mlp",
          .scaling = std::move(scaling),
          .backend = impl == "torch" ? "gloo" : "auto",
          .world_size = world_size,
          .batch_per_rank = batch_per_rank,
          .repeat = repeat};
}

TEST(ScalePlan, EveryCombinationOnceWithTheBatchOfItsScaling) {
  SweepOptions o;
  o.world_sizes = {1, 2, 4};
  o.models = {"mlp", "cnn"};
  o.impls = {"ours", "torch"};
  o.backends = {"auto", "gloo"};  // torch runs once per point whatever the list
  o.global_batch = 256;
  o.batch = 32;
  const auto plan = plan_sweep(o);
  // 2 models x 2 scalings x 3 world sizes x (2 ours backends + 1 torch)
  ASSERT_EQ(plan.size(), 2u * 2 * 3 * 3);
  for (const auto& p : plan) {
    EXPECT_EQ(p.batch_per_rank, p.scaling == "strong" ? 256 / p.world_size : 32) << p.describe();
    if (p.impl == "torch") {
      EXPECT_EQ(p.backend, "gloo");
    }
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    for (size_t j = i + 1; j < plan.size(); ++j) EXPECT_FALSE(same_point(plan[i], plan[j]));
  }
}

TEST(ScalePlan, ImplementationsOfOnePointRunBackToBack) {
  SweepOptions o;
  o.impls = {"ours", "torch"};
  o.world_sizes = {1, 2};
  o.scalings = {"strong"};
  const auto plan = plan_sweep(o);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].impl, "ours");
  EXPECT_EQ(plan[1].impl, "torch");
  EXPECT_EQ(plan[0].world_size, plan[1].world_size);
  EXPECT_EQ(plan[2].world_size, 2);
}

TEST(ScalePlan, RepeatsComeAfterAWholePass) {
  SweepOptions o;
  o.world_sizes = {1, 2};
  o.scalings = {"weak"};
  o.repeats = 3;
  const auto plan = plan_sweep(o);
  ASSERT_EQ(plan.size(), 6u);
  EXPECT_EQ(plan[1].repeat, 0);
  EXPECT_EQ(plan[2].repeat, 1);
  EXPECT_EQ(plan[5].repeat, 2);
}

TEST(ScalePlan, RejectsBadValuesWithTheValidOnes) {
  SweepOptions o;
  o.global_batch = 100;
  o.world_sizes = {1, 3};
  EXPECT_NE(error_of(o).find("world size 3 does not divide it"), std::string::npos) << error_of(o);
  o = {};
  o.models = {"resnet"};
  EXPECT_NE(error_of(o).find("--models 'resnet': valid values are mlp, cnn"), std::string::npos);
  o = {};
  o.backends = {"nccl"};
  EXPECT_NE(error_of(o).find("valid values are auto, shm, gloo"), std::string::npos);
  o = {};
  o.world_sizes = {0};
  EXPECT_NE(error_of(o).find("--world-sizes: 0"), std::string::npos);
  o = {};
  o.scalings = {"weak"};  // weak scaling never splits the global batch
  o.global_batch = 100;
  o.world_sizes = {1, 3};
  EXPECT_EQ(error_of(o), "<no error>");
  // An item listed twice would be measured twice as one repeat.
  o = {};
  o.world_sizes = {1, 2, 1};
  EXPECT_NE(error_of(o).find("--world-sizes: 1 is listed twice"), std::string::npos) << error_of(o);
  o = {};
  o.bucket_caps_mb = {1, 1};
  EXPECT_NE(error_of(o).find("--bucket-caps: 1 is listed twice"), std::string::npos);
  o = {};
  o.scalings = {"strong", "strong"};
  EXPECT_NE(error_of(o).find("--scaling: strong is listed twice"), std::string::npos);
}

// Note [sweep setup]: a point measured on another device, data or program
// arguments is another point, and its rows do not count for this sweep.
TEST(ScaleResume, AnotherSetupIsAnotherPoint) {
  SweepOptions o;
  o.world_sizes = {1, 2};
  o.scalings = {"strong"};
  o.setup = setup_id("device=cpu data=synthetic");
  const auto cpu = plan_sweep(o);
  std::vector<Measurement> done = {measured(cpu[0], 100), measured(cpu[1], 180)};
  EXPECT_TRUE(remaining_points(cpu, done).empty());
  o.setup = setup_id("device=cuda data=synthetic");
  EXPECT_EQ(remaining_points(plan_sweep(o), done).size(), 2u);
  EXPECT_EQ(o.setup.size(), 16u);
  EXPECT_NE(setup_id("device=cpu data=synthetic"), setup_id("device=cpu data=/data/fm"));
  const auto parsed = parse_csv(csv_text(done));
  EXPECT_EQ(parsed[0].spec.setup, cpu[0].setup);
}

TEST(ScaleResume, SkipsExactlyThePointsAlreadyMeasured) {
  SweepOptions o;
  o.world_sizes = {1, 2, 4};
  o.scalings = {"strong"};
  const auto plan = plan_sweep(o);
  std::vector<Measurement> done = {measured(plan[0], 100), measured(plan[2], 300)};
  const auto left = remaining_points(plan, done);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_TRUE(same_point(left[0], plan[1]));
  // The same world size with other steps is another point.
  PointSpec other = plan[1];
  other.steps += 1;
  EXPECT_FALSE(same_point(other, plan[1]));
  EXPECT_EQ(remaining_points(plan, {measured(other, 1)}).size(), 3u);
}

TEST(ScaleSeries, EfficiencyIsPerRankThroughputOverTheSmallestWorldSizes) {
  // Strong scaling, global batch 256: 100, 180, 320 samples/s -> 1, 0.9, 0.8.
  std::vector<Measurement> ms = {measured(point("ours", "strong", 1, 256), 100),
                                 measured(point("ours", "strong", 2, 128), 180),
                                 measured(point("ours", "strong", 4, 64), 320)};
  const auto series = series_of(ms);
  ASSERT_EQ(series.size(), 1u);
  EXPECT_EQ(series[0].label, "ours mlp strong");
  EXPECT_EQ(series[0].group, "ours mlp");
  ASSERT_EQ(series[0].points.size(), 3u);
  EXPECT_DOUBLE_EQ(series[0].points[0].efficiency, 1.0);
  EXPECT_DOUBLE_EQ(series[0].points[1].efficiency, 0.9);
  EXPECT_DOUBLE_EQ(series[0].points[2].efficiency, 0.8);
  fill_efficiency(ms);
  EXPECT_DOUBLE_EQ(ms[1].efficiency, 0.9);
  EXPECT_DOUBLE_EQ(ms[2].efficiency, 0.8);
}

TEST(ScaleSeries, MedianOfRepeatsAndABaselineOtherThanOne) {
  std::vector<Measurement> ms = {measured(point("torch", "weak", 2, 64, 0), 90),
                                 measured(point("torch", "weak", 2, 64, 1), 200),
                                 measured(point("torch", "weak", 2, 64, 2), 100),
                                 measured(point("torch", "weak", 4, 64, 0), 150)};
  const auto series = series_of(ms);
  ASSERT_EQ(series.size(), 1u);
  ASSERT_EQ(series[0].points.size(), 2u);
  EXPECT_EQ(series[0].points[0].world_size, 2);
  EXPECT_DOUBLE_EQ(series[0].points[0].samples_per_s, 100.0);  // median of 90, 200, 100
  EXPECT_EQ(series[0].points[0].repeats, 3);
  EXPECT_DOUBLE_EQ(series[0].points[0].min_samples_per_s, 90.0);
  EXPECT_DOUBLE_EQ(series[0].points[0].max_samples_per_s, 200.0);
  EXPECT_DOUBLE_EQ(series[0].points[1].efficiency, (150.0 / 4) / (100.0 / 2));
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
}

TEST(ScaleSeries, OneSeriesPerImplementationModelScalingAndVaryingBackend) {
  PointSpec gloo = point("ours", "strong", 2, 128);
  gloo.backend = "gloo";
  std::vector<Measurement> ms = {
      measured(point("ours", "strong", 1, 256), 100),
      measured(point("torch", "strong", 1, 256), 80), measured(point("ours", "weak", 1, 64), 90),
      measured(point("ours", "strong", 2, 128), 150), measured(gloo, 120)};
  const auto series = series_of(ms);
  std::vector<std::string> labels;
  for (const auto& s : series) labels.push_back(s.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"ours mlp strong auto", "torch mlp strong gloo",
                                              "ours mlp weak auto", "ours mlp strong gloo"}));
  // The gloo series has only world size 2, so it is its own baseline.
  EXPECT_DOUBLE_EQ(series[3].points[0].efficiency, 1.0);
  EXPECT_EQ(series[0].group, "ours mlp auto");
  EXPECT_EQ(series[2].group, "ours mlp auto");  // strong and weak share a colour
}

TEST(ScaleSeries, MarkdownTableHasOneRowPerPoint) {
  Measurement a = measured(point("ours", "strong", 1, 256), 1000);
  Measurement b = measured(point("ours", "strong", 2, 128), 1500);
  b.comm_exposed_ms = 0.25;
  const std::string table =
      markdown_table(series_of({a, b, measured(point("torch", "weak", 1, 64), 700)}));
  EXPECT_EQ(table,
            "| model | scaling | impl | W | batch/rank | samples/s | min..max | efficiency | "
            "exposed comm ms | runs |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n"
            "| mlp | strong | ours | 1 | 256 | 1000 | 1000..1000 | 1.00 | 0.00 | 1 |\n"
            "| mlp | strong | ours | 2 | 128 | 1500 | 1500..1500 | 0.75 | 0.25 | 1 |\n"
            "| mlp | weak | torch | 1 | 64 | 700 | 700..700 | 1.00 | - | 1 |\n");
}

TEST(ScaleJson, ReadsNumberFieldsOfMetricsLines) {
  const std::string line =
      R"({"epoch": 2, "samples_per_s_min": 5.0, "samples_per_s": 28074.7, "step_ms": 2.2796})";
  EXPECT_DOUBLE_EQ(json_number(line, "samples_per_s").value(), 28074.7);
  EXPECT_DOUBLE_EQ(json_number(line, "step_ms").value(), 2.2796);
  EXPECT_DOUBLE_EQ(json_number(line, "epoch").value(), 2.0);
  EXPECT_FALSE(json_number(line, "comm_exposed_ms").has_value());
  EXPECT_FALSE(json_number(R"({"samples_per_s": null})", "samples_per_s").has_value());
}

TEST(ScaleCommands, OursUnderDdprunTorchWithItsOwnFlags) {
  Programs programs{
      .ddprun = "/b/ddprun", .train = "/b/train", .torch_script = "/s/torch_train.py"};
  PointSpec p = point("ours", "strong", 4, 64);
  p.steps = 50;
  p.bucket_cap_mb = 0.5;
  const auto ours = ours_command(p, programs, "/tmp/m.jsonl");
  const std::string text = fmt::format("{}", fmt::join(ours, " "));
  EXPECT_EQ(ours[0], "/b/ddprun");
  EXPECT_NE(text.find("--standalone -n 4 --grace-period 5 /b/train --model mlp"),
            std::string::npos);
  EXPECT_EQ(text.find("--backend"), std::string::npos);  // auto: ddprun's default
  EXPECT_NE(text.find("--batch-size 64 --epochs 2 --max-steps 50"), std::string::npos) << text;
  EXPECT_NE(text.find("--bucket-cap-mb 0.5"), std::string::npos);
  EXPECT_NE(text.find("--synthetic-size 12800"), std::string::npos);  // 50 steps x 256
  p.backend = "gloo";
  EXPECT_NE(
      fmt::format("{}", fmt::join(ours_command(p, programs, "m"), " ")).find("--backend gloo"),
      std::string::npos);
  p.impl = "torch";
  const std::string torch = fmt::format("{}", fmt::join(torch_command(p, programs), " "));
  EXPECT_EQ(torch.rfind("/usr/bin/python3 /s/torch_train.py --model mlp", 0), 0u) << torch;
  EXPECT_NE(torch.find("--batch 64 --steps 50 --warmup 50 --threads 1"), std::string::npos);
  EXPECT_EQ(synthetic_size(point("ours", "weak", 1, 8)), 10000);
}

TEST(ScaleCli, ListsFlagsAndDefaults) {
  const auto c = parse_cli({"--world-sizes", "1,2,8", "--impls=ours,torch", "--bucket-caps",
                            "1,25.5", "--csv", "out/run.csv", "--dry-run"});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->sweep.world_sizes, (std::vector<int>{1, 2, 8}));
  EXPECT_EQ(c->sweep.impls, (std::vector<std::string>{"ours", "torch"}));
  EXPECT_EQ(c->sweep.bucket_caps_mb, (std::vector<double>{1.0, 25.5}));
  EXPECT_EQ(c->svg, "out/run.svg");
  EXPECT_TRUE(c->dry_run);
  EXPECT_TRUE(c->run.programs.ddprun.ends_with("/ddprun"));
  EXPECT_FALSE(parse_cli({"--help"}).has_value());
  auto error = [](std::vector<std::string> args) {
    try {
      parse_cli(args);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(error({"--bogus"}).find("unknown option '--bogus'"), std::string::npos);
  EXPECT_NE(error({"--steps", "ten"}).find("--steps 'ten': expected a whole number"),
            std::string::npos);
  EXPECT_NE(error({"--world-sizes", "1,,2"}).find("empty item"), std::string::npos);
  EXPECT_NE(error({"--csv"}).find("--csv needs a value"), std::string::npos);
  EXPECT_NE(usage().find("--plot-only"), std::string::npos);
}

// Note [program contract]: --program runs in train's place with its own arguments and
// the four contract flags; train's flags are refused with it.
TEST(ScaleCli, ProgramRunsInTrainsPlaceWithItsArguments) {
  const auto c = parse_cli({"--program", "/home/u/own_model", "--world-sizes", "1,2", "--",
                            "--data", "t.csv", "--lr", "0.1"});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->sweep.models, (std::vector<std::string>{"own_model"}));
  EXPECT_EQ(c->run.programs.program_args,
            (std::vector<std::string>{"--data", "t.csv", "--lr", "0.1"}));
  const auto plan = plan_sweep(c->sweep);
  ASSERT_FALSE(plan.empty());
  EXPECT_EQ(plan[0].model, "own_model");
  const std::string text =
      fmt::format("{}", fmt::join(ours_command(plan[0], c->run.programs, "/tmp/m.jsonl"), " "));
  EXPECT_NE(text.find("-n 1 --grace-period 5 /home/u/own_model --data t.csv --lr 0.1 "
                      "--batch-size 256 --epochs 2 --max-steps 100 --metrics /tmp/m.jsonl"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("/train"), std::string::npos) << text;
  const auto error = [](const std::vector<std::string>& args) {
    try {
      parse_cli(args);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error({"--program", "p", "--models", "cnn"}).find("--models is train's"),
            std::string::npos);
  EXPECT_NE(error({"--", "--data", "x"}).find("arguments after -- are for --program"),
            std::string::npos);
  auto torch = *parse_cli({"--program", "p", "--impls", "ours,torch"});
  EXPECT_THROW(plan_sweep(torch.sweep), ValueError);
}

TEST(ScaleCli, GptSpecsKeepTheirCommas) {
  const auto c =
      parse_cli({"--models", "mlp,gpt:layers=1,d=32,heads=2,ctx=16,gpt-tiny", "--dry-run"});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->sweep.models,
            (std::vector<std::string>{"mlp", "gpt:layers=1,d=32,heads=2,ctx=16", "gpt-tiny"}));
}

TEST(ScalePlan, GptModelsRunOursOnly) {
  SweepOptions o;
  o.models = {"gpt-tiny"};
  o.impls = {"ours"};
  EXPECT_EQ(error_of(o), "<no error>");
  o.impls = {"ours", "torch"};
  EXPECT_NE(error_of(o).find("runs mlp and cnn only"), std::string::npos) << error_of(o);
  o.impls = {"ours"};
  o.models = {"gpt:layers=2,d=60,heads=7,ctx=8"};
  EXPECT_NE(error_of(o).find("not divisible by heads=7"), std::string::npos) << error_of(o);
  o.models = {"resnet"};
  EXPECT_NE(error_of(o).find("valid values are mlp, cnn, gpt-tiny"), std::string::npos);
}

TEST(ScaleCommands, GptPointsReadTextWithOneEvaluationBatch) {
  PointSpec p{.impl = "ours",
              .model = "gpt-tiny",
              .scaling = "weak",
              .backend = "auto",
              .bucket_cap_mb = 25,
              .world_size = 2,
              .batch_per_rank = 8,
              .steps = 5};
  Programs programs;
  programs.ddprun = "/b/ddprun";
  programs.train = "/b/train";
  programs.data = "synthetic";
  const std::string text = fmt::format("{}", fmt::join(ours_command(p, programs, "m"), " "));
  EXPECT_NE(text.find("--model gpt-tiny --data synthetic --batch-size 8"), std::string::npos)
      << text;
  EXPECT_NE(text.find("--eval-batches 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("--synthetic-size"), std::string::npos) << text;  // the mlp's set only
}

}  // namespace
}  // namespace ddp::scaling
