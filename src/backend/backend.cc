#include "backend/backend.h"

#include <algorithm>

#include "sampling/sampler.h"

namespace specinfer {

TreeMask TreeMask::Empty(int32_t rows, int32_t cols) {
  TreeMask m;
  m.num_tokens = rows;
  m.num_cols = cols;
  m.words_per_row = (cols + 63) / 64;
  m.bits.assign(static_cast<size_t>(rows) * m.words_per_row, 0);
  return m;
}

TreeMask TreeMask::Causal(int32_t n) {
  TreeMask m = Empty(n, n);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t j = 0; j <= i; ++j) m.Set(i, j);
  return m;
}

TreeMask TreeMask::FromParents(std::span<const int32_t> parents) {
  const int32_t n = static_cast<int32_t>(parents.size());
  TreeMask m = Empty(n, n);
  for (int32_t i = 0; i < n; ++i) {
    m.Set(i, i);
    int32_t p = parents[i];
    if (p >= 0) {  // a node sees what its parent sees, plus itself
      for (int32_t w = 0; w < m.words_per_row; ++w)
        m.bits[static_cast<size_t>(i) * m.words_per_row + w] |=
            m.bits[static_cast<size_t>(p) * m.words_per_row + w];
    }
  }
  return m;
}

void ForwardBatch::AddSequence(SeqId seq, std::span<const int32_t> toks,
                               std::span<const int32_t> pos, int32_t kv_prefix,
                               const TreeMask* mask, int32_t masked_kv) {
  BatchSequence s;
  s.masked_kv = masked_kv;
  s.seq = seq;
  s.token_begin = size();
  s.token_count = static_cast<int32_t>(toks.size());
  s.kv_prefix = kv_prefix;
  s.mask = mask;
  tokens.insert(tokens.end(), toks.begin(), toks.end());
  positions.insert(positions.end(), pos.begin(), pos.end());
  seqs.push_back(s);
}

TokenDraw TokenDraw::Of(const SamplingParams& params, double u) {
  return TokenDraw{params.temperature, params.top_k, params.top_p, u};
}

