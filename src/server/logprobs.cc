#include "server/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace specinfer {

TokenLogprob LogprobsFromLogits(std::span<const float> logits, int32_t token, int32_t top_n) {
  // log_softmax in double: logsumexp around the maximum.
  double max = -std::numeric_limits<double>::infinity();
  for (float x : logits) max = std::max<double>(max, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double lse = max + std::log(sum);
  auto lp = [&](int32_t id) { return static_cast<float>(logits[id] - lse); };

  TokenLogprob out;
  out.token = token;
  out.logprob = token >= 0 && token < static_cast<int32_t>(logits.size())
                    ? lp(token)
                    : -std::numeric_limits<float>::infinity();
  const int32_t n = std::clamp<int32_t>(top_n, 0, static_cast<int32_t>(logits.size()));
  if (n > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    out.top.reserve(n);
    for (int32_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], lp(ids[i]));
  }
  return out;
}

namespace {
// Removes the scoring sequence however TeacherForcedLogprobs returns.
struct SequenceGuard {
  KvCacheManager& kv;
  SeqId seq;
  ~SequenceGuard() { kv.RemoveSequence(seq); }
};
}  // namespace

StatusOr<std::vector<TokenLogprob>> TeacherForcedLogprobs(ModelRunner& runner, KvCacheManager& kv,
                                                          std::span<const int32_t> prompt,
                                                          std::span<const int32_t> generated,
                                                          int32_t top_n, int32_t prefill_chunk) {
  std::vector<TokenLogprob> out;
  if (generated.empty()) return out;
  if (prompt.empty()) return InvalidArgumentError("empty prompt");
  if (prefill_chunk <= 0) return InvalidArgumentError("prefill_chunk must be > 0");
  const int32_t vocab = runner.model().config().vocab_size;
  const int32_t prompt_len = static_cast<int32_t>(prompt.size());
  const int32_t gen_len = static_cast<int32_t>(generated.size());
  const SeqId seq = kv.AddSequence();
  SequenceGuard guard{kv, seq};
  std::vector<float> logits;
  ForwardBatch batch;
  out.reserve(gen_len);

  // The prompt but its last token, prefilled in the generator's chunks (no logits).
  const int32_t prefill = prompt_len - 1;
  for (int32_t begin = 0; begin < prefill; begin += prefill_chunk) {
    const int32_t count = std::min(prefill_chunk, prefill - begin);
    SI_RETURN_IF_ERROR(kv.Reserve(seq, begin + count));
    batch = ForwardBatch();
    std::vector<int32_t> pos(count);
    std::iota(pos.begin(), pos.end(), begin);
    batch.AddSequence(seq, prompt.subspan(begin, count), pos, begin, nullptr);
    batch.batch_invariant = false;
    SI_RETURN_IF_ERROR(runner.Forward(batch, kv, logits));
  }

  // Then the last prompt token and generated[0 .. gen_len-2] in causal chunks through the
  // batch-invariant kernels: input i (position prefill + i) yields the logits that chose
  // generated[i].
  std::vector<int32_t> inputs;
  inputs.reserve(gen_len);
  inputs.push_back(prompt.back());
  inputs.insert(inputs.end(), generated.begin(), generated.end() - 1);
  constexpr int32_t kRowsPerPass = 32;  // bounds the logits buffer ([rows, vocab] floats)
  for (int32_t begin = 0; begin < gen_len; begin += kRowsPerPass) {
    const int32_t count = std::min(kRowsPerPass, gen_len - begin);
    const int32_t pos0 = prefill + begin;
    SI_RETURN_IF_ERROR(kv.Reserve(seq, pos0 + count));
    batch = ForwardBatch();
    std::vector<int32_t> pos(count);
    std::iota(pos.begin(), pos.end(), pos0);
    batch.AddSequence(seq, std::span<const int32_t>(inputs).subspan(begin, count), pos, pos0,
                      nullptr);
    batch.logit_rows.resize(count);
    std::iota(batch.logit_rows.begin(), batch.logit_rows.end(), 0);
    batch.batch_invariant = true;
    logits.assign(static_cast<size_t>(count) * vocab, 0.0f);
    SI_RETURN_IF_ERROR(runner.Forward(batch, kv, logits));
    for (int32_t r = 0; r < count; ++r) {
      out.push_back(LogprobsFromLogits(
          std::span<const float>(logits).subspan(static_cast<size_t>(r) * vocab, vocab),
          generated[begin + r], top_n));
    }
  }
  return out;
}

}  // namespace specinfer
