#include "engine/sequence.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "spec/verifier.h"

namespace specinfer {

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

StatusOr<std::unique_ptr<SequenceRun>> SequenceRun::Start(GenerateRequest req,
                                                          TokenCallback on_token,
                                                          const ModelConfig& c,
                                                          KvCacheManager& kv,
                                                          uint64_t kv_epoch) {
  if (req.prompt_tokens.empty()) return InvalidArgumentError("empty prompt (BOS counts)");
  for (int32_t t : req.prompt_tokens)
    if (t < 0 || t >= c.vocab_size)
      return InvalidArgumentError("prompt token " + std::to_string(t) + " outside vocabulary");
  if (req.max_new_tokens < 0) return InvalidArgumentError("max_new_tokens must be >= 0");
  if (req.prefill_chunk <= 0) return InvalidArgumentError("prefill_chunk must be > 0");
  SI_RETURN_IF_ERROR(req.sampling.Validate());
  if (!req.speculators.empty()) {
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
  const SeqId seq = kv.AddSequence();
  std::unique_ptr<SequenceRun> run(new SequenceRun(std::move(req), std::move(on_token), c, kv, seq));
  run->kv_epoch_ = kv_epoch;
  for (Speculator* s : run->request_.speculators) {
    auto session = s->StartSession();
    if (!session.ok()) {
      if (session.status().code() != StatusCode::kResourceExhausted) return session.status();
      spdlog::debug("speculator {} has no room for another sequence; this one goes without it",
                    s->name());
      continue;
    }
    run->speculators_.push_back(s);
    run->sessions_.push_back(std::move(*session));
  }
  SpeculationStats& spec = run->result_.stats.spec;
  for (const Speculator* s : run->speculators_) spec.speculator_names.push_back(s->name());
  spec.proposed_by.assign(run->speculators_.size(), 0);
  spec.accepted_by.assign(run->speculators_.size(), 0);
  return run;
}

SequenceRun::SequenceRun(GenerateRequest request, TokenCallback on_token, const ModelConfig& c,
                         KvCacheManager& kv, SeqId seq)
    : request_(std::move(request)),
      on_token_(std::move(on_token)),
      config_(c),
      kv_(kv),
      seq_(seq),
      rng_(request_.sampling.seed) {
  const int32_t prompt_len = static_cast<int32_t>(request_.prompt_tokens.size());
  // The last generated token is never fed back, so the context bounds new tokens by
  // max_seq_len - prompt_len + 1.
  max_new_ = std::min(request_.max_new_tokens, c.max_seq_len - prompt_len + 1);
  prefill_end_ = prompt_len - 1;
  context_ = request_.prompt_tokens;
  max_kv_blocks_ = MaxKvBlocks(request_, c, kv.block_size());
  GenerateStats& stats = result_.stats;
  stats.prompt_tokens = prompt_len;
  stats.prefill_tokens = prefill_end_;
  if (prefill_end_ == 0) phase_ = Phase::kDecode;
  if (max_new_ == 0) phase_ = Phase::kDone;
}

SequenceRun::~SequenceRun() { kv_.RemoveSequence(seq_); }

int32_t SequenceRun::MaxKvBlocks(const GenerateRequest& req, const ModelConfig& c,
                                 int32_t block_size) {
  const int64_t prompt_len = static_cast<int64_t>(req.prompt_tokens.size());
  // Every position up to the prompt plus its new tokens (at most the context), plus a tree past
  // the committed entries: at most TreeShape::kMaxNodes nodes beyond them.
  const int64_t len = std::min<int64_t>(prompt_len + std::max(req.max_new_tokens, 0),
                                        c.max_seq_len) +
                      (req.speculators.empty() ? 1 : TreeShape::kMaxNodes);
  return static_cast<int32_t>((len + block_size - 1) / block_size);
}

Status SequenceRun::PlanPrefill(ForwardBatch& batch, int32_t max_tokens) {
  if (phase_ != Phase::kPrefill) return FailedPreconditionError("sequence is not prefilling");
  const int32_t count = std::min({max_tokens, request_.prefill_chunk, prefill_end_ - prefilled_});
  if (count <= 0) return InvalidArgumentError("prefill chunk must be positive");
  SI_RETURN_IF_ERROR(kv_.Reserve(seq_, prefilled_ + count));
  std::vector<int32_t> pos(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) pos[i] = prefilled_ + i;
  batch.AddSequence(seq_, std::span(request_.prompt_tokens).subspan(prefilled_, count), pos,
                    prefilled_, nullptr);
  prefilled_ += count;
  committed_ = prefilled_;
  ++result_.stats.forward_passes;
  if (prefilled_ == prefill_end_) phase_ = Phase::kDecode;
  return Status::Ok();
}

bool SequenceRun::DraftContextNow(DraftContext* ctx) {
  if (sessions_.empty()) return false;
  // No deeper than the tokens still wanted (the pass adds one of its own) and the context.
  const int32_t max_depth =
      std::min(max_new_ - static_cast<int32_t>(result_.tokens.size()) - 1,
               config_.max_seq_len - 1 - committed_);
  if (max_depth <= 0) return false;
  ctx->tokens = context_;
  ctx->shape = &request_.tree_shape;
  ctx->max_depth = max_depth;
  ctx->sampling = &request_.sampling;
  ctx->rng = &rng_;
  return true;
}

void SequenceRun::BeginDraft() {
  if (phase_ != Phase::kDecode) return;
  DraftContext ctx;
  if (!DraftContextNow(&ctx)) return;
  for (size_t s = 0; s < sessions_.size(); ++s) {
    ctx.speculator_index = static_cast<int32_t>(s);
    sessions_[s]->Begin(ctx);
  }
}

StatusOr<int32_t> SequenceRun::PlanDecode(ForwardBatch& batch) {
  if (phase_ != Phase::kDecode) return FailedPreconditionError("sequence is not decoding");
  if (!decode_started_) {
    decode_started_ = true;
    decode_start_ = Clock::now();
  }
  GenerateResult& r = result_;
  // --- draft ---
  const auto d0 = Clock::now();
  tree_ = TokenTree(context_.back());
  if (DraftContext ctx; DraftContextNow(&ctx)) {
    for (size_t s = 0; s < sessions_.size(); ++s) {
      ctx.speculator_index = static_cast<int32_t>(s);
      SI_ASSIGN_OR_RETURN(TokenTree t, sessions_[s]->Propose(ctx));
      SI_RETURN_IF_ERROR(tree_.Merge(std::move(t)));
    }
  }
  r.stats.spec.draft_seconds += Seconds(d0, Clock::now());

  // --- the tree, laid out depth-first after the committed entries ---
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
  logit_begin_ = static_cast<int32_t>(batch.logit_rows.size());
  for (int32_t v = 0; v < size; ++v) batch.logit_rows.push_back(token_begin + layout_of_[v]);
  ++r.stats.forward_passes;
  ++r.stats.decode_passes;
  return size;
}

Status SequenceRun::Commit(std::span<const float> all_logits, ModelRunner& runner) {
  if (phase_ != Phase::kDecode) return FailedPreconditionError("sequence is not decoding");
  const auto c0 = Clock::now();
  const int32_t vocab = config_.vocab_size;
  const int32_t size = tree_.size();
  const size_t begin = static_cast<size_t>(logit_begin_) * vocab;
  if (all_logits.size() < begin + static_cast<size_t>(size) * vocab)
    return InternalError("pass returned fewer logits rows than the tree has nodes");
  const std::span<const float> logits = all_logits.subspan(begin, static_cast<size_t>(size) * vocab);
  const VerifyOutcome outcome = Verify(tree_, logits, vocab, request_.sampling, rng_);

  // Keep the root's and the accepted path's entries, compacted; drop the rest.
  const int32_t accepted = static_cast<int32_t>(outcome.accepted.size());
  std::vector<int32_t> src, dst;
  for (int32_t i = 0; i < accepted; ++i) {
    src.push_back(committed_ + layout_of_[outcome.accepted[i]]);
    dst.push_back(committed_ + 1 + i);
  }
  SI_RETURN_IF_ERROR(runner.MoveKv(kv_, seq_, src, dst));
  committed_ += 1 + accepted;
  kv_.Truncate(seq_, committed_);

  // --- statistics ---
  SpeculationStats& spec = result_.stats.spec;
  spec.verify_seconds += Seconds(c0, Clock::now());
  spec.tree_nodes += size - 1;
  spec.accepted_tokens += accepted;
  if (spec.proposed_at_depth.size() < static_cast<size_t>(tree_.max_depth())) {
    spec.proposed_at_depth.resize(tree_.max_depth(), 0);
    spec.accepted_at_depth.resize(tree_.max_depth(), 0);
  }
  for (int32_t d = 0; d < tree_.max_depth(); ++d) ++spec.proposed_at_depth[d];
  for (int32_t d = 0; d < accepted; ++d) ++spec.accepted_at_depth[d];
  const size_t num_spec = speculators_.size();
  for (int32_t v = 1; v < size; ++v)
    for (size_t s = 0; s < num_spec; ++s)
      if ((tree_.node(v).proposers >> s) & 1) ++spec.proposed_by[s];
  for (int32_t v : outcome.accepted)
    for (size_t s = 0; s < num_spec; ++s)
      if ((tree_.node(v).proposers >> s) & 1) ++spec.accepted_by[s];

  // --- emit the accepted tokens, then the LLM's own. Token i was chosen from the logits of its
  // parent: the root for the first, the previous accepted node after that. ---
  int32_t parent = 0;  // node index
  auto row = [&](int32_t node) {
    return logits.subspan(static_cast<size_t>(node) * vocab, static_cast<size_t>(vocab));
  };
  std::vector<std::pair<int32_t, int32_t>> emitted;  // (token, node whose logits chose it)
  for (int32_t v : outcome.accepted) {
    emitted.emplace_back(tree_.node(v).token, parent);
    parent = v;
  }
  emitted.emplace_back(outcome.next_token, parent);
  for (const auto& [next, from] : emitted) {
    result_.tokens.push_back(next);
    context_.push_back(next);
    if (on_token_ && !on_token_(next, row(from))) {
      Finish(FinishReason::kCancelled);
    } else if (std::find(request_.stop_tokens.begin(), request_.stop_tokens.end(), next) !=
               request_.stop_tokens.end()) {
      Finish(FinishReason::kStop);
    } else if (static_cast<int32_t>(result_.tokens.size()) == max_new_) {
      Finish(FinishReason::kLength);
    }
    if (phase_ == Phase::kDone) break;
  }
  return Status::Ok();
}

Status SequenceRun::CheckKvEpoch(uint64_t current) {
  if (current == kv_epoch_) return Status::Ok();
  if (kv_.Length(seq_) == 0) {  // nothing written yet: nothing lost
    kv_epoch_ = current;
    return Status::Ok();
  }
  return DataLossError("KV lost: the LLM's KV entries of this sequence are gone (an LLM worker "
                       "restarted or its group failed); the request must start over");
}

void SequenceRun::Finish(FinishReason reason) {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  result_.finish_reason = reason;
  GenerateStats& stats = result_.stats;
  stats.generated_tokens = static_cast<int32_t>(result_.tokens.size());
  if (decode_started_) stats.decode_seconds = Seconds(decode_start_, Clock::now());
}

void SequenceRun::AddPassSeconds(double seconds) {
  if (!decode_started_) result_.stats.prefill_seconds += seconds;
  else result_.stats.spec.verify_seconds += seconds;
}

}  // namespace specinfer
