// Paged KV-cache bookkeeping (as vLLM's PagedAttention): a pool of fixed-size blocks and, per
// sequence, a block table mapping logical positions to physical slots.
//
// This class only plans: it decides which physical slot holds position p of sequence s. The
// K/V values themselves live in backend memory (CPU arrays, GPU buffers) laid out as
// [layer][block][block_size][kv_dim]; a backend reads and writes them through SlotOf() and the
// block tables. Growing a sequence (Reserve) is the plan step; a backend's forward pass applies
// it by writing the new entries. Shrinking (Truncate) returns whole blocks to the pool at once,
// which is how a token tree's rejected branches are dropped without copying the rest.
//
// Thread safety: not thread-safe; owned and used by one scheduler thread.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

using SeqId = int64_t;

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t used_blocks() const { return num_blocks_ - free_blocks(); }

  // Registers a new, empty sequence.
  SeqId AddSequence();
  // Frees every block of the sequence and forgets it. Unknown ids are ignored.
  void RemoveSequence(SeqId seq);
  bool HasSequence(SeqId seq) const { return seqs_.count(seq) != 0; }

  // Ensures slots exist for positions [0, new_length). Allocates blocks as needed;
  // ResourceExhausted (and no change) if the pool cannot hold them.
  Status Reserve(SeqId seq, int32_t new_length);
  // Blocks needed to grow `seq` to new_length (0 if it already fits).
  int32_t BlocksNeeded(SeqId seq, int32_t new_length) const;

  // Drops positions >= new_length; frees blocks no longer used.
  void Truncate(SeqId seq, int32_t new_length);

  // Number of positions currently reserved for the sequence.
  int32_t Length(SeqId seq) const;

  // Physical slot (block * block_size + offset) of logical position `pos` (< Length(seq)).
  int64_t SlotOf(SeqId seq, int32_t pos) const {
    const auto& table = seqs_.at(seq).blocks;
    return static_cast<int64_t>(table[pos / block_size_]) * block_size_ + pos % block_size_;
  }

  std::span<const int32_t> BlockTable(SeqId seq) const { return seqs_.at(seq).blocks; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int32_t length = 0;
  };

  int32_t num_blocks_;
  int32_t block_size_;
  std::vector<int32_t> free_list_;
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 1;
};

}  // namespace specinfer
