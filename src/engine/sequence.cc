#include "engine/sequence.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace specinfer {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

StatusOr<std::unique_ptr<Sequence>> Sequence::Start(GenerateRequest req, TokenCallback on_token,
                                                    const ModelConfig& c, KvCacheManager& kv,
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
  std::unique_ptr<Sequence> run(new Sequence(std::move(req), std::move(on_token), c, kv, seq));
  run->kv_epoch_ = kv_epoch;
  SI_RETURN_IF_ERROR(run->step_.OpenSessions(run->request_.speculators, run->request_.tree_shape));
  if (run->phase_ == Phase::kPrefill) {
    // KV entries of the prompt's cached prefix were computed from the same tokens by
    // batch-invariant kernels: bit-identical to what prefill would write.
    const int32_t cached = kv.AttachCachedPrefix(seq, run->request_.prompt_tokens,
                                                 run->prefill_end_);
    run->prefilled_ = run->committed_ = cached;
    run->result_.stats.cached_prompt_tokens = cached;
    run->result_.stats.prefill_tokens -= cached;
    if (cached == run->prefill_end_) run->phase_ = Phase::kDecode;
  }
  return run;
}

Sequence::Sequence(GenerateRequest request, TokenCallback on_token, const ModelConfig& c,
                   KvCacheManager& kv, SeqId seq)
    : request_(std::move(request)),
      on_token_(std::move(on_token)),
      config_(c),
      kv_(kv),
      seq_(seq),
      rng_(request_.sampling.seed),
      step_(kv, seq, result_.stats.spec) {
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

Sequence::~Sequence() { kv_.RemoveSequence(seq_); }

int32_t Sequence::MaxKvBlocks(const GenerateRequest& req, const ModelConfig& c,
                              int32_t block_size) {
  const int64_t prompt_len = static_cast<int64_t>(req.prompt_tokens.size());
  // Every position up to the prompt plus its new tokens (at most the context), plus a tree past
  // the committed entries: at most TreeShape::kMaxNodes nodes beyond them.
  const int64_t len = std::min<int64_t>(prompt_len + std::max(req.max_new_tokens, 0),
                                        c.max_seq_len) +
                      (req.speculators.empty() ? 1 : TreeShape::kMaxNodes);
  return static_cast<int32_t>((len + block_size - 1) / block_size);
}

Status Sequence::PlanPrefill(ForwardBatch& batch, int32_t max_tokens) {
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

int32_t Sequence::max_spec_depth() const {
  if (phase_ != Phase::kDecode || !step_.has_sessions()) return 0;
  // No deeper than the tokens still wanted (the pass adds one of its own) and the context.
  const int32_t max_depth =
      std::min({max_new_ - static_cast<int32_t>(result_.tokens.size()) - 1,
                config_.max_seq_len - 1 - committed_, request_.tree_shape.depth()});
  return std::max(max_depth, 0);
}

bool Sequence::DraftContextNow(int32_t depth_cap, int32_t dynamic_nodes, DraftContext* ctx) {
  const int32_t max_depth = std::min(max_spec_depth(), depth_cap);
  if (max_depth <= 0 || dynamic_nodes == 0) return false;
  ctx->dynamic = dynamic_nodes > 0;
  ctx->max_nodes = ctx->dynamic ? std::min<int32_t>(dynamic_nodes, TreeShape::kMaxNodes)
                                : static_cast<int32_t>(TreeShape::kMaxNodes);
  ctx->tokens = context_;
  ctx->shape = &request_.tree_shape;
  ctx->max_depth = max_depth;
  ctx->sampling = &request_.sampling;
  ctx->rng = &rng_;
  return true;
}

void Sequence::BeginDraft(int32_t depth_cap, int32_t dynamic_nodes) {
  if (phase_ != Phase::kDecode) return;
  if (DraftContext ctx; DraftContextNow(depth_cap, dynamic_nodes, &ctx)) step_.BeginDraft(ctx);
}

void Sequence::DraftContexts(std::span<Sequence* const> seqs, std::span<const DraftCap> caps,
                             std::vector<SpeculativeStep*>* steps,
                             std::vector<DraftContext>* contexts) {
  for (size_t i = 0; i < seqs.size() && i < caps.size(); ++i) {
    Sequence& q = *seqs[i];
    DraftContext ctx;
    if (q.phase_ != Phase::kDecode || !q.DraftContextNow(caps[i].first, caps[i].second, &ctx))
      continue;
    steps->push_back(&q.step_);
    contexts->push_back(ctx);
  }
}

void Sequence::BeginTogether(std::span<Sequence* const> seqs, std::span<const DraftCap> caps) {
  std::vector<SpeculativeStep*> steps;
  std::vector<DraftContext> contexts;
  DraftContexts(seqs, caps, &steps, &contexts);
  if (!steps.empty()) SpeculativeStep::BeginTogether(steps, contexts);
}

void Sequence::DraftTogether(std::span<Sequence* const> seqs, std::span<const DraftCap> caps) {
  std::vector<SpeculativeStep*> steps;
  std::vector<DraftContext> contexts;
  DraftContexts(seqs, caps, &steps, &contexts);
  if (!steps.empty()) SpeculativeStep::DraftTogether(steps, contexts);
}

StatusOr<int32_t> Sequence::PlanDecode(ForwardBatch& batch, int32_t depth_cap,
                                       int32_t dynamic_nodes, const RowRequest& runner) {
  if (phase_ != Phase::kDecode) return FailedPreconditionError("sequence is not decoding");
  if (!decode_started_) {
    decode_started_ = true;
    decode_start_ = Clock::now();
  }
  DraftContext ctx;
  const bool drafting = DraftContextNow(depth_cap, dynamic_nodes, &ctx);
  RowRequest rows = runner;
  rows.tokens = token_rows();
  rows.sampling = &request_.sampling;
  rows.rng = &rng_;
  SI_ASSIGN_OR_RETURN(int32_t size, step_.Plan(context_.back(), drafting ? &ctx : nullptr,
                                               committed_, batch, rows));
  ++result_.stats.forward_passes;
  ++result_.stats.decode_passes;
  return size;
}

Status Sequence::Commit(const PassRows& rows, ModelRunner& runner) {
  if (phase_ != Phase::kDecode) return FailedPreconditionError("sequence is not decoding");
  SI_ASSIGN_OR_RETURN(SpeculativeStep::Outcome step,
                      step_.Verify(rows, config_.vocab_size, request_.sampling, rng_, runner));
  committed_ = step.committed;
  for (const SpeculativeStep::Chosen& c : step.tokens) {
    result_.tokens.push_back(c.token);
    context_.push_back(c.token);
    if (on_token_ && !on_token_(c.token, c.logits)) {
      Finish(FinishReason::kCancelled);
    } else if (std::find(request_.stop_tokens.begin(), request_.stop_tokens.end(), c.token) !=
               request_.stop_tokens.end()) {
      Finish(FinishReason::kStop);
    } else if (static_cast<int32_t>(result_.tokens.size()) == max_new_) {
      Finish(FinishReason::kLength);
    }
    if (phase_ == Phase::kDone) break;
  }
  return Status::Ok();
}

Status Sequence::CheckKvEpoch(uint64_t current) {
  if (current == kv_epoch_) return Status::Ok();
  if (kv_.Length(seq_) == 0) {  // nothing written yet: nothing lost
    kv_epoch_ = current;
    return Status::Ok();
  }
  return DataLossError("KV lost: the LLM's KV entries of this sequence are gone (an LLM worker "
                       "restarted or its group failed); the request must start over");
}

void Sequence::Finish(FinishReason reason) {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  result_.finish_reason = reason;
  GenerateStats& stats = result_.stats;
  stats.generated_tokens = static_cast<int32_t>(result_.tokens.size());
  if (decode_started_) stats.decode_seconds = SecondsSince(decode_start_);
}

void Sequence::CacheCommittedKv() {
  const auto n = std::min<size_t>(static_cast<size_t>(committed_), context_.size());
  kv_.CommitTokens(seq_, std::span<const int32_t>(context_).first(n));
}

void Sequence::AddPassSeconds(double seconds) {
  if (!decode_started_) result_.stats.prefill_seconds += seconds;
  else result_.stats.spec.verify_seconds += seconds;
}

}  // namespace specinfer
