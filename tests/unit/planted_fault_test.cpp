// Note [planted faults] (runtime/planted_fault.h): the fault corrupts what it names
// and nothing else, counts its calls, and a malformed spec names the form.
#include "runtime/planted_fault.h"

#include "runtime/ops/multi_tensor.h"
#include "runtime/ops/ops.h"
#include "runtime/ops/transformer_ops.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ddp {
namespace {

struct Disarm {
  ~Disarm() { planted_fault::set(""); }
};

std::vector<float> norm_of(const Tensor& x) {
  const Tensor w = ones({8}), b = zeros({8});
  return layer_norm(x, w, b, 1e-5f).out.to_vector<float>();
}

TEST(PlantedFault, FirstAndLastChangeOneEndOfTheNamedOutput) {
  const Disarm disarm;
  const Tensor x = randn({3, 8}, 7);
  const std::vector<float> clean = norm_of(x);
  for (const std::string mode : {"first", "last"}) {
    SCOPED_TRACE(mode);
    // layer_norm's tensors: x, weight, bias, out (3), mean, rstd.
    planted_fault::set("cpu:layer_norm:3:" + mode);
    const std::vector<float> got = norm_of(x);
    EXPECT_EQ(planted_fault::applied(), 1);
    const size_t at = mode == "first" ? 0 : clean.size() - 1;
    for (size_t i = 0; i < clean.size(); ++i) {
      if (i == at) {
        EXPECT_EQ(got[i], clean[i] + (1.0f + std::fabs(clean[i])));
      } else {
        EXPECT_EQ(got[i], clean[i]) << "element " << i;
      }
    }
  }
}

TEST(PlantedFault, ScaleMultipliesEveryElementOfEveryTensorInAList) {
  const Disarm disarm;
  const Tensor a = randn({5}, 1), b = randn({3}, 2);
  planted_fault::set("cpu:scale_by_multi:0:scale=2");
  const std::vector<Tensor> xs = {a, b};
  const std::vector<float> a0 = xs[0].to_vector<float>(), b0 = xs[1].to_vector<float>();
  scale_by_(xs, full({}, 3.0));
  EXPECT_EQ(planted_fault::applied(), 1);
  const std::vector<float> a1 = xs[0].to_vector<float>(), b1 = xs[1].to_vector<float>();
  for (size_t i = 0; i < a0.size(); ++i) EXPECT_EQ(a1[i], a0[i] * 3.0f * 2.0f);
  for (size_t i = 0; i < b0.size(); ++i) EXPECT_EQ(b1[i], b0[i] * 3.0f * 2.0f);
}

// A list's first (last) non-empty tensor takes `first` (`last`); a call that changes
// nothing (an empty tensor, infinities) is not counted as applied.
TEST(PlantedFault, EmptyTensorsAndInfinitiesAreSkippedAndNotCounted) {
  const Disarm disarm;
  const Tensor empty_one = zeros({0}), a = randn({4}, 3);
  const std::vector<float> a0 = a.to_vector<float>();
  planted_fault::set("cpu:scale_by_multi:0:first");
  scale_by_(std::vector<Tensor>{empty_one, a}, full({}, 1.0));
  EXPECT_EQ(planted_fault::applied(), 1);
  const std::vector<float> a1 = a.to_vector<float>();
  EXPECT_EQ(a1[0], a0[0] + (1.0f + std::fabs(a0[0])));
  for (size_t i = 1; i < a0.size(); ++i) EXPECT_EQ(a1[i], a0[i]) << "element " << i;
  const Tensor inf = full({3}, std::numeric_limits<double>::infinity());
  planted_fault::set("cpu:scale_by_multi:0:last");
  scale_by_(std::vector<Tensor>{inf, empty_one}, full({}, 1.0));
  EXPECT_EQ(planted_fault::applied(), 0) << "an infinity at the end does not change";
}

TEST(PlantedFault, OtherOpsArgumentsAndDevicesAreLeftAlone) {
  const Disarm disarm;
  const Tensor x = randn({3, 8}, 7);
  const std::vector<float> clean = norm_of(x);
  for (const std::string spec :
       {"cuda:layer_norm:3:last", "cpu:layer_norm_backward:3:last", "cpu:layer_norm:9:last"}) {
    planted_fault::set(spec);
    EXPECT_EQ(norm_of(x), clean) << spec;
    EXPECT_EQ(planted_fault::applied(), 0) << spec;
  }
  // An input named: corrupted after the op ran, so the output is the clean one.
  planted_fault::set("cpu:layer_norm:0:last");
  const Tensor y = randn({3, 8}, 7);
  const std::vector<float> before = y.to_vector<float>();
  EXPECT_EQ(norm_of(y), clean);
  EXPECT_NE(y.to_vector<float>().back(), before.back());
}

TEST(PlantedFault, AMalformedSpecNamesTheForm) {
  const Disarm disarm;
  for (const std::string spec :
       {"layer_norm:3:last", "gpu:layer_norm:3:last", "cpu::3:last", "cpu:layer_norm:x:last",
        "cpu:layer_norm:-1:last", "cpu:layer_norm:3:middle",
        "cpu:layer_norm:3:scale=", "cpu:layer_norm:3:scale=inf"}) {
    const std::string e = test_util::error_text([&] { planted_fault::set(spec); });
    EXPECT_NE(e.find("DDP_TEST_PLANT_FAULT='" + spec + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("expected DEVICE:OP:ARG:MODE, like cuda:layer_norm:3:last"), std::string::npos)
        << e;
  }
  EXPECT_FALSE(planted_fault::armed());
}

}  // namespace
}  // namespace ddp
