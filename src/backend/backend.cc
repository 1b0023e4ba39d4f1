#include "backend/backend.h"

namespace specinfer {

TreeMask TreeMask::Causal(int32_t n) {
  TreeMask m;
  m.num_tokens = n;
  m.words_per_row = (n + 63) / 64;
  m.bits.assign(static_cast<size_t>(n) * m.words_per_row, 0);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t j = 0; j <= i; ++j) m.Set(i, j);
  return m;
}

TreeMask TreeMask::FromParents(std::span<const int32_t> parents) {
  TreeMask m;
  int32_t n = static_cast<int32_t>(parents.size());
  m.num_tokens = n;
  m.words_per_row = (n + 63) / 64;
  m.bits.assign(static_cast<size_t>(n) * m.words_per_row, 0);
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
                               const TreeMask* mask) {
  BatchSequence s;
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
    if (s.token_begin != expect || s.token_count <= 0 || s.kv_prefix < 0)
      return InvalidArgumentError("batch: sequences are not contiguous and non-empty");
    if (s.mask && (s.mask->num_tokens != s.token_count ||
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
