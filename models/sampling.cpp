#include "models/sampling.h"

#include "runtime/error.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ddp::models {

void validate(const SamplingOptions& options) {
  DDP_CHECK(std::isfinite(options.temperature) && options.temperature > 0,
            "--temperature {}: must be a finite number > 0 (1 samples the model's distribution; "
            "for the most "
            "likely token each time pass --top-k 1)",
            options.temperature);
  DDP_CHECK(options.top_k >= 0, "--top-k {}: must be >= 0 (0: every token)", options.top_k);
}

std::vector<double> token_probabilities(std::span<const float> logits,
                                        const SamplingOptions& options) {
  validate(options);
  const auto n = static_cast<int64_t>(logits.size());
  DDP_CHECK(n > 0, "token_probabilities: no logits");
  for (int64_t i = 0; i < n; ++i) {
    DDP_CHECK(std::isfinite(logits[static_cast<size_t>(i)]),
              "token_probabilities: logit {} of token {} is not finite; the checkpoint's "
              "weights (or the prompt's forward) produced NaN or infinity",
              logits[static_cast<size_t>(i)], i);
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  const int64_t k = options.top_k > 0 ? std::min(options.top_k, n) : n;
  // Largest first; equal logits keep the lower token first (stable).
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  const double top = logits[static_cast<size_t>(order[0])];
  std::vector<double> p(static_cast<size_t>(n), 0.0);
  double total = 0;
  for (int64_t i = 0; i < k; ++i) {
    const auto t = static_cast<size_t>(order[static_cast<size_t>(i)]);
    p[t] = std::exp((static_cast<double>(logits[t]) - top) / options.temperature);
    total += p[t];
  }
  for (double& v : p) v /= total;
  return p;
}

int64_t pick_token(std::span<const float> logits, const SamplingOptions& options, double u) {
  const std::vector<double> p = token_probabilities(logits, options);
  double cumulative = 0;
  int64_t last = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] == 0) continue;
    cumulative += p[t];
    last = static_cast<int64_t>(t);
    if (u < cumulative) return last;
  }
  return last;  // u within rounding of 1: the last token with a probability
}

}  // namespace ddp::models
