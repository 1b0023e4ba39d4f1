#include "sampling/dist_rows.h"

#include <algorithm>

namespace specinfer {

void DistRows::Reset(int32_t vocab) {
  vocab_ = vocab;
  prob_begin_.assign(1, 0);
  id_begin_.assign(1, 0);
  probs_.clear();
  ids_.clear();
}

void DistRows::AddDense(std::span<const float> probs) {
  const auto kept = std::count_if(probs.begin(), probs.end(), [](float x) { return x != 0.0f; });
  if (Sparse(kept, vocab_)) {
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] == 0.0f) continue;
      ids_.push_back(static_cast<int32_t>(i));
      probs_.push_back(probs[i]);
    }
  } else {
    probs_.insert(probs_.end(), probs.begin(), probs.end());
  }
  prob_begin_.push_back(static_cast<int64_t>(probs_.size()));
  id_begin_.push_back(static_cast<int64_t>(ids_.size()));
}

Status DistRows::AddSparse(std::span<const int32_t> ids, std::span<const float> probs) {
  if (ids.size() != probs.size())
    return InvalidArgumentError("distribution row: ids and probabilities differ in number");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_ || (i > 0 && ids[i] <= ids[i - 1]))
      return InvalidArgumentError("distribution row: ids not ascending within the vocabulary");
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  probs_.insert(probs_.end(), probs.begin(), probs.end());
  prob_begin_.push_back(static_cast<int64_t>(probs_.size()));
  id_begin_.push_back(static_cast<int64_t>(ids_.size()));
  return Status::Ok();
}

std::span<const int32_t> DistRows::ids(int32_t r) const {
  const auto b = static_cast<size_t>(id_begin_[static_cast<size_t>(r)]);
  return std::span<const int32_t>(ids_).subspan(
      b, static_cast<size_t>(id_begin_[static_cast<size_t>(r) + 1]) - b);
}

std::span<const float> DistRows::probs(int32_t r) const {
  const auto b = static_cast<size_t>(prob_begin_[static_cast<size_t>(r)]);
  return std::span<const float>(probs_).subspan(
      b, static_cast<size_t>(prob_begin_[static_cast<size_t>(r) + 1]) - b);
}

void DistRows::Expand(int32_t r, std::vector<float>& p) const {
  const std::span<const int32_t> id = ids(r);
  const std::span<const float> pr = probs(r);
  if (id.empty() && pr.size() == static_cast<size_t>(vocab_)) {
    p.assign(pr.begin(), pr.end());
    return;
  }
  p.assign(static_cast<size_t>(vocab_), 0.0f);
  for (size_t i = 0; i < id.size(); ++i) p[static_cast<size_t>(id[i])] = pr[i];
}

}  // namespace specinfer
