#include "engine/generator.h"

#include <algorithm>

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
  result.stats.prompt_tokens = prompt_len;
  const SeqId seq = kv_.AddSequence();
  SequenceGuard guard{kv_, seq};
  Rng rng(req.sampling.seed);
  std::vector<float> logits(c.vocab_size), probs;
  ForwardBatch batch;

  // Prefill in chunks; logits only for the last prompt token.
  auto t0 = Clock::now();
  for (int32_t begin = 0; begin < prompt_len; begin += req.prefill_chunk) {
    const int32_t count = std::min(req.prefill_chunk, prompt_len - begin);
    SI_RETURN_IF_ERROR(kv_.Reserve(seq, begin + count));
    batch = ForwardBatch();
    std::vector<int32_t> pos(count);
    for (int32_t i = 0; i < count; ++i) pos[i] = begin + i;
    batch.AddSequence(seq, std::span(req.prompt_tokens).subspan(begin, count), pos, begin,
                      nullptr);
    if (begin + count == prompt_len) batch.logit_rows = {count - 1};
    batch.batch_invariant = false;  // prompt tokens only: BLAS may block the sums
    SI_RETURN_IF_ERROR(runner_.Forward(batch, kv_, logits));
    ++result.stats.forward_passes;
  }
  auto t1 = Clock::now();
  result.stats.prefill_seconds = Seconds(t0, t1);

  int32_t pos = prompt_len;
  while (static_cast<int32_t>(result.tokens.size()) < max_new) {
    const int32_t next = SampleToken(logits, req.sampling, rng, probs);
    result.tokens.push_back(next);
    if (on_token && !on_token(next)) {
      result.finish_reason = FinishReason::kCancelled;
      break;
    }
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), next) != req.stop_tokens.end()) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (static_cast<int32_t>(result.tokens.size()) == max_new) break;
    SI_RETURN_IF_ERROR(kv_.Reserve(seq, pos + 1));
    batch = ForwardBatch();
    batch.AddSequence(seq, std::span(&next, 1), std::span(&pos, 1), pos, nullptr);
    batch.logit_rows = {0};
    SI_RETURN_IF_ERROR(runner_.Forward(batch, kv_, logits));
    ++result.stats.forward_passes;
    ++result.stats.decode_passes;
    ++pos;
  }
  result.stats.generated_tokens = static_cast<int32_t>(result.tokens.size());
  result.stats.decode_seconds = Seconds(t1, Clock::now());
  return result;
}

}  // namespace specinfer
