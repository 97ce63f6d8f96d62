// models/sampling.h: the next-token choice of `sample`, checked against softmax
// computed directly, argmax, and counts.
#include "models/sampling.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace ddp::models {
namespace {

std::vector<float> random_logits(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

TEST(Sampling, ProbabilitiesAreTheTemperedSoftmax) {
  const auto logits = random_logits(256, 1);
  const double t = 0.7;
  const auto p = token_probabilities(logits, {.temperature = t});
  double z = 0;
  for (float l : logits) z += std::exp(l / t);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(p[i], std::exp(logits[i] / t) / z, 1e-12);
}

TEST(Sampling, TopKKeepsTheKLargestRenormalized) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  const auto p = token_probabilities(logits, {.temperature = 1.0, .top_k = 3});
  // 3, 3 and 2 stay (tokens 1, 3, 2); ties keep both 3s.
  const double z = 2 * std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(p[1], std::exp(3.0) / z, 1e-12);
  EXPECT_NEAR(p[3], std::exp(3.0) / z, 1e-12);
  EXPECT_NEAR(p[2], std::exp(2.0) / z, 1e-12);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[4], 0.0);
}

TEST(Sampling, TopKOneIsTheArgmaxWhateverTheDraw) {
  for (unsigned seed = 0; seed < 20; ++seed) {
    const auto logits = random_logits(256, seed);
    const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    for (double u : {0.0, 0.3, 0.999999}) {
      for (double t : {0.1, 1.0, 5.0}) {
        EXPECT_EQ(pick_token(logits, {.temperature = t, .top_k = 1}, u), argmax);
      }
    }
  }
}

TEST(Sampling, InverseCdfFollowsTheDistribution) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(7.0f)};  // 0.1, 0.2, 0.7
  EXPECT_EQ(pick_token(logits, {}, 0.05), 0);
  EXPECT_EQ(pick_token(logits, {}, 0.15), 1);
  EXPECT_EQ(pick_token(logits, {}, 0.31), 2);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int> counts(3);
  const int n = 100000;
  for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(pick_token(logits, {}, uniform(rng)))];
  // 5 standard deviations of a binomial count.
  EXPECT_NEAR(counts[0], 0.1 * n, 5 * std::sqrt(n * 0.1 * 0.9));
  EXPECT_NEAR(counts[2], 0.7 * n, 5 * std::sqrt(n * 0.7 * 0.3));
}

TEST(Sampling, BadOptionsNameTheValue) {
  const std::vector<float> logits = {0.0f, 1.0f};
  try {
    pick_token(logits, {.temperature = 0.0}, 0.5);
    FAIL() << "temperature 0 accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("--temperature 0: must be a finite number > 0"),
              std::string::npos);
  }
  EXPECT_THROW(pick_token(logits, {.temperature = 1.0, .top_k = -1}, 0.5), ValueError);
  // NaN logits would break the sort and quietly give the last token.
  const std::vector<float> bad = {0.0f, std::nanf(""), 1.0f};
  try {
    pick_token(bad, {.temperature = 1.0}, 0.5);
    FAIL() << "a NaN logit accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("logit nan of token 1 is not finite"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp::models
