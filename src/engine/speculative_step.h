// One decoding step of one sequence as SpecInfer does it (§3-4): from "the last chosen token" to
// "the tokens to emit", in four stages around the LLM pass that the engine core runs:
//
//   Plan     Draft   the speculators' proposals, merged into one token tree rooted at the last
//                    token (the root alone without speculators: that is incremental decoding);
//            Layout  the tree laid out depth-first after the sequence's committed KV entries,
//                    with the topology-aware mask and rotary positions by depth, added to the
//                    pass's ForwardBatch with its logits rows in node order;
//   ── the LLM pass (engine/executor.h) ──
//   Verify   Verify  the verifier (spec/verifier.h) picks the accepted path and the LLM's next
//                    token from the tree's logits rows ([tree size, vocab], node order);
//            Compact the accepted path's KV entries move next to the committed ones
//                    (ModelRunner::MoveKv), the rest are dropped.
//
// It owns the speculators' draft sessions and the tree in flight between Plan and Verify, and
// records what speculation did in the sequence's SpeculationStats. The sequence's own state
// (context, committed KV length, sampling RNG, result) stays in Sequence (engine/sequence.h),
// which drives it and emits the tokens.
//
// Thread safety: used by one thread at a time (the owner of the runner and KV cache).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "engine/executor.h"
#include "engine/generation.h"
#include "engine/spec_controller.h"
#include "kv/kv_cache.h"
#include "spec/speculator.h"
#include "spec/token_tree.h"

namespace specinfer {

// How a tree's rows come back (SpeculativeStep::Plan's `rows`): logits rows, or with `tokens` (a
// sequence that reads no logits) one token per node found where the logits are: the argmax rows
// of a greedy `sampling`; for a sampled one whose tree is the root alone, where `draws`
// (ModelRunner::draws_tokens), the token drawn at a uniform taken from `rng` in Plan (the very
// draw Verify would take from the row). A sampled tree of more nodes gets distribution rows
// where `dists` (ModelRunner::returns_distributions): its verification reads the nodes'
// distributions, computed where the logits are; else logits rows.
struct RowRequest {
  bool tokens = false;
  bool draws = false;
  bool dists = false;
  const SamplingParams* sampling = nullptr;  // required with `tokens`
  Rng* rng = nullptr;                        // required with `draws`
};

class SpeculativeStep {
 public:
  // For sequence `seq` of `kv`; `stats` (which must outlive it) receives the statistics.
  SpeculativeStep(KvCacheManager& kv, SeqId seq, SpeculationStats& stats);

  // Opens a draft session on each of `speculators`, in order; one without room for another
  // sequence (ResourceExhausted) is left out, any other error is returned. Names the ones kept
  // in the statistics. `shape` (its full expansion) sets shape_nodes(). However many drafts
  // there are, Plan keeps their merged tree within the step's budget and the
  // TreeShape::kMaxNodes positions a sequence is admitted with (Sequence::MaxKvBlocks).
  Status OpenSessions(std::span<Speculator* const> speculators, const TreeShape& shape);
  bool has_sessions() const { return !sessions_.empty(); }
  // The open sessions' speculator names joined by '|' (the controller's speculator set).
  const std::string& key() const { return key_; }
  // Nodes of the shape's full expansion at each depth (index d - 1), set by OpenSessions.
  std::span<const int64_t> shape_nodes() const { return shape_nodes_; }

  // What the last verified tree did (for the controller, spec_controller.h): it was drafted
  // with depth cap `cap` (0: the root alone) in `draft_seconds`, held nodes_at_depth[d - 1]
  // nodes at depth d, and `accepted` of them were accepted.
  struct TreeReport {
    int32_t cap = 0;
    bool dynamic = false;       // a dynamic tree (DraftContext::dynamic) of node budget `budget`
    int32_t budget = 0;         // nodes the tree was allowed past the root (0: the root alone)
    int32_t nodes = 0;          // nodes it had past the root
    std::vector<float> probs;   // their cumulative draft probabilities, largest first
    std::vector<int32_t> nodes_at_depth;
    int32_t accepted = 0;
    double draft_seconds = 0;
    // Whether the drafts caught up on the last step's tokens alone (this sequence drafted at
    // its previous step too): then draft_seconds is what a step of this tree costs. Otherwise
    // they also ran the prompt or the tokens of plain steps in between, a one-off cost that
    // must not be taken for the cost of a level (it kept the controller from speculating).
    bool draft_steady = false;
  };
  const TreeReport& last_tree() const { return report_; }
  // Seconds the last Plan spent drafting.
  double last_draft_seconds() const { return draft_seconds_; }
  // This sequence's own acceptance and tree sizes by depth (EWMA, SpecController::kSeqAlpha).
  const AcceptanceModel& acceptance() const { return acceptance_; }
  // The same for dynamic trees: by rank of node budget (SpecController::ChooseBudgets).
  const BudgetAcceptanceModel& budget_acceptance() const { return budget_acceptance_; }

  // Lets sessions that draft in the background (DraftSession::Begin) start on `ctx` now, so that
  // a batch's drafts overlap; Plan with the same context collects them.
  void BeginDraft(DraftContext ctx);

