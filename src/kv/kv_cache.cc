#include "kv/kv_cache.h"

#include <algorithm>

namespace specinfer {

namespace {
// The chain key of a prefix's first block's parent.
constexpr uint64_t kRootKey = 0x6a09e667f3bcc908ull;

uint64_t Mix(uint64_t h) {  // splitmix64's finaliser
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}
}  // namespace

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  free_list_.reserve(num_blocks);
  // Hand out low block numbers first (a LIFO stack popped from the back).
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
  blocks_.resize(static_cast<size_t>(std::max(num_blocks, 0)));
}

uint64_t KvCacheManager::ChainKey(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent + 0x9e3779b97f4a7c15ull);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

SeqId KvCacheManager::AddSequence() {
  SeqId id = next_id_++;
  seqs_.emplace(id, Sequence{});
  return id;
}

int32_t KvCacheManager::Allocate() {
  int32_t b;
  if (!free_list_.empty()) {
    b = free_list_.back();
    free_list_.pop_back();
  } else {
    b = lru_.front();  // callers check free_blocks() first
    lru_.pop_front();
    Unregister(b);
    ++stats_.evictions;
  }
  blocks_[b].ref = 1;
  return b;
}

void KvCacheManager::Retain(int32_t block) {
  Block& b = blocks_[block];
  if (b.ref == 0 && b.cached) lru_.erase(b.lru);
  ++b.ref;
}

void KvCacheManager::Release(int32_t block) {
  Block& b = blocks_[block];
  if (--b.ref > 0) return;
  if (b.cached) {
    b.lru = lru_.insert(lru_.end(), block);
  } else {
    free_list_.push_back(block);
  }
}

void KvCacheManager::Unregister(int32_t block) {
  Block& b = blocks_[block];
  if (!b.cached) return;
  auto it = by_key_.find(b.key);
  if (it != by_key_.end() && it->second == block) by_key_.erase(it);
  b.cached = false;
  ++b.gen;  // children chained on it no longer match
}

void KvCacheManager::RemoveSequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Last block first: the LRU then evicts a prefix's tail before its head.
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) Release(*b);
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
  Sequence& s = it->second;
  // The pass writes from s.length on: a registered or shared block there is copied first.
  const int32_t partial = s.length / block_size_;
  const bool cow = new_length > s.length && s.length % block_size_ != 0 &&
                   partial < static_cast<int32_t>(s.blocks.size()) &&
                   Frozen(s.blocks[partial]);
  const int32_t need = BlocksNeeded(seq, new_length);
  if (need + (cow ? 1 : 0) > free_blocks()) {
    return ResourceExhaustedError("KV cache full: need " + std::to_string(need + (cow ? 1 : 0)) +
                                  " more blocks, " + std::to_string(free_blocks()) + " free of " +
                                  std::to_string(num_blocks_));
  }
  if (cow) {
    // The pending copy keeps the sequence's reference on the source until it is applied.
    const int32_t from = s.blocks[partial];
    const int32_t to = Allocate();
    pending_copies_.push_back(KvBlockCopy{from, to, s.length % block_size_});
    s.blocks[partial] = to;
  }
  for (int32_t i = 0; i < need; ++i) s.blocks.push_back(Allocate());
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
    Release(s.blocks.back());
    s.blocks.pop_back();
  }
  s.length = new_length;
  // A block kept in part no longer holds its whole key's tokens for this sequence.
  s.keys.resize(std::min(s.keys.size(), static_cast<size_t>(new_length / block_size_)));
}

int32_t KvCacheManager::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.length;
}

void KvCacheManager::set_prefix_caching(bool on) {
  if (!on) ClearPrefixCache();
  if (on && block_tokens_.empty())
    block_tokens_.resize(static_cast<size_t>(num_blocks_) * block_size_);
  prefix_caching_ = on;
}

