// Speculators (SpecInfer's SSMs): whatever proposes a token tree for a sequence.
//
// A Speculator is shared by every request that uses it (a draft model, its runner and KV cache);
// a DraftSession is one sequence's state in it. Kinds, named by spec strings (their grammar and
// limits: spec/spec_grammar.h):
//   model:PATH   a separate model that shares the LLM's vocabulary;
//   layers:K     the LLM's own first K layers with its final norm and output matrix (the
//                self-speculative draft: no second model, shares the LLM's weights);
//   ngram[:N]    prompt lookup: continuations of earlier occurrences of the last N..1 tokens in
//                the prompt and the text generated so far (no model at all).
//
// Model drafts expand level by level (SpecInfer's expansion-based construction): at step i every
// frontier node gets the draft's top-k_i tokens under greedy decoding (deterministic proposals)
// or k_i independent draws from the draft's distribution q under sampling (q recorded with each
// proposal, for verifier.h). With DraftContext::dynamic they grow a dynamic tree instead
// (spec/dynamic_tree.h: best-first by cumulative draft probability under a node budget), and
// prompt lookup keeps its most confident continuations (spec/ngram.h). The draft runs
// incrementally on its own runner (on the backend SpeculatorOptions::backend names) and KV cache,
// sized from the runner: each Propose first brings the cache up to the sequence's committed
// tokens (keeping the common prefix with what it holds, so rejected guesses leave nothing
// behind), then appends one tree level (or dynamic-tree round) per pass with a topology-aware
// mask.
//
// Batched drafting: Speculator::ProposeBatch drafts for several sequences' sessions at once. A
// model draft runs one catch-up pass for all short catch-ups and then one pass per tree level for
// every sequence still growing (the runner's ForwardBatch carries several sequences); each tree
// is the one Propose would return, node for node (Propose is ProposeBatch of one session, and the
// passes are batch-invariant, so every draft logit is bit-identical either way).
//
// Thread safety: a Speculator's sessions are used by one thread at a time (the engine's loop).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "model/model.h"
#include "sampling/sampler.h"
#include "spec/token_tree.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

class ThreadPool;

struct DraftContext {
  std::span<const int32_t> tokens;  // the sequence so far; its last token is the tree's root
  const TreeShape* shape = nullptr;
  int32_t max_depth = 0;            // the tree may not be deeper (what the request has left)
  const SamplingParams* sampling = nullptr;
  Rng* rng = nullptr;               // draws for sampled expansion
  int32_t speculator_index = 0;     // recorded in the proposals (DraftTrial::speculator)
  // Nodes past the root the tree may hold (the sequence's room, or this session's share of the
  // step's budget): a static expansion stops adding nodes there (the first ones in expansion
  // order are kept, so sampled trials stay genuine draws); a dynamic tree grows to it.
  int32_t max_nodes = static_cast<int32_t>(TreeShape::kMaxNodes);
  // Grow a dynamic tree (spec/dynamic_tree.h) of up to max_nodes nodes and max_depth levels
  // instead of expanding `shape` (whose depth still bounds max_depth).
  bool dynamic = false;
};

class DraftSession {
 public:
  DraftSession() { live_.fetch_add(1, std::memory_order_relaxed); }
  DraftSession(const DraftSession&) = delete;
  DraftSession& operator=(const DraftSession&) = delete;
  virtual ~DraftSession() { live_.fetch_sub(1, std::memory_order_relaxed); }
  // DraftSession objects alive in this process, of every speculator and engine (the
  // specinfer_draft_sessions gauge): with no sequence running it must return to its idle value,
  // else a session leaked. Any thread.
  static int64_t live() { return live_.load(std::memory_order_relaxed); }
  // A tree rooted at ctx.tokens.back(); a tree of the root alone when there is nothing to guess.
  virtual StatusOr<TokenTree> Propose(const DraftContext& ctx) = 0;
  // Optional: starts this step's proposal for `ctx` in the background (a remote SSM worker's
  // RPC), so that the drafts of every sequence in a step overlap; the Propose that follows with
  // the same context collects it. The default does nothing (Propose does all the work).
  virtual void Begin(const DraftContext& ctx) {}
  // Whether Propose keeps to ctx.max_nodes (and grows dynamic trees when asked). A session that
  // does not (e.g. a remote SSM worker's) returns its shape's expansion, and the engine merges
  // it only where that whole expansion fits (speculative_step.h).
  virtual bool honors_node_budget() const { return false; }

