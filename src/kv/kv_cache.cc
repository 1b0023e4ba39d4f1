#include "kv/kv_cache.h"

#include <algorithm>

namespace specinfer {

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  free_list_.reserve(num_blocks);
  // Hand out low block numbers first (a LIFO stack popped from the back).
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

SeqId KvCacheManager::AddSequence() {
  SeqId id = next_id_++;
  seqs_.emplace(id, Sequence{});
  return id;
}

void KvCacheManager::RemoveSequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b)
    free_list_.push_back(*b);
  seqs_.erase(it);
}

int32_t KvCacheManager::BlocksNeeded(SeqId seq, int32_t new_length) const {
  const Sequence& s = seqs_.at(seq);
  int32_t want = (new_length + block_size_ - 1) / block_size_;
  return std::max<int32_t>(0, want - static_cast<int32_t>(s.blocks.size()));
}

Status KvCacheManager::Reserve(SeqId seq, int32_t new_length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return InvalidArgumentError("unknown sequence");
  if (new_length < 0) return InvalidArgumentError("negative KV length");
  int32_t need = BlocksNeeded(seq, new_length);
  if (need > free_blocks()) {
    return ResourceExhaustedError("KV cache full: need " + std::to_string(need) +
                                  " more blocks, " + std::to_string(free_blocks()) + " free of " +
                                  std::to_string(num_blocks_));
  }
  Sequence& s = it->second;
  for (int32_t i = 0; i < need; ++i) {
    s.blocks.push_back(free_list_.back());
    free_list_.pop_back();
  }
  s.length = std::max(s.length, new_length);
  return Status::Ok();
}

void KvCacheManager::Truncate(SeqId seq, int32_t new_length) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Sequence& s = it->second;
  new_length = std::clamp(new_length, 0, s.length);
  size_t keep = (static_cast<size_t>(new_length) + block_size_ - 1) / block_size_;
  while (s.blocks.size() > keep) {
    free_list_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
  s.length = new_length;
}

int32_t KvCacheManager::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.length;
}

}  // namespace specinfer
