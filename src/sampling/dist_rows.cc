#include "sampling/dist_rows.h"

#include <algorithm>
#include <cstring>
#include <string>

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

void DistRows::Pack(std::vector<int32_t>& kept, std::vector<uint32_t>& words) const {
  std::vector<float> p;
  for (int32_t r = 0; r < size(); ++r) {
    Expand(r, p);
    const auto k = std::count_if(p.begin(), p.end(), [](float x) { return x != 0.0f; });
    kept.push_back(static_cast<int32_t>(k));
    const size_t at = words.size();
    if (!Sparse(k, vocab_)) {
      words.resize(at + p.size());
      std::memcpy(words.data() + at, p.data(), p.size() * 4);
      continue;
    }
    words.resize(at + 2 * static_cast<size_t>(k));
    size_t j = at;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] != 0.0f) std::memcpy(&words[j++], &p[i], 4);
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] != 0.0f) words[j++] = static_cast<uint32_t>(i);
  }
}

Status DistRows::AddPacked(std::span<const int32_t> kept, std::span<const uint32_t> words) {
  size_t need = 0;
  for (int32_t k : kept) {
    if (k < 0 || k > vocab_) return InvalidArgumentError("distribution row: bad token count");
    need += Sparse(k, vocab_) ? 2 * static_cast<size_t>(k) : static_cast<size_t>(vocab_);
  }
  if (need != words.size())
    return InvalidArgumentError("distribution rows: " + std::to_string(words.size()) +
                                " words packed, their counts need " + std::to_string(need));
  const int32_t before = size();
  std::vector<float> probs;
  std::vector<int32_t> ids;
  for (int32_t k : kept) {
    if (Sparse(k, vocab_)) {
      const auto n = static_cast<size_t>(k);
      probs.resize(n);
      ids.resize(n);
      std::memcpy(probs.data(), words.data(), n * 4);
      std::memcpy(ids.data(), words.data() + n, n * 4);
      words = words.subspan(2 * n);
      Status s = AddSparse(ids, probs);
      if (!s.ok()) {
        Truncate(before);
        return s;
      }
    } else {
      probs.resize(static_cast<size_t>(vocab_));
      std::memcpy(probs.data(), words.data(), probs.size() * 4);
      words = words.subspan(probs.size());
      AddDense(probs);
    }
  }
  return Status::Ok();
}

void DistRows::Truncate(int32_t rows) {
  prob_begin_.resize(static_cast<size_t>(rows) + 1);
  id_begin_.resize(static_cast<size_t>(rows) + 1);
  probs_.resize(static_cast<size_t>(prob_begin_.back()));
  ids_.resize(static_cast<size_t>(id_begin_.back()));
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
