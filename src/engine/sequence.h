// One generation's state across LLM passes: the unit that the engine core (engine/engine_core.h)
// schedules, whether it serves many sequences or, through Generator, one; so batched serving and
// the CLI run the very same prefill / draft / verify / commit steps.
//
// Life of a sequence:
//   Start     validates the request, registers a KV sequence, opens the speculators' sessions,
//             and attaches the longest cached prefix of the prompt (KvCacheManager prefix
//             caching: whole blocks, never the last prompt token, which must make logits);
//   prefill   PlanPrefill adds chunks of the rest of the prompt but its last token to a pass;
//   decode    PlanDecode hands this step's drafting context to its SpeculativeStep
//             (engine/speculative_step.h), which drafts the tree and lays it out in the pass;
//             Commit gives the step the tree's logits rows to verify and compact, then emits the
//             accepted tokens plus the LLM's own through the token callback and decides whether
//             the sequence ends (stop token, length, callback);
//   done      finish reason set; the destructor frees the KV blocks.
//
// A pass may hold several sequences (ForwardBatch::seqs); each sequence is handed only its own
// logits rows. With batch-invariant kernels a sequence's tokens do not depend on what else shared
// its passes.
//
// Thread safety: used by one thread at a time (the loop that owns the runner and KV cache).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/generation.h"
#include "engine/speculative_step.h"
#include "kv/kv_cache.h"
#include "sampling/sampler.h"

namespace specinfer {

class Sequence {
 public:
  enum class Phase { kPrefill, kDecode, kDone };
  static constexpr int32_t kNoDepthCap = 1 << 30;  // PlanDecode: the tree shape's full depth

  // InvalidArgument for an empty prompt, out-of-vocabulary ids, bad sampling parameters or tree
  // shape; OutOfRange if the prompt does not fit the model's context (the number of new tokens
  // is clamped to the context that remains). A speculator without room for another session
  // (ResourceExhausted) is left out of this sequence rather than failing it.
  // `kv_epoch`: the runner's ModelRunner::kv_epoch() now.
  static StatusOr<std::unique_ptr<Sequence>> Start(GenerateRequest request, TokenCallback on_token,
                                                   const ModelConfig& config, KvCacheManager& kv,
                                                   uint64_t kv_epoch = 0);
  ~Sequence();  // frees the sequence's KV blocks

  // KV blocks of `block_size` positions that a sequence for `request` may hold at its largest
  // (prompt + new tokens, clamped to the context, + the deepest tree), for admission.
  static int32_t MaxKvBlocks(const GenerateRequest& request, const ModelConfig& config,
                             int32_t block_size);
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  Phase phase() const { return phase_; }
  const GenerateRequest& request() const { return request_; }
  int32_t max_kv_blocks() const { return max_kv_blocks_; }
  int32_t prefill_remaining() const { return prefill_end_ - prefilled_; }

