#include "spec/draft_vocab.h"

#include <algorithm>
#include <limits>
#include <string>

namespace specinfer {

StatusOr<DraftVocab> DraftVocab::Create(std::span<const int32_t> llm_ids, int32_t llm_vocab) {
  if (llm_ids.empty()) return InvalidArgumentError("a draft vocabulary needs at least one token");
  if (llm_vocab <= 0) return InvalidArgumentError("the LLM's vocabulary is empty");
  DraftVocab v;
  v.to_llm_.assign(llm_ids.begin(), llm_ids.end());
  int32_t other = -1;
  std::vector<int32_t> seen(static_cast<size_t>(llm_vocab), -1);
  for (size_t r = 0; r < llm_ids.size(); ++r) {
    const int32_t id = llm_ids[r];
    if (id == -1) {
      if (other >= 0)
        return InvalidArgumentError("draft vocabulary: rows " + std::to_string(other) + " and " +
                                    std::to_string(r) + " both stand for other tokens (-1)");
      other = static_cast<int32_t>(r);
      continue;
    }
    if (id < -1 || id >= llm_vocab)
      return InvalidArgumentError("draft vocabulary: row " + std::to_string(r) + " is token " +
                                  std::to_string(id) + ", outside the model's vocabulary of " +
                                  std::to_string(llm_vocab));
    if (seen[static_cast<size_t>(id)] >= 0)
      return InvalidArgumentError("draft vocabulary: token " + std::to_string(id) +
                                  " is in rows " + std::to_string(seen[static_cast<size_t>(id)]) +
                                  " and " + std::to_string(r));
    seen[static_cast<size_t>(id)] = static_cast<int32_t>(r);
  }
  const int32_t fallback = std::max(other, 0);
  v.to_draft_.resize(static_cast<size_t>(llm_vocab));
  for (size_t t = 0; t < seen.size(); ++t) v.to_draft_[t] = seen[t] >= 0 ? seen[t] : fallback;
  return v;
}

void DraftVocab::WidenLogits(std::span<const float> draft, size_t rows,
                             std::span<float> llm) const {
  const size_t dv = to_llm_.size(), lv = to_draft_.size();
  std::fill(llm.begin(), llm.begin() + static_cast<std::ptrdiff_t>(rows * lv),
            -std::numeric_limits<float>::infinity());
  for (size_t row = 0; row < rows; ++row) {
    const float* in = draft.data() + row * dv;
    float* out = llm.data() + row * lv;
    for (size_t r = 0; r < dv; ++r)
      if (to_llm_[r] >= 0) out[to_llm_[r]] = in[r];
  }
}

}  // namespace specinfer
