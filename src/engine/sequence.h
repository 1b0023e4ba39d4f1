// One generation's state across LLM passes: the unit that Generator (one sequence at a time) and
// BatchGenerator (many at once, iteration-level scheduling) both drive, so batched serving and
// the CLI run the very same prefill / draft / verify / commit steps.
//
// Life of a sequence:
//   Start     validates the request, registers a KV sequence, opens the speculators' sessions;
//   prefill   PlanPrefill adds chunks of the prompt but its last token to a pass (no logits);
//   decode    PlanDecode drafts a token tree rooted at the last token (the root alone without
//             speculation: that is incremental decoding) and adds it, laid out depth-first after
//             the committed KV entries, with the topology-aware mask and positions by depth;
//             Commit reads the pass's logits rows of the tree, verifies (spec/verifier.h),
//             compacts the accepted path's KV entries into place, drops the rest, and emits the
//             accepted tokens plus the LLM's own through the token callback;
//   done      finish reason set; the destructor frees the KV blocks.
//
// A pass may hold several sequences (ForwardBatch::seqs); each sequence reads only its own
// logits rows (logit_begin()). With batch-invariant kernels a sequence's tokens do not depend on
// what else shared its passes.
//
// Thread safety: used by one thread at a time (the loop that owns the runner and KV cache).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "engine/generation.h"
#include "kv/kv_cache.h"
#include "sampling/sampler.h"
#include "spec/speculator.h"
#include "spec/token_tree.h"

namespace specinfer {

class SequenceRun {
 public:
  enum class Phase { kPrefill, kDecode, kDone };

  // InvalidArgument for an empty prompt, out-of-vocabulary ids, bad sampling parameters or tree
  // shape; OutOfRange if the prompt does not fit the model's context (the number of new tokens
  // is clamped to the context that remains). A speculator without room for another session
  // (ResourceExhausted) is left out of this sequence rather than failing it.
  // `kv_epoch`: the runner's ModelRunner::kv_epoch() now.
  static StatusOr<std::unique_ptr<SequenceRun>> Start(GenerateRequest request,
                                                      TokenCallback on_token,
                                                      const ModelConfig& config,
                                                      KvCacheManager& kv, uint64_t kv_epoch = 0);
  ~SequenceRun();  // frees the sequence's KV blocks

  // KV blocks of `block_size` positions that a sequence for `request` may hold at its largest
  // (prompt + new tokens, clamped to the context, + the deepest tree), for admission.
  static int32_t MaxKvBlocks(const GenerateRequest& request, const ModelConfig& config,
                             int32_t block_size);
  SequenceRun(const SequenceRun&) = delete;
  SequenceRun& operator=(const SequenceRun&) = delete;

  Phase phase() const { return phase_; }
  const GenerateRequest& request() const { return request_; }
  int32_t max_kv_blocks() const { return max_kv_blocks_; }
  int32_t prefill_remaining() const { return prefill_end_ - prefilled_; }

  // Adds the next prefill chunk, at most `max_tokens` (> 0) prompt tokens, to `batch`. Phase
  // kPrefill only; moves to kDecode once the prompt but its last token is in.
  Status PlanPrefill(ForwardBatch& batch, int32_t max_tokens);
  // Lets speculators that work in the background (remote SSM workers, DraftSession::Begin)
  // start this step's proposals now, so that a batch's drafts overlap; PlanDecode collects them.
  // Optional; kDecode only (otherwise nothing happens).
  void BeginDraft();
  // Drafts this step's token tree and adds it to `batch`; returns its size (>= 1). kDecode only.
  StatusOr<int32_t> PlanDecode(ForwardBatch& batch);
  // After the pass that PlanDecode joined: `logits` holds every logits row of that batch
  // ([batch.logit_rows.size(), vocab]). Verifies, commits, emits; may finish the sequence.
  Status Commit(std::span<const float> logits, ModelRunner& runner);
  // Before planning a pass: DataLoss ("KV lost: ...") if the sequence wrote KV entries under
  // another runner kv_epoch than `current` (they are gone); a sequence with no KV yet adopts it.
  Status CheckKvEpoch(uint64_t current);
  // Ends the sequence now with `reason` (e.g. kCancelled).
  void Finish(FinishReason reason);

  // Time of the passes it took part in, by phase (a batch's pass counts for each member).
  void AddPassSeconds(double seconds);

  GenerateResult& result() { return result_; }

 private:
  // This step's drafting context; false when there is nothing to draft.
  bool DraftContextNow(DraftContext* ctx);

  SequenceRun(GenerateRequest request, TokenCallback on_token, const ModelConfig& config,
              KvCacheManager& kv, SeqId seq);

  GenerateRequest request_;
  TokenCallback on_token_;
  const ModelConfig& config_;
  KvCacheManager& kv_;
  const SeqId seq_;
  Phase phase_ = Phase::kPrefill;
  int32_t max_new_ = 0;
  int32_t max_kv_blocks_ = 0;
  int32_t prefill_end_ = 0;  // prompt tokens prefilled before decoding: all but the last
  int32_t prefilled_ = 0;
  int32_t committed_ = 0;    // KV entries [0, committed_) are final
  uint64_t kv_epoch_ = 0;    // runner's kv_epoch() its KV entries were written under
  std::vector<int32_t> context_;  // prompt + generated; its last token is the next tree's root
  std::vector<Speculator*> speculators_;  // those with a session, in the request's order
  std::vector<std::unique_ptr<DraftSession>> sessions_;
  Rng rng_;
  GenerateResult result_;

  // The tree in flight between PlanDecode and Commit.
  TokenTree tree_{0};
  TreeMask mask_;
  std::vector<int32_t> order_, parents_, layout_of_;
  int32_t logit_begin_ = 0;  // its first row among the batch's logits rows
  std::chrono::steady_clock::time_point decode_start_;
  bool decode_started_ = false;
};

}  // namespace specinfer
