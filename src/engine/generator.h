// Single-sequence generation on a ModelRunner, with or without speculation (SpecInfer §3-4).
//
// The prompt but its last token is prefilled; from then on every step is one LLM pass over a
// token tree whose root is the last chosen token: the speculators propose trees (merged into
// one), the tree is laid out depth-first after the sequence's committed KV entries, the LLM runs
// it with the topology-aware mask, the verifier (spec/verifier.h) picks the accepted path and the
// LLM's next token, and the accepted path's KV entries are compacted into place while the rest
// are dropped. With no speculators the tree is the root alone: that is incremental decoding,
// the baseline, on the very same path.
//
// Thread safety: a Generator is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
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
                               // decode pass reads)
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

// Called with each new token as soon as it is chosen; returning false cancels generation.
using TokenCallback = std::function<bool(int32_t token)>;

class Generator {
 public:
  Generator(ModelRunner& runner, KvCacheManager& kv) : runner_(runner), kv_(kv) {}

  // InvalidArgument for an empty prompt, out-of-vocabulary ids, bad sampling params or tree
  // shape;
  // OutOfRange if the prompt does not fit the model's context (the number of new tokens is
  // clamped to the context that remains). The sequence's KV blocks are freed on return.
  StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                    const TokenCallback& on_token = nullptr);

 private:
  ModelRunner& runner_;
  KvCacheManager& kv_;
};

}  // namespace specinfer
