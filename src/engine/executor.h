// The engine core's executor: runs one step's ForwardBatch, planned by the core scheduler
// (engine/core_scheduler.h), on the ModelRunner and hands each member sequence its logits rows
// (or, for sequences that read no logits, its rows' argmaxes, draws or distributions:
// ModelRunner::ForwardArgmax).
//
//   ForwardBatch + each member's rows ──Run──> ModelRunner::Forward ──> PassOutput
//                                                                       (status, seconds,
//                                                                        rows per member)
//
// The logits buffer ([batch.logit_rows.size(), vocab]) is the executor's and is reused from pass
// to pass; the rows it hands out stay valid until the next Run. An error or exception in the pass
// becomes PassOutput::status (logged), for the scheduler to fail the pass's sequences. Before the
// pass it applies the KV cache's pending copy-on-write copies (ModelRunner::MoveKv) and refuses a
// pass that would write into a shared or cached KV block.
//
// Thread safety: one thread at a time (the owner of the runner and the KV cache).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"

namespace specinfer {

// One member sequence's rows in a pass: rows [first, first + count) of the batch's logit_rows,
// argmax_rows or dist_rows, as `kind` says (count 0 for a prefill chunk, which reads none).
struct LogitsRows {
  enum class Kind { kLogits, kArgmax, kDists };
  int32_t first = 0;
  int32_t count = 0;
  Kind kind = Kind::kLogits;
};

// What a member gets from a pass: its logits rows ([count, vocab]), its argmax rows' token ids
// ([count]) or its distribution rows (rows [dist_first, dist_first + count) of `dists`), as
// LogitsRows asked.
struct PassRows {
  std::span<const float> logits;
  std::span<const int32_t> argmax;
  const DistRows* dists = nullptr;
  int32_t dist_first = 0;
};

struct PassOutput {
  Status status;       // of the pass; on an error `rows` is empty
  double seconds = 0;  // wall time of the pass
  std::vector<PassRows> rows;  // per member, in order
};

class Executor {
 public:
  // `runner` and `kv` must outlive the executor.
  Executor(ModelRunner& runner, KvCacheManager& kv) : runner_(runner), kv_(kv) {}

  // Runs `batch`; `members` gives each member sequence's rows, in the order PassOutput::rows
  // keeps.
  PassOutput Run(const ForwardBatch& batch, std::span<const LogitsRows> members);

  ModelRunner& runner() { return runner_; }

 private:
  // Applies the KV cache's copy-on-write copies (kv/kv_cache.h) and checks that the pass writes
  // no shared block.
  Status PrepareKv(const ForwardBatch& batch);

  ModelRunner& runner_;
  KvCacheManager& kv_;
  std::vector<float> logits_;    // [batch.logit_rows.size(), vocab] of the last pass
  std::vector<int32_t> argmax_;  // [batch.argmax_rows.size()] of the last pass
  DistRows dists_;               // its batch.dist_rows
};

}  // namespace specinfer
