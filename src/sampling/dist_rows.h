// Rows of sampling distributions kept compact: what crosses from where the logits are (a GPU)
// for multi-step speculative sampling to read (spec/verifier.h).
//
// Thread safety: a value type; const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

// Sampling distributions as ModelRunner::ForwardArgmax brings back ForwardBatch::dist_rows
// (backend/backend.h), in order: row r is the distribution ComputeProbs (sampling/sampler.h)
// gives under its settings, kept sparse (the tokens of nonzero probability, ascending, and their
// probabilities) when at most vocab / kSparseDivisor tokens are left (top-k, top-p: usually a
// handful), dense (all vocab probabilities) otherwise, so a row never costs more than its logits.
class DistRows {
 public:
  static constexpr int64_t kSparseDivisor = 8;
  // Whether a row with `kept` nonzero probabilities out of `vocab` is stored sparse.
  static bool Sparse(int64_t kept, int32_t vocab) { return kept * kSparseDivisor <= vocab; }

  // Empties it for rows over a vocabulary of `vocab` tokens.
  void Reset(int32_t vocab);
  int32_t vocab() const { return vocab_; }
  int32_t size() const { return static_cast<int32_t>(prob_begin_.size()) - 1; }
  // Appends a row given whole ([vocab]); stored sparse if Sparse() says so.
  void AddDense(std::span<const float> probs);
  // Appends a row given sparse: ascending ids in [0, vocab) and their probabilities.
  // InvalidArgument (nothing appended) if they are not.
  Status AddSparse(std::span<const int32_t> ids, std::span<const float> probs);
  // Row r's tokens kept (ascending) and their probabilities; ids is empty for a dense row,
  // whose probs are all vocab().
  std::span<const int32_t> ids(int32_t r) const;
  std::span<const float> probs(int32_t r) const;
  // Row r as a whole distribution: `p` becomes [vocab], zero where nothing is kept.
  void Expand(int32_t r, std::vector<float>& p) const;
  // Floats and ids held (what crossed from the device).
  int64_t stored_values() const { return static_cast<int64_t>(probs_.size() + ids_.size()); }

  // The packed form (the LLM worker protocol's, kernels/sampling.cuh's): for each row the tokens
  // it keeps (a dense row: its nonzero probabilities), and the rows one after another as 4-byte
  // words, a sparse row its probabilities then its ids, a dense row its vocab probabilities.
  // Appends to `kept` and `words`.
  void Pack(std::vector<int32_t>& kept, std::vector<uint32_t>& words) const;
  // Appends rows given packed (`kept` one per row, `words` exactly their words). InvalidArgument
  // (nothing appended) if they do not fit together or a sparse row's ids are not ascending in
  // the vocabulary.
  Status AddPacked(std::span<const int32_t> kept, std::span<const uint32_t> words);
  // Drops the rows from `rows` on (rows <= size()).
  void Truncate(int32_t rows);

 private:
  int32_t vocab_ = 0;
  std::vector<int64_t> prob_begin_{0}, id_begin_{0};  // [size + 1]
  std::vector<float> probs_;
  std::vector<int32_t> ids_;
};

}  // namespace specinfer