int32_t KvCacheManager::AttachCachedPrefix(SeqId seq, std::span<const int32_t> prompt,
                                           int32_t max_tokens) {
  ++stats_.lookups;
  stats_.lookup_tokens += static_cast<int64_t>(prompt.size());
  auto it = seqs_.find(seq);
  if (!prefix_caching_ || it == seqs_.end() || !it->second.blocks.empty()) return 0;
  Sequence& s = it->second;
  const int64_t usable = std::min<int64_t>(std::max(max_tokens, 0), prompt.size());
  const int64_t n = usable / block_size_;
  uint64_t key = kRootKey;
  int32_t parent = -1;
  for (int64_t k = 0; k < n; ++k) {
    const auto toks = prompt.subspan(static_cast<size_t>(k * block_size_),
                                     static_cast<size_t>(block_size_));
    key = ChainKey(key, toks);
    auto found = by_key_.find(key);
    if (found == by_key_.end()) break;
    const int32_t b = found->second;
    const Block& blk = blocks_[b];
    // Exact: the same tokens, chained on the very block (and registration) matched before.
    if (blk.parent != parent || (parent >= 0 && blk.parent_gen != blocks_[parent].gen) ||
        !std::equal(toks.begin(), toks.end(), TokensOf(b).begin()))
      break;
    Retain(b);
    s.blocks.push_back(b);
    s.keys.push_back(key);
    parent = b;
  }
  s.length = static_cast<int32_t>(s.blocks.size()) * block_size_;
  stats_.hit_tokens += s.length;
  return s.length;
}

void KvCacheManager::CommitTokens(SeqId seq, std::span<const int32_t> tokens) {
  auto it = seqs_.find(seq);
  if (!prefix_caching_ || it == seqs_.end()) return;
  Sequence& s = it->second;
  const size_t n = std::min<size_t>(tokens.size(), static_cast<size_t>(s.length)) / block_size_;
  for (size_t k = s.keys.size(); k < n; ++k) {
    const auto toks = tokens.subspan(k * block_size_, static_cast<size_t>(block_size_));
    const uint64_t key = ChainKey(k == 0 ? kRootKey : s.keys[k - 1], toks);
    const int32_t parent = k == 0 ? -1 : s.blocks[k - 1];
    const int32_t b = s.blocks[k];
    if (blocks_[b].cached) {  // attached, or registered by a sequence it was shared with
      s.keys.push_back(key);
      continue;
    }
    // Only a block whose parent is registered can ever be found.
    if (parent >= 0 && !blocks_[parent].cached) return;
    auto found = by_key_.find(key);
    if (found != by_key_.end()) {
      const int32_t c = found->second;
      const Block& blk = blocks_[c];
      if (blk.parent != parent || (parent >= 0 && blk.parent_gen != blocks_[parent].gen) ||
          !std::equal(toks.begin(), toks.end(), TokensOf(c).begin()))
        return;  // a key collision: this sequence's chain is not cached past here
      // The same prefix computed twice (sequences admitted together): keep the registered
      // block, whose entries are bit-identical, and free this one.
      Retain(c);
      s.blocks[k] = c;
      Release(b);
      s.keys.push_back(key);
      continue;
    }
    Block& blk = blocks_[b];
    blk.cached = true;
    blk.key = key;
    blk.parent = parent;
    blk.parent_gen = parent >= 0 ? blocks_[parent].gen : 0;
    std::copy(toks.begin(), toks.end(), block_tokens_.begin() + static_cast<ptrdiff_t>(b) *
                                                                  block_size_);
    by_key_.emplace(key, b);
    s.keys.push_back(key);
  }
}

void KvCacheManager::ClearPrefixCache() {
  for (int32_t b : lru_) free_list_.push_back(b);
  lru_.clear();
  for (int32_t b = 0; b < num_blocks_; ++b) Unregister(b);
  by_key_.clear();
}

int32_t KvCacheManager::WritableFrom(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  const auto& blocks = it->second.blocks;
  for (size_t k = blocks.size(); k > 0; --k)
    if (Frozen(blocks[k - 1])) return static_cast<int32_t>(k) * block_size_;
  return 0;
}

Status KvCacheManager::ApplyPendingCopies(const MoveFn& move) {
  std::vector<KvBlockCopy> copies = std::move(pending_copies_);
  pending_copies_.clear();
  Status status = Status::Ok();
  for (const KvBlockCopy& c : copies) {
    if (status.ok()) {
      const SeqId helper = AddSequence();
      Sequence& h = seqs_.at(helper);
      Retain(c.from);
      Retain(c.to);
      h.blocks = {c.from, c.to};
      h.length = 2 * block_size_;
      std::vector<int32_t> src(static_cast<size_t>(c.count)), dst(static_cast<size_t>(c.count));
      for (int32_t i = 0; i < c.count; ++i) {
        src[i] = i;
        dst[i] = block_size_ + i;
      }
      status = move(helper, src, dst);
      RemoveSequence(helper);
    }
    Release(c.from);
  }
  return status;
}

PrefixCacheStats KvCacheManager::prefix_stats() const {
  PrefixCacheStats s = stats_;
  s.cached_blocks = static_cast<int32_t>(by_key_.size());
  s.evictable_blocks = static_cast<int32_t>(lru_.size());
  return s;
}

}  // namespace specinfer