 private:
  static inline std::atomic<int64_t> live_{0};
};

class Speculator {
 public:
  virtual ~Speculator() = default;
  // The spec string it was created from, e.g. "ngram:3", "layers:4", "model:draft.gguf".
  virtual const std::string& name() const = 0;
  // ResourceExhausted when the speculator's KV cache has no room for another sequence.
  virtual StatusOr<std::unique_ptr<DraftSession>> StartSession() = 0;

  // True when ProposeBatch does better than proposing one session after another (model drafts:
  // one pass per tree level for all of them).
  virtual bool batches_proposals() const { return false; }
  // Proposes a tree for each of `sessions` (sessions of this speculator) with `contexts[i]`: the
  // same tree and status that sessions[i]->Propose(contexts[i]) would give, drawing from each
  // context's rng in the same order. A session may appear more than once: its items are served
  // in order, as consecutive Propose calls would be. The default calls Propose in turn. Returns
  // one result per session, in order; a session of another speculator gets InvalidArgument.
  virtual std::vector<StatusOr<TokenTree>> ProposeBatch(std::span<DraftSession* const> sessions,
                                                        std::span<const DraftContext> contexts);
  // DraftSession::Begin for several sessions of this speculator (each at most once) at once:
  // each session's Propose with the same context then collects its tree. Remote SSM workers
  // send one call per worker for all of them. The default calls each session's Begin in order.
  virtual void BeginBatch(std::span<DraftSession* const> sessions,
                          std::span<const DraftContext> contexts);
};

struct SpeculatorOptions {
  int32_t max_sequences = 1;   // sequences a model draft keeps KV for; more: ResourceExhausted
  int32_t kv_block_size = 16;
  // Where a model or layers draft runs: a registered backend name (backend/registry.h). On
  // another backend than the LLM's, a layers draft holds its own copy of the layers it uses.
  std::string backend = "cpu";
  int32_t device = 0;  // GPU backends: which device (RunnerOptions::device)
  bool cuda_graphs = true;  // GPU backends: RunnerOptions::cuda_graphs
  // For CPU drafts: threads shared with the LLM's runner; null: own threads.
  std::shared_ptr<ThreadPool> pool;
  int32_t num_threads = 0;           // without a pool: 0 means all hardware threads
  // The LLM's tokenizer: when given, a draft model's own vocabulary (if its file has one) must
  // match it piece for piece, not only in size.
  const Tokenizer* llm_tokenizer = nullptr;
};

// Creates a speculator for the LLM `llm` from a spec string (see the file comment), parsed by
// ParseDraftSpec under the engine's limits; its name() is `spec` as given.
// InvalidArgument for a malformed spec, a layer count outside [1, llm layers), a draft model
// whose vocabulary differs from the LLM's; load errors of a draft model and the backend's
// errors (backend/registry.h: unknown name, no device) pass through.
StatusOr<std::unique_ptr<Speculator>> CreateSpeculator(std::string_view spec,
                                                       std::shared_ptr<const Model> llm,
                                                       const SpeculatorOptions& options);

// Expansion of one node from a draft's logits there: under greedy `sampling` its top-k tokens
// (deterministic proposals, highest first, lower id first among equals); otherwise k independent
// draws from q = ComputeProbs(logits, sampling), with q stored in the tree for the verifier.
// Proposals stop once the tree holds `max_nodes` nodes past the root (decided before each
// proposal, from the ones before it).
void ProposeChildren(TokenTree& tree, int32_t node, std::span<const float> logits, int32_t k,
                     const SamplingParams& sampling, Rng& rng, int32_t speculator,
                     int32_t max_nodes = static_cast<int32_t>(TreeShape::kMaxNodes));

}  // namespace specinfer
