// The preconditions of ModelRunner::Forward and MoveKv, checked in one place: every runner (CPU,
// CUDA, the remote LLM group) calls these before it touches its storage, and the LLM worker
// checks the block tables it receives over the wire with the same CheckBlockTable.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "specinfer/status.h"

namespace specinfer {

// What a runner's Forward checks a batch against: its model's vocabulary and the geometry of
// the KV storage it allocated.
struct ForwardLimits {
  int32_t vocab_size = 0;
  int32_t num_kv_blocks = 0;  // blocks in the runner's KV storage
  int32_t kv_block_size = 0;  // positions per block
};

// Checks, in this order: the batch itself (ForwardBatch::Validate: InvalidArgument), that
// `logits_size` floats hold [logit_rows, vocab_size] and `argmax_size` ids its argmax rows
// (InvalidArgument; Forward passes 0: argmax rows are ForwardArgmax's), that distribution rows
// come only where `dists` says the caller returns them (InvalidArgument), that `kv` plans blocks of
// the runner's size (InvalidArgument), and for every sequence that `kv` knows it
// (InvalidArgument), has reserved its slots up to kv_end() (FailedPrecondition) and maps them to
// blocks inside the runner's storage (Internal: the engine paired a manager with the wrong
// runner).
Status CheckForward(const ForwardBatch& batch, const KvCacheManager& kv,
                    const ForwardLimits& limits, size_t logits_size, size_t argmax_size = 0,
                    bool dists = false);

// Checks a block table against a runner's storage: at most num_kv_blocks entries, every id in
// [0, num_kv_blocks), and enough blocks for `covers` positions. InvalidArgument (prefixed with
// `what`) otherwise.
Status CheckBlockTable(std::span<const int32_t> table, int64_t covers,
                       const ForwardLimits& limits, std::string_view what);

// Checks MoveKv's arguments: src and dst of one size, a known sequence, every position inside
// its reserved length. InvalidArgument otherwise.
Status CheckMoveKv(const KvCacheManager& kv, SeqId seq, std::span<const int32_t> src,
                   std::span<const int32_t> dst);

}  // namespace specinfer
