#include "engine/speculative_step.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "engine/guarded.h"
#include "spec/verifier.h"

namespace specinfer {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

SpeculativeStep::SpeculativeStep(KvCacheManager& kv, SeqId seq, SpeculationStats& stats)
    : kv_(kv), seq_(seq), stats_(stats) {}

Status SpeculativeStep::OpenSessions(std::span<Speculator* const> speculators,
                                     const TreeShape& shape) {
  shape_nodes_.clear();
  for (int64_t level = 1; int32_t w : shape.widths) {
    level = std::min<int64_t>(level * std::max(w, 0), TreeShape::kMaxNodes);
    shape_nodes_.push_back(level);
  }
  for (Speculator* s : speculators) {
    auto session = s->StartSession();
    if (!session.ok()) {
      if (session.status().code() != StatusCode::kResourceExhausted) return session.status();
      spdlog::debug("speculator {} has no room for another sequence; this one goes without it",
                    s->name());
      continue;
    }
    sessions_.push_back(std::move(*session));
    speculators_.push_back(s);
    stats_.speculator_names.push_back(s->name());
    if (!key_.empty()) key_ += '|';
    key_ += s->name();
  }
  stats_.proposed_by.assign(sessions_.size(), 0);
  stats_.accepted_by.assign(sessions_.size(), 0);
  return Status::Ok();
}

void SpeculativeStep::BeginDraft(DraftContext ctx) {
  for (size_t s = 0; s < sessions_.size(); ++s) {
    ctx.speculator_index = static_cast<int32_t>(s);
    sessions_[s]->Begin(ctx);
  }
}

void SpeculativeStep::BeginTogether(std::span<SpeculativeStep* const> steps,
                                    std::span<const DraftContext> contexts) {
  size_t rounds = 0;
  for (size_t i = 0; i < steps.size() && i < contexts.size(); ++i)
    rounds = std::max(rounds, steps[i]->sessions_.size());
  for (size_t r = 0; r < rounds; ++r) {
    std::vector<Speculator*> order;  // the round's speculators, first seen first
    for (size_t i = 0; i < steps.size() && i < contexts.size(); ++i) {
      if (r >= steps[i]->sessions_.size()) continue;
      Speculator* sp = steps[i]->speculators_[r];
      if (std::find(order.begin(), order.end(), sp) == order.end()) order.push_back(sp);
    }
    for (Speculator* sp : order) {
      std::vector<DraftSession*> sessions;
      std::vector<DraftContext> ctxs;
      for (size_t i = 0; i < steps.size() && i < contexts.size(); ++i) {
        SpeculativeStep& st = *steps[i];
        if (r >= st.sessions_.size() || st.speculators_[r] != sp) continue;
        sessions.push_back(st.sessions_[r].get());
        DraftContext c = contexts[i];
        c.speculator_index = static_cast<int32_t>(r);
        ctxs.push_back(c);
      }
      sp->BeginBatch(sessions, ctxs);
    }
  }
}

void SpeculativeStep::DraftTogether(std::span<SpeculativeStep* const> steps,
                                    std::span<const DraftContext> contexts) {
  size_t rounds = 0;
  // Each sequence's tree as Plan will merge it, so that every draft gets the node budget Plan
  // would give it (SessionContext: what the earlier drafts left).
  std::vector<TokenTree> merged;
  for (size_t i = 0; i < steps.size() && i < contexts.size(); ++i) {
    SpeculativeStep& st = *steps[i];
    st.drafted_.assign(st.sessions_.size(), std::nullopt);
    st.drafted_budget_.assign(st.sessions_.size(), -1);
    st.drafted_tokens_ = contexts[i].tokens.size();
    st.drafted_depth_ = contexts[i].max_depth;
    st.drafted_nodes_ = contexts[i].max_nodes;
    st.drafted_dynamic_ = contexts[i].dynamic;
    st.drafted_seconds_ = 0;
    merged.emplace_back(contexts[i].tokens.back());
    rounds = std::max(rounds, st.sessions_.size());
  }
  // Rounds by session index keep each sequence's sessions in order; in a round, one call per
  // speculator for all sequences that have it at that index.
  std::vector<bool> stopped(steps.size(), false);
  for (size_t r = 0; r < rounds; ++r) {
    std::vector<Speculator*> order;  // the round's batching speculators, first seen first
    std::vector<DraftContext> ctx_of(steps.size());
    for (size_t i = 0; i < steps.size() && i < contexts.size(); ++i) {
      SpeculativeStep& st = *steps[i];
      if (stopped[i] || r >= st.sessions_.size()) continue;
      Speculator* sp = st.speculators_[r];
      bool fits = false;
      ctx_of[i] = st.SessionContext(contexts[i], r, merged[i], &fits);
      if (!sp->batches_proposals() || !fits) {
        // Plan proposes this one (or tells it to propose nothing); a sampling sequence's later
        // sessions must follow it there, so that its RNG draws keep their order. A greedy
        // one's go on: Plan checks that each later draft's budget came out as drafted here
        // (this tree is missing from `merged`), and proposes anew where it did not.
        if (!contexts[i].sampling->greedy()) stopped[i] = true;
        continue;
      }
      if (std::find(order.begin(), order.end(), sp) == order.end()) order.push_back(sp);
    }
    for (Speculator* sp : order) {
      std::vector<size_t> members;
      std::vector<DraftSession*> sessions;
      std::vector<DraftContext> ctxs;
      for (size_t i = 0; i < steps.size() && i < contexts.size(); ++i) {
        SpeculativeStep& st = *steps[i];
        if (stopped[i] || r >= st.sessions_.size() || st.speculators_[r] != sp) continue;
        bool fits = false;
        (void)st.SessionContext(contexts[i], r, merged[i], &fits);
        if (!fits) continue;
        members.push_back(i);
        sessions.push_back(st.sessions_[r].get());
        ctxs.push_back(ctx_of[i]);
      }
      const auto t0 = Clock::now();
      std::vector<StatusOr<TokenTree>> trees;
      Status s = Guarded("drafting", [&] {
        trees = sp->ProposeBatch(sessions, ctxs);
        return Status::Ok();
      });
      const double share = SecondsSince(t0) / static_cast<double>(members.size());
      for (size_t k = 0; k < members.size(); ++k) {
        const size_t i = members[k];
        SpeculativeStep& st = *steps[i];
        if (!s.ok()) st.drafted_[r] = s;
        else if (k < trees.size()) st.drafted_[r] = std::move(trees[k]);
        else st.drafted_[r] = InternalError("ProposeBatch returned too few trees");
        st.drafted_budget_[r] = ctx_of[i].max_nodes;
        st.drafted_seconds_ += share;
        // Merged as Plan will: a failed draft adds nothing (Plan skips or fails on it).
        if (st.drafted_[r]->ok() && !merged[i].Merge(TokenTree(**st.drafted_[r])).ok())
          stopped[i] = true;
      }
    }
  }
}

DraftContext SpeculativeStep::SessionContext(const DraftContext& ctx, size_t s,
                                             const TokenTree& merged, bool* fits) const {
  // The tree's nodes past the root: the step's budget, never more than the room a sequence is
  // admitted with (Sequence::MaxKvBlocks), however many drafts propose.
  const int32_t room = std::clamp<int32_t>(ctx.max_nodes, 0, TreeShape::kMaxNodes);
  const int32_t cap = std::max(std::min(ctx.max_depth, ctx.shape->depth()), 0);
  int64_t shape_bound = 0;  // nodes of the shape's expansion to the depth cap
  for (int32_t d = 0; d < cap && d < static_cast<int32_t>(shape_nodes_.size()); ++d)
    shape_bound += shape_nodes_[static_cast<size_t>(d)];
  DraftContext c = ctx;
  c.speculator_index = static_cast<int32_t>(s);
  // Each draft in turn gets what the earlier ones left of the room: all of it for a static
  // shape (which keeps its full expansion as long as the room allows), an even share of it for
  // a dynamic tree (so every draft proposes; what one leaves unused goes to the next). The
  // split is decided before the draft proposes (from the earlier drafts' trees, which do not
  // depend on its draws) and nothing is pruned afterwards, so every trial stays what it was
  // drawn as and sampled verification stays exact (spec/dynamic_tree.h).
  const int32_t left = room - (merged.size() - 1);
  const int32_t drafts_left = static_cast<int32_t>(sessions_.size() - s);
  c.max_nodes = ctx.dynamic ? (left + drafts_left - 1) / drafts_left : left;
  // A draft that does not keep to a budget (a remote SSM worker) is merged only where its
  // shape's whole expansion fits, which is known without looking at what it proposed.
  *fits = sessions_[s]->honors_node_budget() ? left > 0 : shape_bound <= left;
  return c;
}

StatusOr<int32_t> SpeculativeStep::Plan(int32_t root, const DraftContext* ctx, int32_t committed,
                                        ForwardBatch& batch, const RowRequest& rows) {
  // --- draft ---
  const auto d0 = Clock::now();
  tree_ = TokenTree(root);
  cap_ = ctx != nullptr && ctx->shape != nullptr
             ? std::max(std::min(ctx->max_depth, ctx->shape->depth()), 0)
             : 0;
  // The tree's nodes past the root: the step's budget, never more than the room a sequence is
  // admitted with (Sequence::MaxKvBlocks), however many drafts propose.
  const int32_t room =
      ctx != nullptr ? std::clamp<int32_t>(ctx->max_nodes, 0, TreeShape::kMaxNodes) : 0;
  dynamic_ = ctx != nullptr && ctx->dynamic;
  budget_ = cap_ > 0 ? room : 0;
  draft_steady_ = false;
  if (ctx != nullptr && cap_ > 0 && room > 0) {
    // Since the last drafted tree the context grew by its accepted tokens and one more, unless
    // steps without a tree came in between (or none was drafted: the drafts run the prompt).
    const auto n = static_cast<int64_t>(ctx->tokens.size());
    draft_steady_ = drafted_at_ >= 0 && n - drafted_at_ <= drafted_cap_ + 1;
    drafted_at_ = n;
    drafted_cap_ = cap_;
    DraftContext c = *ctx;
    // Trees DraftTogether drafted for this very context (else they are stale: propose anew).
    const bool batched = drafted_.size() == sessions_.size() &&
                         drafted_tokens_ == ctx->tokens.size() &&
                         drafted_depth_ == ctx->max_depth && drafted_nodes_ == ctx->max_nodes &&
                         drafted_dynamic_ == ctx->dynamic;
    for (size_t s = 0; s < sessions_.size(); ++s) {
      bool fits = false;
      c = SessionContext(*ctx, s, tree_, &fits);
      DraftSession& session = *sessions_[s];
      if (!fits) {
        DraftContext none = c;
        none.max_depth = 0;
        (void)session.Propose(none);
        continue;
      }
      const bool ready = batched && drafted_[s].has_value() && drafted_budget_[s] == c.max_nodes;
      StatusOr<TokenTree> t = ready ? std::move(*drafted_[s]) : session.Propose(c);
      if (!t.ok()) {
        // A draft out of room (its KV cache full) leaves this step's tree without it, like a
        // session it could not open; any other error fails the sequence.
        if (t.status().code() != StatusCode::kResourceExhausted) return t.status();
        spdlog::debug("speculator {} has no room for this step: {}", stats_.speculator_names[s],
                      t.status().ToString());
        continue;
      }
      SI_RETURN_IF_ERROR(tree_.Merge(std::move(*t)));
    }
  }
  if (tree_.size() - 1 > std::max(room, 0)) {
    return InternalError("the drafts proposed " + std::to_string(tree_.size() - 1) +
                         " nodes, more than the " + std::to_string(room) +
                         " this step has room for (a draft beyond its budget or tree shape)");
  }
  draft_seconds_ = SecondsSince(d0) + (drafted_.empty() ? 0.0 : drafted_seconds_);
  drafted_.clear();
  drafted_seconds_ = 0;
  stats_.draft_seconds += draft_seconds_;

  // --- the tree, laid out depth-first after the committed entries ---
  committed_ = committed;
  const int32_t size = tree_.size();
  tree_.DepthFirstLayout(&order_, &parents_);
  layout_of_.assign(static_cast<size_t>(size), 0);
  std::vector<int32_t> toks(static_cast<size_t>(size)), pos(static_cast<size_t>(size));
  for (int32_t i = 0; i < size; ++i) {
    const TreeNode& n = tree_.node(order_[i]);
    toks[i] = n.token;
    pos[i] = committed_ + n.depth;  // rotary position by depth, not layout
    layout_of_[order_[i]] = i;
  }
  mask_ = TreeMask::FromParents(parents_);
  SI_RETURN_IF_ERROR(kv_.Reserve(seq_, committed_ + size));
  const int32_t token_begin = batch.size();
  batch.AddSequence(seq_, toks, pos, committed_, size > 1 ? &mask_ : nullptr);
  // Rows in node order, which is what the verifier reads.
  const bool greedy = rows.tokens && rows.sampling->greedy();
  if (greedy || (rows.tokens && rows.draws && size == 1)) {
    const TokenDraw draw =
        greedy ? TokenDraw{} : TokenDraw::Of(*rows.sampling, rows.rng->Uniform());
    for (int32_t v = 0; v < size; ++v) batch.AddTokenRow(token_begin + layout_of_[v], draw);
  } else if (rows.tokens && rows.dists) {
    const TokenDraw settings = TokenDraw::Of(*rows.sampling, 0.0);
    for (int32_t v = 0; v < size; ++v) batch.AddDistRow(token_begin + layout_of_[v], settings);
  } else {
    for (int32_t v = 0; v < size; ++v) batch.logit_rows.push_back(token_begin + layout_of_[v]);
  }
  return size;
}

StatusOr<SpeculativeStep::Outcome> SpeculativeStep::Verify(const PassRows& rows, int32_t vocab,
                                                           const SamplingParams& sampling, Rng& rng,
                                                           ModelRunner& runner) {
  const auto c0 = Clock::now();
  const int32_t size = tree_.size();
  std::span<const float> logits = rows.logits;
  VerifyOutcome verified;
  if (!rows.argmax.empty()) {
    if (rows.argmax.size() < static_cast<size_t>(size))
      return InternalError("pass returned fewer argmax rows than the tree has nodes");
    if (sampling.greedy()) {
      verified = VerifyGreedy(tree_, rows.argmax);
    } else {
      // The root's draw (Plan): the LLM's token, nothing proposed to accept.
      if (size != 1) return InternalError("a sampled tree came back as argmax rows");
      verified.next_token = rows.argmax[0];
    }
  } else if (rows.dists != nullptr) {
    if (sampling.greedy()) return InternalError("a greedy tree came back as distribution rows");
    if (rows.dists->vocab() != vocab || rows.dist_first < 0 ||
        rows.dist_first + size > rows.dists->size())
      return InternalError("pass returned fewer distribution rows than the tree has nodes");
    verified = VerifyStochastic(tree_, *rows.dists, rows.dist_first, rng);
  } else {
    if (logits.size() < static_cast<size_t>(size) * vocab)
      return InternalError("pass returned fewer logits rows than the tree has nodes");
    logits = logits.first(static_cast<size_t>(size) * vocab);
    verified = specinfer::Verify(tree_, logits, vocab, sampling, rng);
  }

  // --- compact: keep the root's and the accepted path's entries; drop the rest ---
  const int32_t accepted = static_cast<int32_t>(verified.accepted.size());
  std::vector<int32_t> src, dst;
  for (int32_t i = 0; i < accepted; ++i) {
    src.push_back(committed_ + layout_of_[verified.accepted[i]]);
    dst.push_back(committed_ + 1 + i);
  }
  SI_RETURN_IF_ERROR(runner.MoveKv(kv_, seq_, src, dst));
  Outcome out;
  out.committed = committed_ + 1 + accepted;
  kv_.Truncate(seq_, out.committed);
  stats_.verify_seconds += SecondsSince(c0);
  Record(verified.accepted);

  // The accepted tokens, then the LLM's own. Token i was chosen from the logits of its parent:
  // the root for the first, the previous accepted node after that.
  auto row = [&](int32_t node) {
    if (logits.empty()) return logits;  // argmax or distribution rows
    return logits.subspan(static_cast<size_t>(node) * vocab, static_cast<size_t>(vocab));
  };
  int32_t parent = 0;  // node index
  for (int32_t v : verified.accepted) {
    out.tokens.push_back(Chosen{tree_.node(v).token, row(parent)});
    parent = v;
  }
  out.tokens.push_back(Chosen{verified.next_token, row(parent)});
  return out;
}

void SpeculativeStep::Record(std::span<const int32_t> accepted) {
  const int32_t size = tree_.size();
  stats_.tree_nodes += size - 1;
  stats_.accepted_tokens += static_cast<int64_t>(accepted.size());
  if (stats_.proposed_at_depth.size() < static_cast<size_t>(tree_.max_depth())) {
    stats_.proposed_at_depth.resize(tree_.max_depth(), 0);
    stats_.accepted_at_depth.resize(tree_.max_depth(), 0);
  }
  for (int32_t d = 0; d < tree_.max_depth(); ++d) ++stats_.proposed_at_depth[d];
  for (size_t d = 0; d < accepted.size(); ++d) ++stats_.accepted_at_depth[d];
  report_.cap = cap_;
  report_.dynamic = dynamic_;
  report_.budget = budget_;
  report_.nodes = size - 1;
  report_.probs = tree_.SortedProbs();
  report_.accepted = static_cast<int32_t>(accepted.size());
  report_.draft_seconds = draft_seconds_;
  report_.draft_steady = draft_steady_;
  report_.nodes_at_depth.assign(static_cast<size_t>(cap_), 0);
  for (int32_t v = 1; v < size; ++v) {
    const int32_t d = tree_.node(v).depth;
    if (d <= cap_) ++report_.nodes_at_depth[static_cast<size_t>(d - 1)];
  }
  if (dynamic_) {
    budget_acceptance_.Observe(budget_, report_.probs, report_.accepted,
                               SpecController::kSeqAlpha);
  } else {
    acceptance_.Observe(cap_, report_.nodes_at_depth, report_.accepted,
                        SpecController::kSeqAlpha);
  }
  const size_t num_spec = sessions_.size();
  for (int32_t v = 1; v < size; ++v)
    for (size_t s = 0; s < num_spec; ++s)
      if ((tree_.node(v).proposers >> s) & 1) ++stats_.proposed_by[s];
  for (int32_t v : accepted)
    for (size_t s = 0; s < num_spec; ++s)
      if ((tree_.node(v).proposers >> s) & 1) ++stats_.accepted_by[s];
}

}  // namespace specinfer
