// A draft model's own, smaller vocabulary (SpecInfer's SSMs, scripts/boost_tune.py): row r of
// the draft's embedding and output matrix stands for the LLM's token llm_ids[r]. The output layer
// over the LLM's whole vocabulary is most of a small draft's cost (49152 x 256 for SmolLM2's
// vocabulary: 12.6 M multiply-adds a token, four times the rest of a 4-layer, 256-wide draft),
// and most of those tokens are never among its guesses.
//
// One row may stand for "any other token" (llm_ids[r] == -1): the input of every LLM token
// outside the table; it is never proposed. The draft proposes only tokens of its table, which
// keeps verification exact (the LLM checks every proposal; under sampling, q is the draft's
// distribution spread over the LLM's ids, zero outside the table).
//
// Stored in a draft GGUF as the int32 array `specinfer.draft_token_ids` (ModelConfig::
// draft_token_ids); the speculator (spec/speculator.cc) maps the tokens it feeds the draft and
// widens the logits it reads back, so everything downstream works in the LLM's ids.
//
// Thread safety: immutable after Create.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

class DraftVocab {
 public:
  // InvalidArgument for an empty table, an id outside [-1, llm_vocab), a repeated id, or more
  // than one -1 row.
  static StatusOr<DraftVocab> Create(std::span<const int32_t> llm_ids, int32_t llm_vocab);

  int32_t size() const { return static_cast<int32_t>(to_llm_.size()); }  // draft rows
  int32_t llm_vocab() const { return static_cast<int32_t>(to_draft_.size()); }

  // The draft row that LLM token `token` reads as: its own row, else the "other" row (row 0
  // when the table has none; such a draft was trained without one).
  int32_t ToDraft(int32_t token) const { return to_draft_[static_cast<size_t>(token)]; }

  // Widens `rows` rows of draft logits ([rows, size()]) into [rows, llm_vocab()]: each row's
  // logits at their LLM ids, -infinity at every other id (and at the "other" row's).
  void WidenLogits(std::span<const float> draft, size_t rows, std::span<float> llm) const;

 private:
  std::vector<int32_t> to_llm_;    // [size()], -1: the "other" row
  std::vector<int32_t> to_draft_;  // [llm_vocab()]
};

}  // namespace specinfer