  // BeginDraft for several sequences at once: their sessions of one speculator start through one
  // Speculator::BeginBatch (remote SSM workers: one call per worker for all sequences), session
  // index by session index, so each sequence's sessions begin in order as with BeginDraft.
  static void BeginTogether(std::span<SpeculativeStep* const> steps,
                            std::span<const DraftContext> contexts);
  // Batched drafting: drafts now, for every steps[i] with contexts[i] (the context its Plan will
  // get), the trees of its sessions whose speculator batches proposals (model drafts,
  // Speculator::ProposeBatch), one ProposeBatch call per speculator and session index, so the
  // draft passes of a step are shared by all sequences; each Plan then takes its trees instead
  // of proposing alone. The trees are those Plan would draft itself (each draft given the node
  // budget Plan would give it, checked again there), and each sequence's RNG
  // draws keep their order: session by session, and a sequence that samples stops at its first
  // session that does not batch (that one proposes in Plan, in order). The batch's seconds are
  // split evenly among the sequences that took part (their draft_seconds).
  static void DraftTogether(std::span<SpeculativeStep* const> steps,
                            std::span<const DraftContext> contexts);

  // Drafts the tree rooted at `root` (with `ctx`; null: the root alone), reserves its KV entries
  // after the `committed` ones, and adds it to `batch` with its rows in node order, as `rows`
  // asks: logits rows, argmax rows (ForwardBatch::AddTokenRow, a sampled draw) or distribution
  // rows (ForwardBatch::AddDistRow). The
  // tree holds at most min(ctx->max_nodes, TreeShape::kMaxNodes) nodes past the root: the drafts
  // propose in turn, each within what the earlier ones left (static shapes) or an even share of
  // it (dynamic trees); a draft that ignores budgets is merged only where its shape's whole
  // expansion fits.
  // Returns the tree's size (>= 1), which is the number of rows it added. A session
  // whose Propose finds no room (ResourceExhausted) proposes nothing this step; any other error
  // of a session is returned.
  StatusOr<int32_t> Plan(int32_t root, const DraftContext* ctx, int32_t committed,
                         ForwardBatch& batch, const RowRequest& rows = {});

  // A token to emit and the logits row it was chosen from (a row of Verify's `logits`; empty
  // when the pass brought back argmax rows).
  struct Chosen {
    int32_t token;
    std::span<const float> logits;  // [vocab]
  };
  struct Outcome {
    std::vector<Chosen> tokens;  // the accepted path's tokens, then the LLM's own
    int32_t committed = 0;       // committed KV entries after the step
  };
  // After the pass: `rows` holds the tree's logits rows ([tree size, vocab], node order), or
  // its argmax rows ([tree size]: argmaxes, or the root's draw) or distribution rows when Plan
  // asked for those. Verifies
  // with `sampling` and `rng`, compacts the accepted path's KV entries on `runner` and drops the
  // rest.
  StatusOr<Outcome> Verify(const PassRows& rows, int32_t vocab, const SamplingParams& sampling,
                           Rng& rng, ModelRunner& runner);

 private:
  // Session s's context within `ctx`: its node budget is what the drafts before it left in
  // `merged` (all of it, or an even share for dynamic trees); `fits` whether it may propose.
  DraftContext SessionContext(const DraftContext& ctx, size_t s, const TokenTree& merged,
                              bool* fits) const;
  // Counts one verified tree whose accepted nodes (root excluded) are `accepted`.
  void Record(std::span<const int32_t> accepted);

  KvCacheManager& kv_;
  const SeqId seq_;
  SpeculationStats& stats_;
  std::vector<std::unique_ptr<DraftSession>> sessions_;  // in the request's order
  std::vector<Speculator*> speculators_;                 // each session's
  // Trees DraftTogether drafted for this step's Plan, per session (empty: Plan proposes), with
  // the context size and depth cap they were drafted for and this sequence's share of the time.
  std::vector<std::optional<StatusOr<TokenTree>>> drafted_;
  size_t drafted_tokens_ = 0;
  int32_t drafted_depth_ = 0;
  int32_t drafted_nodes_ = 0;
  bool drafted_dynamic_ = false;
  std::vector<int32_t> drafted_budget_;  // per session: the node budget it was drafted with
  double drafted_seconds_ = 0;
  std::string key_;
  std::vector<int64_t> shape_nodes_;
  AcceptanceModel acceptance_;
  BudgetAcceptanceModel budget_acceptance_;
  TreeReport report_;

  // The tree in flight between Plan and Verify.
  TokenTree tree_{0};
  TreeMask mask_;
  std::vector<int32_t> order_, parents_, layout_of_;
  int32_t committed_ = 0;  // committed KV entries when it was planned
  int32_t cap_ = 0;        // depth cap it was drafted with
  int32_t budget_ = 0;     // node budget it was drafted with
  bool dynamic_ = false;   // a dynamic tree
  double draft_seconds_ = 0;
  bool draft_steady_ = false;  // the tree's draft_steady
  // Context tokens when the last tree was drafted and its depth cap (-1: none drafted yet).
  int64_t drafted_at_ = -1;
  int32_t drafted_cap_ = 0;
};

}  // namespace specinfer