SamplingParams TokenDraw::params() const {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

void ForwardBatch::AddTokenRow(int32_t row, const TokenDraw& draw) {
  if (!draw.greedy() || !draws.empty()) {
    draws.resize(argmax_rows.size());  // the argmax rows before it, if it is the first draw
    draws.push_back(draw);
  }
  argmax_rows.push_back(row);
}

bool ForwardBatch::has_draws() const {
  return std::any_of(draws.begin(), draws.end(), [](const TokenDraw& d) { return !d.greedy(); });
}

void ForwardBatch::AddDistRow(int32_t row, const TokenDraw& settings) {
  dist_rows.push_back(row);
  dist_settings.push_back(settings);
}

Status ForwardBatch::Validate(int32_t vocab_size) const {
  if (positions.size() != tokens.size())
    return InvalidArgumentError("batch: positions and tokens differ in length");
  int32_t expect = 0;
  for (const BatchSequence& s : seqs) {
    if (s.token_begin != expect || s.token_count <= 0 || s.kv_prefix < 0 || s.masked_kv < 0)
      return InvalidArgumentError("batch: sequences are not contiguous and non-empty");
    if (s.masked_kv > 0 && s.mask == nullptr)
      return InvalidArgumentError("batch: masked KV entries need a mask");
    if (s.mask && (s.mask->num_tokens != s.token_count ||
                   s.mask->num_cols != s.masked_kv + s.token_count ||
                   s.mask->bits.size() !=
                       static_cast<size_t>(s.token_count) * s.mask->words_per_row))
      return InvalidArgumentError("batch: mask size does not match the sequence's tokens");
    expect += s.token_count;
  }
  if (expect != size()) return InvalidArgumentError("batch: tokens not covered by sequences");
  for (int32_t t : tokens)
    if (t < 0 || t >= vocab_size)
      return InvalidArgumentError("batch: token id " + std::to_string(t) + " outside vocabulary");
  for (int32_t p : positions)
    if (p < 0) return InvalidArgumentError("batch: negative position");
  for (int32_t r : logit_rows)
    if (r < 0 || r >= size()) return InvalidArgumentError("batch: logit row out of range");
  for (int32_t r : argmax_rows)
    if (r < 0 || r >= size()) return InvalidArgumentError("batch: argmax row out of range");
  if (!draws.empty() && draws.size() != argmax_rows.size())
    return InvalidArgumentError("batch: draws and argmax rows differ in number");
  for (const TokenDraw& d : draws) {
    SI_RETURN_IF_ERROR(d.params().Validate().WithContext("batch: draw"));
    if (!(d.u >= 0.0 && d.u < 1.0))
      return InvalidArgumentError("batch: a draw's uniform must be in [0, 1)");
  }
  for (int32_t r : dist_rows)
    if (r < 0 || r >= size()) return InvalidArgumentError("batch: distribution row out of range");
  if (dist_settings.size() != dist_rows.size())
    return InvalidArgumentError("batch: distribution rows and their settings differ in number");
  for (const TokenDraw& d : dist_settings)
    SI_RETURN_IF_ERROR(d.params().Validate().WithContext("batch: distribution row"));
  return Status::Ok();
}

Status ForwardArgmaxOnHost(
    const ForwardBatch& batch, int32_t col0, int32_t cols, std::vector<float>& scratch,
    std::span<float> logits, std::span<ArgmaxShare> argmax,
    const std::function<Status(const ForwardBatch&, std::span<float>)>& forward) {
  const size_t m = batch.logit_rows.size(), a = batch.argmax_rows.size();
  const size_t d = batch.dist_rows.size();
  const auto width = static_cast<size_t>(cols);
  if (logits.size() < m * width) return InvalidArgumentError("logits buffer too small");
  if (argmax.size() < a) return InvalidArgumentError("argmax buffer too small");
  if (a == 0 && d == 0) return forward(batch, logits);
  ForwardBatch all = batch;  // the masks it points to stay the caller's
  all.logit_rows.insert(all.logit_rows.end(), batch.argmax_rows.begin(), batch.argmax_rows.end());
  all.logit_rows.insert(all.logit_rows.end(), batch.dist_rows.begin(), batch.dist_rows.end());
  all.argmax_rows.clear();
  all.draws.clear();
  all.dist_rows.clear();
  all.dist_settings.clear();
  scratch.resize((m + a + d) * width);
  SI_RETURN_IF_ERROR(forward(all, scratch));
  std::copy_n(scratch.begin(), m * width, logits.begin());
  for (size_t i = 0; i < a; ++i) {
    const std::span<const float> row(scratch.data() + (m + i) * width, width);
    const int32_t best = Argmax(row);
    argmax[i] = ArgmaxShare{row[static_cast<size_t>(best)], col0 + best};
  }
  return Status::Ok();
}

Status ModelRunner::ForwardArgmax(const ForwardBatch& batch, const KvCacheManager& kv,
                                  std::span<float> logits, std::span<int32_t> argmax,
                                  DistRows* dists) {
  const int32_t vocab = model().config().vocab_size;
  if (argmax.size() < batch.argmax_rows.size())
    return InvalidArgumentError("argmax buffer too small");
  if (!batch.dist_rows.empty() && dists == nullptr)
    return InvalidArgumentError("a batch with distribution rows needs a DistRows to fill");
  // The pass below sees the argmax and distribution rows as logits rows, without the draws and
  // settings: check those here.
  SI_RETURN_IF_ERROR(batch.Validate(vocab));
  const size_t a = batch.argmax_rows.size();
  argmax_shares_.resize(a);
  SI_RETURN_IF_ERROR(ForwardArgmaxOnHost(
      batch, 0, vocab, argmax_scratch_, logits, argmax_shares_,
      [&](const ForwardBatch& b, std::span<float> out) { return Forward(b, kv, out); }));
  for (size_t i = 0; i < a; ++i) argmax[i] = argmax_shares_[i].id;
  if (dists != nullptr) {
    dists->Reset(vocab);
    const size_t first = batch.logit_rows.size() + a;
    for (size_t i = 0; i < batch.dist_rows.size(); ++i) {
      const std::span<const float> row(argmax_scratch_.data() + (first + i) * vocab,
                                       static_cast<size_t>(vocab));
      ComputeProbs(row, batch.dist_settings[i].params(), draw_probs_);
      dists->AddDense(draw_probs_);
    }
  }
  // Sampled draws, from the argmax rows' logits ForwardArgmaxOnHost left after the logits rows.
  const size_t m = batch.logit_rows.size();
  for (size_t i = 0; i < batch.draws.size(); ++i) {
    const TokenDraw& d = batch.draws[i];
    if (d.greedy()) continue;
    const std::span<const float> row(argmax_scratch_.data() + (m + i) * vocab,
                                     static_cast<size_t>(vocab));
    ComputeProbs(row, d.params(), draw_probs_);
    argmax[i] = SampleFromProbs(draw_probs_, d.u);
  }
  return Status::Ok();
}

}  // namespace specinfer
