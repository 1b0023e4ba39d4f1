// The LLM worker protocol's requests (proto/llm_worker.proto) checked and turned into the
// engine's types before a worker touches its KV storage: nothing from the wire is trusted.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/forward_check.h"
#include "proto/llm_worker.pb.h"
#include "specinfer/status.h"

namespace specinfer {

// What a worker checks requests against.
struct LlmWireLimits {
  ForwardLimits forward;     // the model's vocabulary, the worker's KV storage geometry
  int64_t logits_vocab = 0;  // logits columns the worker returns per row (its vocab shard)
  bool last_stage = false;   // whether it returns logits at all
};

// Turns a Forward request into a ForwardBatch, checking every field first: the block size is the
// worker's; at most 2^16 tokens, positions in [0, 2^24), as many positions as tokens, no more
// sequences, logits or distribution rows than tokens (and one setting per distribution row), a
// response's logits and distributions under 1 GiB each; each sequence's ranges
// non-negative and non-empty, its block table inside the storage and covering its positions, its
// mask (if any) of the right rows and columns; then ForwardBatch::Validate. The batch's masks
// point into `masks` and `tables` into `req`, which must outlive them. InvalidArgument otherwise.
Status ParseForwardRequest(const worker::LlmForwardRequest& req, const LlmWireLimits& limits,
                           ForwardBatch& batch, std::vector<TreeMask>& masks,
                           std::vector<std::span<const int32_t>>& tables);

// Checks a MoveKv request: the worker's block size, src and dst of one size (at most 2^16), a
// non-negative length, the block table inside the storage and covering it, every position in
// [0, length). InvalidArgument otherwise.
Status CheckMoveKvRequest(const worker::LlmMoveKvRequest& req, const LlmWireLimits& limits);

}  // namespace specinfer
