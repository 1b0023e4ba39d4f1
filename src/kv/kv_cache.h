// Paged KV-cache bookkeeping (as vLLM's PagedAttention): a pool of fixed-size blocks and, per
// sequence, a block table mapping logical positions to physical slots; with automatic prefix
// caching (as vLLM's, SGLang's radix cache) so that sequences sharing a prompt prefix (a system
// prompt, a conversation's earlier turns) share its KV blocks instead of recomputing them.
//
// This class only plans: it decides which physical slot holds position p of sequence s. The
// K/V values themselves live in backend memory (CPU arrays, GPU buffers) laid out as
// [layer][block][block_size][kv_dim]; a backend reads and writes them through SlotOf() and the
// block tables. Growing a sequence (Reserve) is the plan step; a backend's forward pass applies
// it by writing the new entries. Shrinking (Truncate) returns whole blocks to the pool at once,
// which is how a token tree's rejected branches are dropped without copying the rest.
//
// Prefix caching (off unless set_prefix_caching(true); the engine core turns it on):
//   - CommitTokens(seq, tokens) says the sequence's KV entries [0, tokens.size()) are final
//     (verified). Each full block among them is registered under the hash of its whole token
//     prefix, a chain: key(block k) = Mix(key(block k - 1), tokens of block k). A block already
//     registered with the same prefix replaces the sequence's own copy (its entries are
//     bit-identical: the engine's kernels are batch-invariant), so later blocks chain on.
//   - AttachCachedPrefix(seq, prompt, max) gives an empty sequence the longest registered
//     prefix of `prompt`, whole blocks, at most `max` tokens; the caller computes the rest.
//   - A block has a reference count (the sequences whose tables hold it). When it drops to zero a
//     registered block is kept, evictable, in an LRU list; a plain one goes back to the free list.
//     Allocation takes free blocks first and evicts least recently released blocks only when
//     none is left, so free_blocks() counts both.
//   - Exactness does not rest on the hash: a hit compares the block's tokens and its parent (the
//     physical block it chained on, and that block's generation, bumped whenever a block loses
//     its registration), so a matched block holds exactly the prompt's prefix; a 64-bit key
//     collision only costs a miss.
//   - Copy-on-write: registered or shared blocks (reference count > 1) are never written. A pass
//     writes a sequence's positions from its Length() before the Reserve that planned them (the
//     engine writes at its committed length, which registered blocks lie below). If that
//     position falls inside a registered or shared block (only after a Truncate below the
//     committed length), Reserve gives the sequence a private block and queues a copy of the
//     entries kept, which the engine applies on the runner before the pass
//     (ApplyPendingCopies, from engine/executor.h). WritableFrom(seq) is the first position a
//     pass may write, which the executor checks.
//   - ClearPrefixCache() forgets every registration (the runner lost its KV: kv_epoch changed).
//
// Thread safety: not thread-safe; owned and used by one scheduler thread.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

using SeqId = int64_t;

// Counters of the prefix cache, since the manager was built (cumulative) or now (gauges).
struct PrefixCacheStats {
  int64_t lookups = 0;              // AttachCachedPrefix calls
  int64_t lookup_tokens = 0;        // prompt tokens looked up
  int64_t hit_tokens = 0;           // of which attached from the cache
  int64_t evictions = 0;            // registered blocks reused for other data
  int32_t cached_blocks = 0;        // blocks registered now (in use or evictable)
  int32_t evictable_blocks = 0;     // registered blocks no sequence holds now
};

// A copy of `count` entries (positions [0, count) of a block) from block `from` to block `to`,
// all layers: copy-on-write of a registered or shared block.
struct KvBlockCopy {
  int32_t from = 0;
  int32_t to = 0;
  int32_t count = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  // Blocks a Reserve may take: free ones and evictable cached ones.
  int32_t free_blocks() const {
    return static_cast<int32_t>(free_list_.size() + lru_.size());
  }
  int32_t used_blocks() const { return num_blocks_ - free_blocks(); }

  // Registers a new, empty sequence.
  SeqId AddSequence();
  // Releases every block of the sequence and forgets it. Unknown ids are ignored.
  void RemoveSequence(SeqId seq);
  bool HasSequence(SeqId seq) const { return seqs_.count(seq) != 0; }

