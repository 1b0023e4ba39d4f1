#include "engine/generator.h"

#include <algorithm>

#include "spec/verifier.h"

namespace specinfer {

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Frees the sequence's KV blocks however Generate returns.
struct SequenceGuard {
  KvCacheManager& kv;
  SeqId seq;
  ~SequenceGuard() { kv.RemoveSequence(seq); }
};
}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

StatusOr<GenerateResult> Generator::Generate(const GenerateRequest& req,
                                             const TokenCallback& on_token) {
  const ModelConfig& c = runner_.model().config();
  if (req.prompt_tokens.empty()) return InvalidArgumentError("empty prompt (BOS counts)");
  for (int32_t t : req.prompt_tokens)
    if (t < 0 || t >= c.vocab_size)
      return InvalidArgumentError("prompt token " + std::to_string(t) + " outside vocabulary");
  if (req.max_new_tokens < 0) return InvalidArgumentError("max_new_tokens must be >= 0");
  if (req.prefill_chunk <= 0) return InvalidArgumentError("prefill_chunk must be > 0");
  SI_RETURN_IF_ERROR(req.sampling.Validate());
  const bool speculate = !req.speculators.empty();
  if (speculate) {
    SI_RETURN_IF_ERROR(req.tree_shape.Validate());
    if (req.speculators.size() > static_cast<size_t>(TokenTree::kMaxSpeculators))
      return InvalidArgumentError("too many speculators");
    for (const Speculator* s : req.speculators)
      if (s == nullptr) return InvalidArgumentError("null speculator");
  }
  const int32_t prompt_len = static_cast<int32_t>(req.prompt_tokens.size());
  if (prompt_len > c.max_seq_len) {
    return OutOfRangeError("prompt of " + std::to_string(prompt_len) +
                           " tokens does not fit the model's context of " +
                           std::to_string(c.max_seq_len) + " tokens");
  }
  // The last generated token is never fed back, so the context bounds new tokens by
  // max_seq_len - prompt_len + 1.
  const int32_t max_new = std::min(req.max_new_tokens, c.max_seq_len - prompt_len + 1);

  GenerateResult result;
  GenerateStats& stats = result.stats;
  stats.prompt_tokens = prompt_len;
  stats.prefill_tokens = prompt_len - 1;
  SpeculationStats& spec = stats.spec;
  const size_t num_spec = req.speculators.size();
  spec.proposed_by.assign(num_spec, 0);
  spec.accepted_by.assign(num_spec, 0);
  for (const Speculator* s : req.speculators) spec.speculator_names.push_back(s->name());

  const SeqId seq = kv_.AddSequence();
  SequenceGuard guard{kv_, seq};
  std::vector<std::unique_ptr<DraftSession>> sessions;
  for (Speculator* s : req.speculators) {
    SI_ASSIGN_OR_RETURN(auto session, s->StartSession());
    sessions.push_back(std::move(session));
  }
  Rng rng(req.sampling.seed);
  std::vector<float> logits;
  ForwardBatch batch;

  // Prefill all but the last prompt token, in chunks, without logits.
  auto t0 = Clock::now();
  const int32_t prefill = prompt_len - 1;
  for (int32_t begin = 0; begin < prefill; begin += req.prefill_chunk) {
    const int32_t count = std::min(req.prefill_chunk, prefill - begin);
    SI_RETURN_IF_ERROR(kv_.Reserve(seq, begin + count));
    batch = ForwardBatch();
    std::vector<int32_t> pos(count);
    for (int32_t i = 0; i < count; ++i) pos[i] = begin + i;
    batch.AddSequence(seq, std::span(req.prompt_tokens).subspan(begin, count), pos, begin,
                      nullptr);
    batch.batch_invariant = false;  // prompt tokens only: BLAS may block the sums
    SI_RETURN_IF_ERROR(runner_.Forward(batch, kv_, logits));
    ++stats.forward_passes;
  }
  auto t1 = Clock::now();
  stats.prefill_seconds = Seconds(t0, t1);

  // The sequence so far; its last token (the next tree's root) has no KV entry yet.
  std::vector<int32_t> context = req.prompt_tokens;
  int32_t committed = prefill;  // KV entries [0, committed) are final
  std::vector<int32_t> order, parents, layout_of, src, dst;
  while (static_cast<int32_t>(result.tokens.size()) < max_new) {
    // --- draft ---
    auto d0 = Clock::now();
    TokenTree tree(context.back());
    if (speculate) {
      // No deeper than the tokens still wanted (the pass adds one of its own) and the context.
      const int32_t max_depth = std::min(max_new - static_cast<int32_t>(result.tokens.size()) - 1,
                                         c.max_seq_len - 1 - committed);
      DraftContext ctx;
      ctx.tokens = context;
      ctx.shape = &req.tree_shape;
      ctx.max_depth = max_depth;
      ctx.sampling = &req.sampling;
      ctx.rng = &rng;
      for (size_t s = 0; s < sessions.size() && max_depth > 0; ++s) {
        ctx.speculator_index = static_cast<int32_t>(s);
        SI_ASSIGN_OR_RETURN(TokenTree t, sessions[s]->Propose(ctx));
        SI_RETURN_IF_ERROR(tree.Merge(std::move(t)));
      }
    }
    auto d1 = Clock::now();

    // --- one LLM pass over the tree, laid out depth-first after the committed entries ---
    const int32_t size = tree.size();
    tree.DepthFirstLayout(&order, &parents);
    layout_of.assign(static_cast<size_t>(size), 0);
    batch = ForwardBatch();
    std::vector<int32_t> toks(static_cast<size_t>(size)), pos(static_cast<size_t>(size));
    for (int32_t i = 0; i < size; ++i) {
      const TreeNode& n = tree.node(order[i]);
      toks[i] = n.token;
      pos[i] = committed + n.depth;  // rotary position by depth, not layout
      layout_of[order[i]] = i;
    }
    const TreeMask mask = TreeMask::FromParents(parents);
    SI_RETURN_IF_ERROR(kv_.Reserve(seq, committed + size));
    batch.AddSequence(seq, toks, pos, committed, size > 1 ? &mask : nullptr);
    // Logits in node order, which is what the verifier reads.
    batch.logit_rows = layout_of;
    logits.resize(static_cast<size_t>(size) * c.vocab_size);
    SI_RETURN_IF_ERROR(runner_.Forward(batch, kv_, logits));
    ++stats.forward_passes;
    ++stats.decode_passes;
    const VerifyOutcome outcome = Verify(tree, logits, c.vocab_size, req.sampling, rng);

    // Keep the root's and the accepted path's entries, compacted; drop the rest.
    const int32_t accepted = static_cast<int32_t>(outcome.accepted.size());
    src.clear();
    dst.clear();
    for (int32_t i = 0; i < accepted; ++i) {
      src.push_back(committed + layout_of[outcome.accepted[i]]);
      dst.push_back(committed + 1 + i);
    }
    SI_RETURN_IF_ERROR(runner_.MoveKv(kv_, seq, src, dst));
    committed += 1 + accepted;
    kv_.Truncate(seq, committed);
    auto d2 = Clock::now();
    spec.draft_seconds += Seconds(d0, d1);
    spec.verify_seconds += Seconds(d1, d2);

    // --- statistics ---
    spec.tree_nodes += size - 1;
    spec.accepted_tokens += accepted;
    if (spec.proposed_at_depth.size() < static_cast<size_t>(tree.max_depth())) {
      spec.proposed_at_depth.resize(tree.max_depth(), 0);
      spec.accepted_at_depth.resize(tree.max_depth(), 0);
    }
    for (int32_t d = 0; d < tree.max_depth(); ++d) ++spec.proposed_at_depth[d];
    for (int32_t d = 0; d < accepted; ++d) ++spec.accepted_at_depth[d];
    for (int32_t v = 1; v < size; ++v)
      for (size_t s = 0; s < num_spec; ++s)
        if ((tree.node(v).proposers >> s) & 1) ++spec.proposed_by[s];
    for (int32_t v : outcome.accepted)
      for (size_t s = 0; s < num_spec; ++s)
        if ((tree.node(v).proposers >> s) & 1) ++spec.accepted_by[s];

    // --- emit the accepted tokens, then the LLM's own ---
    std::vector<int32_t> emitted;
    for (int32_t v : outcome.accepted) emitted.push_back(tree.node(v).token);
    emitted.push_back(outcome.next_token);
    bool done = false;
    for (int32_t next : emitted) {
      result.tokens.push_back(next);
      context.push_back(next);
      if (on_token && !on_token(next)) {
        result.finish_reason = FinishReason::kCancelled;
        done = true;
      } else if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), next) !=
                 req.stop_tokens.end()) {
        result.finish_reason = FinishReason::kStop;
        done = true;
      } else if (static_cast<int32_t>(result.tokens.size()) == max_new) {
        done = true;
      }
      if (done) break;
    }
    if (done) break;
  }
  stats.generated_tokens = static_cast<int32_t>(result.tokens.size());
  stats.decode_seconds = Seconds(t1, Clock::now());
  return result;
}

}  // namespace specinfer