  // Adds the next prefill chunk, at most `max_tokens` (> 0) prompt tokens, to `batch`. Phase
  // kPrefill only; moves to kDecode once the prompt but its last token is in.
  Status PlanPrefill(ForwardBatch& batch, int32_t max_tokens);
  // Lets speculators that work in the background (remote SSM workers, DraftSession::Begin)
  // start this step's proposals now, so that a batch's drafts overlap; PlanDecode collects them.
  // Optional; kDecode only (otherwise nothing happens). `depth_cap` as PlanDecode's.
  void BeginDraft(int32_t depth_cap = kNoDepthCap, int32_t dynamic_nodes = kStaticTree);
  // A step's draft limits for one sequence: {depth cap, dynamic node budget or kStaticTree}, as
  // BeginDraft and PlanDecode take them.
  using DraftCap = std::pair<int32_t, int32_t>;
  // BeginDraft for several sequences (caps[i] for seqs[i]): sessions of one speculator begin
  // through one Speculator::BeginBatch (SpeculativeStep::BeginTogether).
  static void BeginTogether(std::span<Sequence* const> seqs, std::span<const DraftCap> caps);
  // Batched drafting: drafts this step's trees of seqs[i] (limits caps[i], as PlanDecode's)
  // together, sharing the draft passes of their common model drafts
  // (SpeculativeStep::DraftTogether); each PlanDecode with the same limits then uses its trees.
  // Optional; sequences not decoding or with nothing to draft are skipped.
  static void DraftTogether(std::span<Sequence* const> seqs, std::span<const DraftCap> caps);
  // Drafts this step's token tree, its shape cut at depth `depth_cap` (0: the root alone, i.e.
  // plain decoding; the adaptive controller's choice, engine/spec_controller.h), and adds it to
  // `batch`; returns its size (>= 1), the number of rows it added: logits rows, argmax rows or
  // distribution rows (token_rows(): argmaxes, a sampled root-only step's draw, a sampled tree's
  // distributions, as `runner` allows; see RowRequest, engine/speculative_step.h). kDecode only.
  // `dynamic_nodes` >= 0: a dynamic tree (spec/dynamic_tree.h) of at most that many nodes past
  // the root, no deeper than `depth_cap` and the shape; kStaticTree: the shape's expansion.
  // `runner`: its `draws` and `dists`, what the LLM's runner takes (ModelRunner::draws_tokens,
  // ::returns_distributions); the rest is the sequence's.
  static constexpr int32_t kStaticTree = -1;
  StatusOr<int32_t> PlanDecode(ForwardBatch& batch, int32_t depth_cap = kNoDepthCap,
                               int32_t dynamic_nodes = kStaticTree, const RowRequest& runner = {});
  // The deepest tree this step may draft (its shape, the tokens still wanted and the context);
  // 0 when it cannot speculate (no speculators, not decoding).
  int32_t max_spec_depth() const;
  const SpeculativeStep& speculation() const { return step_; }
  // Decode passes so far.
  int32_t decode_passes() const { return result_.stats.decode_passes; }
  // Tokens generated so far.
  int32_t generated() const { return static_cast<int32_t>(result_.tokens.size()); }
  // After the pass that PlanDecode joined: `rows` holds this sequence's rows of it (logits
  // [tree size, vocab], or argmax or distribution rows where PlanDecode added those). Verifies,
  // commits, emits; may finish the sequence.
  Status Commit(const PassRows& rows, ModelRunner& runner);
  // Whether its decode passes may ask for tokens instead of logits rows: a request whose callback
  // reads no logits (GenerateRequest::callback_logits false). Greedy ones always do.
  bool token_rows() const { return !request_.callback_logits; }
  // Before planning a pass: DataLoss ("KV lost: ...") if the sequence wrote KV entries under
  // another runner kv_epoch than `current` (they are gone); a sequence with no KV yet adopts it.
  Status CheckKvEpoch(uint64_t current);
  // Ends the sequence now with `reason` (e.g. kCancelled).
  void Finish(FinishReason reason);

  // After a pass it took part in succeeded (and after Commit): offers its committed KV entries
  // to the prefix cache (KvCacheManager::CommitTokens).
  void CacheCommittedKv();

  // Time of the passes it took part in, by phase (a batch's pass counts for each member).
  void AddPassSeconds(double seconds);

  GenerateResult& result() { return result_; }

 private:
  // This step's drafting context; false when there is nothing to draft.
  // The draft contexts of those of `seqs` that draft this step with limits `caps`.
  static void DraftContexts(std::span<Sequence* const> seqs, std::span<const DraftCap> caps,
                            std::vector<SpeculativeStep*>* steps,
                            std::vector<DraftContext>* contexts);
  bool DraftContextNow(int32_t depth_cap, int32_t dynamic_nodes, DraftContext* ctx);

  Sequence(GenerateRequest request, TokenCallback on_token, const ModelConfig& config,
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
  Rng rng_;
  GenerateResult result_;
  SpeculativeStep step_;  // drafts into result_.stats.spec, so declared after it
  std::chrono::steady_clock::time_point decode_start_;
  bool decode_started_ = false;
};

}  // namespace specinfer