  // Ensures slots exist for positions [0, new_length). Allocates blocks as needed;
  // ResourceExhausted (and no change) if the pool cannot hold them.
  Status Reserve(SeqId seq, int32_t new_length);
  // Blocks needed to grow `seq` to new_length (0 if it already fits).
  int32_t BlocksNeeded(SeqId seq, int32_t new_length) const;

  // Drops positions >= new_length; releases blocks no longer used (a registered or shared block
  // kept in part stays shared until the next Reserve copies it).
  void Truncate(SeqId seq, int32_t new_length);

  // Number of positions currently reserved for the sequence.
  int32_t Length(SeqId seq) const;

  // Physical slot (block * block_size + offset) of logical position `pos` (< Length(seq)).
  int64_t SlotOf(SeqId seq, int32_t pos) const {
    const auto& table = seqs_.at(seq).blocks;
    return static_cast<int64_t>(table[pos / block_size_]) * block_size_ + pos % block_size_;
  }

  std::span<const int32_t> BlockTable(SeqId seq) const { return seqs_.at(seq).blocks; }

  // --- prefix caching (see the file comment) ---
  // Turning it off forgets every registration.
  void set_prefix_caching(bool on);
  bool prefix_caching() const { return prefix_caching_; }
  // Attaches to the empty sequence `seq` the longest registered prefix of `prompt`, whole blocks
  // of at most `max_tokens` tokens; returns its length in tokens (0 when off or none). Counts a
  // lookup of `prompt`'s size.
  int32_t AttachCachedPrefix(SeqId seq, std::span<const int32_t> prompt, int32_t max_tokens);
  // The sequence's KV entries [0, tokens.size()) are final and hold `tokens`: registers its full
  // blocks among them not registered yet. Requires tokens.size() <= Length(seq). No-op when off.
  void CommitTokens(SeqId seq, std::span<const int32_t> tokens);
  // Forgets every registration; evictable blocks become free.
  void ClearPrefixCache();
  // First position of `seq` a pass may write: past its registered and shared blocks.
  int32_t WritableFrom(SeqId seq) const;
  // Copy-on-write copies queued by Reserve (each holds its source block until applied).
  bool has_pending_copies() const { return !pending_copies_.empty(); }
  // Applies them with `move(helper, src, dst)`, ModelRunner::MoveKv on a helper sequence whose
  // table is {from, to} (positions [0, count) to [block_size, block_size + count)), then releases
  // the sources. Stops at the first error (the runner's KV is then suspect).
  using MoveFn = std::function<Status(SeqId helper, std::span<const int32_t> src,
                                      std::span<const int32_t> dst)>;
  Status ApplyPendingCopies(const MoveFn& move);
  PrefixCacheStats prefix_stats() const;
  // Reference count of a physical block (tests).
  int32_t RefCount(int32_t block) const { return blocks_[block].ref; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int32_t length = 0;
    // Chain keys of its first blocks, known for those attached or committed so far.
    std::vector<uint64_t> keys;
  };
  struct Block {
    int32_t ref = 0;
    bool cached = false;  // registered under `key`
    uint32_t gen = 0;     // bumped whenever it loses its registration
    uint64_t key = 0;
    int32_t parent = -1;  // the block it chained on (-1: first block of a prefix)
    uint32_t parent_gen = 0;
    std::list<int32_t>::iterator lru;  // valid while cached and ref == 0
  };

  static uint64_t ChainKey(uint64_t parent, std::span<const int32_t> tokens);
  std::span<const int32_t> TokensOf(int32_t block) const {
    return std::span<const int32_t>(block_tokens_).subspan(
        static_cast<size_t>(block) * block_size_, static_cast<size_t>(block_size_));
  }
  // A block for new data: a free one, else the least recently released cached one.
  int32_t Allocate();
  void Retain(int32_t block);
  void Release(int32_t block);
  void Unregister(int32_t block);
  bool Frozen(int32_t block) const { return blocks_[block].cached || blocks_[block].ref > 1; }

  int32_t num_blocks_;
  int32_t block_size_;
  std::vector<int32_t> free_list_;
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 1;

  bool prefix_caching_ = false;
  std::vector<Block> blocks_;
  std::vector<int32_t> block_tokens_;  // [num_blocks, block_size] tokens of registered blocks
  std::unordered_map<uint64_t, int32_t> by_key_;  // registered blocks
  std::list<int32_t> lru_;  // evictable registered blocks, least recently released first
  std::vector<KvBlockCopy> pending_copies_;
  PrefixCacheStats stats_;
};

}  // namespace specinfer
