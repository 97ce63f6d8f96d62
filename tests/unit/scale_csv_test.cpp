// The scale driver's CSV: round trip, reading by column name, errors that name
// the line and column, and resuming a sweep from a file.
#include "bench/scale/csv.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

namespace ddp::scaling {
namespace {

Measurement sample(int world_size, double samples_per_s, std::string impl = "ours") {
  Measurement m;
  m.spec = {.impl = std::move(impl),
            .model = "cnn",
            .scaling = "weak",
            .backend = "gloo",
            .bucket_cap_mb = 0.25,
            .world_size = world_size,
            .batch_per_rank = 32,
            .steps = 40,
            .threads = 2,
            .repeat = 1};
  m.samples_per_s = samples_per_s;
  m.step_ms = 12.5;
  m.comm_exposed_ms = 0.75;
  m.load1 = 1.5;
  m.timestamp = "2026-11-22T10:00:00Z";
  return m;
}

std::string parse_error(const std::string& text) {
  try {
    parse_csv(text);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ScaleCsv, RoundTripKeepsEveryField) {
  // samples/s are written with one decimal, so these survive exactly.
  std::vector<Measurement> ms = {sample(1, 1000.5), sample(4, 3000.5, "torch")};
  ms[1].efficiency = 0.75;
  const std::string text = csv_text(ms);
  EXPECT_EQ(text.substr(0, text.find('\n')), csv_header());
  const auto back = parse_csv(text);
  ASSERT_EQ(back.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(same_point(back[i].spec, ms[i].spec)) << back[i].spec.describe();
    EXPECT_DOUBLE_EQ(back[i].samples_per_s, ms[i].samples_per_s);
    EXPECT_DOUBLE_EQ(back[i].step_ms, 12.5);
    EXPECT_DOUBLE_EQ(back[i].comm_exposed_ms, 0.75);
    EXPECT_DOUBLE_EQ(back[i].load1, 1.5);
    EXPECT_EQ(back[i].timestamp, "2026-11-22T10:00:00Z");
  }
  EXPECT_DOUBLE_EQ(back[1].efficiency, 0.75);
  EXPECT_NE(csv_row(ms[1]).find(",4,32,128,"), std::string::npos);  // global batch = 4 x 32
}

TEST(ScaleCsv, ReadsByColumnNameAndToleratesBlankLinesAndCrlf) {
  const std::string header = csv_header();
  const std::string row = csv_row(sample(2, 500));
  // An extra column at the front shifts every field: reading by name must not care.
  const std::string text = "note," + header + "\r\n\r\n" + "hello," + row + "\r\n\n";
  const auto back = parse_csv(text);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].spec.world_size, 2);
  EXPECT_EQ(back[0].spec.impl, "ours");
  EXPECT_TRUE(parse_csv("").empty());
  EXPECT_TRUE(parse_csv(header + "\n").empty());
}

TEST(ScaleCsv, ErrorsNameTheLineAndColumn) {
  EXPECT_NE(parse_error("impl,model\nours,mlp\n").find("has no column 'scaling'"),
            std::string::npos);
  std::string row = csv_row(sample(2, 500));
  row.replace(row.find(",2,32,"), 6, ",two,32,");
  const std::string e = parse_error(csv_header() + "\n" + row + "\n");
  EXPECT_NE(e.find("line 2: column 'world_size' = 'two' is not an integer"), std::string::npos)
      << e;
  EXPECT_NE(parse_error(csv_header() + "\nours,mlp\n").find("line 2: no value for column"),
            std::string::npos);
}

TEST(ScaleCsv, ResumingFromTheFileRunsOnlyTheNewPoints) {
  SweepOptions o;
  o.world_sizes = {1, 2};
  o.scalings = {"strong"};
  o.global_batch = 64;
  std::vector<Measurement> first;
  for (const auto& p : plan_sweep(o)) {
    Measurement m;
    m.spec = p;
    m.samples_per_s = 100;
    first.push_back(m);
  }
  const auto done = parse_csv(csv_text(first));
  o.world_sizes = {1, 2, 4};  // the sweep is extended
  const auto left = remaining_points(plan_sweep(o), done);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].world_size, 4);
  EXPECT_EQ(left[0].batch_per_rank, 16);
}

}  // namespace
}  // namespace ddp::scaling
