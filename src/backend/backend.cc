#include "backend/backend.h"

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
  return Status::Ok();
}

}  // namespace specinfer
