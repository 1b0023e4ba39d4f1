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
  const int64_t shape_nodes = shape.MaxNodes();
  shape_nodes_.clear();
  for (int64_t level = 1; int32_t w : shape.widths) {
    level = std::min<int64_t>(level * std::max(w, 0), TreeShape::kMaxNodes);
    shape_nodes_.push_back(level);
  }
  const int64_t per_tree = std::max<int64_t>(shape_nodes, 1);
  const size_t fit = static_cast<size_t>(std::max<int64_t>(TreeShape::kMaxNodes / per_tree, 1));
  for (Speculator* s : speculators) {
    if (sessions_.size() == fit) {
      spdlog::debug("speculator {} left out: {} trees of {} nodes fill the {} a sequence has room "
                    "for", s->name(), fit, shape_nodes, TreeShape::kMaxNodes);
      continue;
    }
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
  for (size_t i = 0; i < steps.size() && i < contexts.size(); ++i) {
    SpeculativeStep& st = *steps[i];
    st.drafted_.assign(st.sessions_.size(), std::nullopt);
    st.drafted_tokens_ = contexts[i].tokens.size();
    st.drafted_depth_ = contexts[i].max_depth;
    st.drafted_seconds_ = 0;
    rounds = std::max(rounds, st.sessions_.size());
  }
  // Rounds by session index keep each sequence's sessions in order; in a round, one call per
  // speculator for all sequences that have it at that index.
  std::vector<bool> stopped(steps.size(), false);
  for (size_t r = 0; r < rounds; ++r) {
    std::vector<Speculator*> order;  // the round's batching speculators, first seen first
    for (size_t i = 0; i < steps.size() && i < contexts.size(); ++i) {
      SpeculativeStep& st = *steps[i];
      if (stopped[i] || r >= st.sessions_.size()) continue;
      Speculator* sp = st.speculators_[r];
      if (!sp->batches_proposals()) {
        // Plan proposes this one; a sampling sequence's later sessions must follow it there,
        // so that its RNG draws keep their order.
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
        members.push_back(i);
        sessions.push_back(st.sessions_[r].get());
        DraftContext c = contexts[i];
        c.speculator_index = static_cast<int32_t>(r);
        ctxs.push_back(c);
      }
      const auto t0 = Clock::now();
      std::vector<StatusOr<TokenTree>> trees;
      Status s = Guarded("drafting", [&] {
        trees = sp->ProposeBatch(sessions, ctxs);
        return Status::Ok();
      });
      const double share = SecondsSince(t0) / static_cast<double>(members.size());
      for (size_t k = 0; k < members.size(); ++k) {
        SpeculativeStep& st = *steps[members[k]];
        if (!s.ok()) st.drafted_[r] = s;
        else if (k < trees.size()) st.drafted_[r] = std::move(trees[k]);
        else st.drafted_[r] = InternalError("ProposeBatch returned too few trees");
        st.drafted_seconds_ += share;
      }
    }
  }
}

StatusOr<int32_t> SpeculativeStep::Plan(int32_t root, const DraftContext* ctx, int32_t committed,
                                        ForwardBatch& batch) {
  // --- draft ---
  const auto d0 = Clock::now();
  tree_ = TokenTree(root);
  cap_ = ctx != nullptr && ctx->shape != nullptr
             ? std::max(std::min(ctx->max_depth, ctx->shape->depth()), 0)
             : 0;
  if (ctx != nullptr && cap_ > 0) {
    DraftContext c = *ctx;
    // Trees DraftTogether drafted for this very context (else they are stale: propose anew).
    const bool batched = drafted_.size() == sessions_.size() &&
                         drafted_tokens_ == ctx->tokens.size() && drafted_depth_ == ctx->max_depth;
    for (size_t s = 0; s < sessions_.size(); ++s) {
      c.speculator_index = static_cast<int32_t>(s);
      StatusOr<TokenTree> t = batched && drafted_[s].has_value()
                                  ? std::move(*drafted_[s])
                                  : sessions_[s]->Propose(c);
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
  if (tree_.size() - 1 > TreeShape::kMaxNodes) {
    return InternalError("the drafts proposed " + std::to_string(tree_.size() - 1) +
                         " nodes, more than the " + std::to_string(TreeShape::kMaxNodes) +
                         " a sequence has room for (a draft beyond its tree shape)");
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
  // Logits in node order, which is what the verifier reads.
  for (int32_t v = 0; v < size; ++v) batch.logit_rows.push_back(token_begin + layout_of_[v]);
  return size;
}

StatusOr<SpeculativeStep::Outcome> SpeculativeStep::Verify(std::span<const float> logits,
                                                           int32_t vocab,
                                                           const SamplingParams& sampling,
                                                           Rng& rng, ModelRunner& runner) {
  const auto c0 = Clock::now();
  const int32_t size = tree_.size();
  if (logits.size() < static_cast<size_t>(size) * vocab)
    return InternalError("pass returned fewer logits rows than the tree has nodes");
  logits = logits.first(static_cast<size_t>(size) * vocab);
  const VerifyOutcome verified = specinfer::Verify(tree_, logits, vocab, sampling, rng);

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
  report_.accepted = static_cast<int32_t>(accepted.size());
  report_.draft_seconds = draft_seconds_;
  report_.nodes_at_depth.assign(static_cast<size_t>(cap_), 0);
  for (int32_t v = 1; v < size; ++v) {
    const int32_t d = tree_.node(v).depth;
    if (d <= cap_) ++report_.nodes_at_depth[static_cast<size_t>(d - 1)];
  }
  acceptance_.Observe(cap_, report_.nodes_at_depth, report_.accepted, SpecController::kSeqAlpha);
  const size_t num_spec = sessions_.size();
  for (int32_t v = 1; v < size; ++v)
    for (size_t s = 0; s < num_spec; ++s)
      if ((tree_.node(v).proposers >> s) & 1) ++stats_.proposed_by[s];
  for (int32_t v : accepted)
    for (size_t s = 0; s < num_spec; ++s)
      if ((tree_.node(v).proposers >> s) & 1) ++stats_.accepted_by[s];
}

}  // namespace specinfer
