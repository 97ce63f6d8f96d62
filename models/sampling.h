// Picking the next token from a language model's logits, for `sample`: softmax
// with a temperature, optionally restricted to the k most likely tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ddp::models {

struct SamplingOptions {
  double temperature = 1.0;  // > 0; below 1 sharpens, above 1 flattens
  int64_t top_k = 0;         // 0: every token; k: the k largest logits only
};

// Throws ValueError naming the value for temperature <= 0 (or not finite) and top_k < 0.
void validate(const SamplingOptions& options);

// The probabilities softmax(logits / temperature) restricted to the top_k largest
// logits (ties broken toward the lower token, so exactly k stay) and renormalized;
// computed in double with the maximum subtracted.
std::vector<double> token_probabilities(std::span<const float> logits,
                                        const SamplingOptions& options);

// The token whose cumulative probability first exceeds u (u uniform in [0, 1)):
// inverse-CDF sampling from token_probabilities. With top_k 1 it is the argmax
// whatever u and the temperature are.
int64_t pick_token(std::span<const float> logits, const SamplingOptions& options, double u);

}  // namespace ddp::models
