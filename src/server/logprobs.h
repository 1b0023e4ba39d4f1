// Log-probabilities of generated tokens, for the `logprobs` / `top_logprobs` request fields.
//
// What is reported: log_softmax of the model's raw logits at each step -- the model's own
// distribution, before temperature, top-k and top-p (vLLM's default, "raw_logprobs"). So the
// numbers do not depend on the sampling parameters, and a token that top-k/top-p excluded still
// has a finite log-probability. The alternatives are the `top_n` most likely tokens of that
// distribution (ties: lower id first).
//
// Where the logits come from. Generator's token callback reports ids only, so for now the logits
// are recomputed after generation by TeacherForcedLogprobs: one more forward pass over the prompt
// and the generated tokens on the same runner (a fresh KV sequence). It splits the work as the
// generator does -- the prompt but its last token prefilled in the same chunks, everything after
// through the batch-invariant kernels, whose per-token results are bit-identical to one-token
// decode steps and to token-tree verification -- so the logits equal those the tokens were chosen
// from. The cost is about one prefill of prompt + completion. Once the generator passes each
// step's logits to its callback, the scheduler calls LogprobsFromLogits per token instead and
// this pass goes away.
//
// Thread safety: LogprobsFromLogits is pure; TeacherForcedLogprobs uses the runner and KV cache
// and must run on the thread that owns them (the scheduler's worker).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "specinfer/status.h"

namespace specinfer {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
};

// The log-probability of `token` under log_softmax(logits), plus the `top_n` most likely tokens.
// `logits`: [vocab].
TokenLogprob LogprobsFromLogits(std::span<const float> logits, int32_t token, int32_t top_n);

// Recomputes the logits that generated `generated` after `prompt` and returns one TokenLogprob
// per generated token. `prefill_chunk` must equal the GenerateRequest's. Needs KV room for
// prompt + generated - 1 positions; the sequence is removed before returning.
StatusOr<std::vector<TokenLogprob>> TeacherForcedLogprobs(ModelRunner& runner, KvCacheManager& kv,
                                                          std::span<const int32_t> prompt,
                                                          std::span<const int32_t> generated,
                                                          int32_t top_n, int32_t prefill_chunk);

}  // namespace specinfer
