// Single-sequence generation on a ModelRunner: prefill the prompt, then decode token by token
// (the incremental baseline that speculative decoding is measured and checked against).
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

namespace specinfer {

enum class FinishReason { kLength, kStop, kCancelled };
const char* FinishReasonName(FinishReason r);  // "length", "stop", "cancelled"

struct GenerateRequest {
  std::vector<int32_t> prompt_tokens;  // must be non-empty (BOS counts)
  int32_t max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;    // generation ends after emitting one of these
  int32_t prefill_chunk = 512;         // prompt tokens per forward pass
};

struct GenerateStats {
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
  int32_t forward_passes = 0;
  int32_t decode_passes = 0;  // forward passes after the prompt (one per decoded token)
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double prefill_tokens_per_second() const {
    return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0;
  }
  double decode_tokens_per_second() const {
    return decode_seconds > 0 ? decode_passes / decode_seconds : 0;
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

  // InvalidArgument for an empty prompt, out-of-vocabulary ids or bad sampling params;
  // OutOfRange if the prompt does not fit the model's context (the number of new tokens is
  // clamped to the context that remains). The sequence's KV blocks are freed on return.
  StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                    const TokenCallback& on_token = nullptr);

 private:
  ModelRunner& runner_;
  KvCacheManager& kv_;
};

}  // namespace specinfer
