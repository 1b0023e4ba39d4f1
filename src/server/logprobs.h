// Log-probabilities of generated tokens, for the `logprobs` / `top_logprobs` request fields.
//
// What is reported: log_softmax of the model's raw logits at each step -- the model's own
// distribution, before temperature, top-k and top-p (vLLM's default, "raw_logprobs"). So the
// numbers do not depend on the sampling parameters, and a token that top-k/top-p excluded still
// has a finite log-probability. The alternatives are the `top_n` most likely tokens of that
// distribution (ties: lower id first).
//
// Where the logits come from: the generator's token callback passes, with each token, the logits
// row it was chosen from (for a token accepted from a token tree, its parent node's row in the
// verification pass), so logprobs stream with their tokens at no extra cost.
//
// Thread safety: pure.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace specinfer {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
};

// The log-probability of `token` under log_softmax(logits), plus the `top_n` most likely tokens.
// `logits`: [vocab].
TokenLogprob LogprobsFromLogits(std::span<const float> logits, int32_t token, int32_t top_n);

}  // namespace specinfer
