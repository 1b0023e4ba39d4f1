// What a generation is asked for and what it reports: the request, its statistics and result,
// and the per-token callback. Shared by Generator (one sequence), Sequence and EngineCore.
//
// Thread safety: plain values.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "sampling/sampler.h"
#include "spec/speculator.h"
#include "spec/token_tree.h"

namespace specinfer {

enum class FinishReason { kLength, kStop, kCancelled };
const char* FinishReasonName(FinishReason r);  // "length", "stop", "cancelled"

struct GenerateRequest {
  std::vector<int32_t> prompt_tokens;  // must be non-empty (BOS counts)
  int32_t max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;    // generation ends after emitting one of these
  int32_t prefill_chunk = 512;         // prompt tokens per forward pass
  // Speculators whose trees are merged each step (owned by the caller, e.g. the Engine); empty
  // means incremental decoding. At most TokenTree::kMaxSpeculators.
  std::vector<Speculator*> speculators;
  TreeShape tree_shape = TreeShape::Chain(4);  // expansion configuration <k1, ..., km>
  // Whether the token callback reads the logits rows. False lets a greedy request's passes bring
  // back only each row's argmax (ModelRunner::ForwardArgmax: found on the GPU, or on the LLM
  // workers, instead of [rows, vocab] floats crossing to the host), and a sampled request's the
  // token drawn (a step without a tree) or its tree's distributions (what top-k/top-p keep),
  // where the runner offers those (ModelRunner::draws_tokens, ::returns_distributions); its
  // callback then gets an empty logits span.
  bool callback_logits = true;
};

// What speculation did for one request.
struct SpeculationStats {
  int64_t tree_nodes = 0;        // proposed nodes verified (roots excluded), summed over passes
  int64_t accepted_tokens = 0;   // proposed tokens the LLM accepted
  // Index d - 1: passes whose tree reached depth d, and passes that accepted a token at depth d.
  std::vector<int64_t> proposed_at_depth, accepted_at_depth;
  // Per speculator (the request's order): nodes it proposed, and accepted nodes it proposed.
  std::vector<std::string> speculator_names;
  std::vector<int64_t> proposed_by, accepted_by;
  double draft_seconds = 0;   // speculators proposing (and merging)
  double verify_seconds = 0;  // LLM tree passes and verification
};

struct GenerateStats {
  int32_t prompt_tokens = 0;
  int32_t prefill_tokens = 0;  // prompt tokens prefilled (all but the last, which the first
                               // decode pass reads, and those found in the prefix cache)
  int32_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  int32_t generated_tokens = 0;
  int32_t forward_passes = 0;
  int32_t decode_passes = 0;  // LLM passes after the prefill (one per generated token without
                              // speculation, fewer with it)
  double prefill_seconds = 0;
  double decode_seconds = 0;
  SpeculationStats spec;
  double prefill_tokens_per_second() const {
    return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0;
  }
  double decode_tokens_per_second() const {
    return decode_seconds > 0 ? generated_tokens / decode_seconds : 0;
  }
  // Generated tokens per LLM pass (1 without speculation).
  double tokens_per_pass() const {
    return decode_passes > 0 ? static_cast<double>(generated_tokens) / decode_passes : 0;
  }
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (a stop token, if hit, is included)
  FinishReason finish_reason = FinishReason::kLength;
  GenerateStats stats;
};

// Seconds elapsed since `start` on the steady clock (the timings of GenerateStats).
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Called with each new token as soon as it is chosen, with the LLM's raw logits row it was chosen
// from ([vocab]: before temperature, top-k and top-p; valid during the call only; empty for a
// greedy request with callback_logits false). Returning false cancels generation.
using TokenCallback = std::function<bool(int32_t token, std::span<const float> logits)>;

}  // namespace specinfer
