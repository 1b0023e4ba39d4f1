// Device code the two tree-attention kernels share: how a row's window entries are found from
// its mask (tree_attention.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tree_attention.cuh"

namespace specinfer::kernels {

// Window entries row i sees: the set bits of its mask row (causal: i + 1).
__device__ __forceinline__ int32_t VisibleWindow(const TreeAttentionRequest& rq,
                                                 const uint64_t* __restrict__ mask_words,
                                                 int32_t i) {
  if (rq.mask_begin < 0) return i + 1;
  const uint64_t* row =
      mask_words + rq.mask_begin + static_cast<int64_t>(i) * rq.mask_words_per_row;
  int32_t n = 0;
  for (int32_t w = 0; w < rq.mask_words_per_row; ++w) n += __popcll(row[w]);
  return n;
}

// Window index of the n-th (from 0) window entry row i sees.
__device__ __forceinline__ int32_t WindowEntry(const TreeAttentionRequest& rq,
                                               const uint64_t* __restrict__ mask_words, int32_t i,
                                               int32_t n) {
  if (rq.mask_begin < 0) return n;
  const uint64_t* row =
      mask_words + rq.mask_begin + static_cast<int64_t>(i) * rq.mask_words_per_row;
  for (int32_t w = 0; w < rq.mask_words_per_row; ++w) {
    uint64_t word = row[w];
    const int32_t pc = __popcll(word);
    if (n >= pc) {
      n -= pc;
      continue;
    }
    for (; n > 0; --n) word &= word - 1;  // drop the n lowest set bits
    return w * 64 + __ffsll(static_cast<long long>(word)) - 1;
  }
  return 0;  // unreachable for n < VisibleWindow(rq, mask_words, i)
}

// Where row r (of `rows`) of work item wi stops in its KV chunk, as a virtual index (0 for r >=
// rows): the committed prefix plus the window entries its token sees, cut at the chunk's end.
__device__ __forceinline__ int32_t RowEnd(const TreeAttentionParams& p,
                                          const TreeAttentionRequest& rq,
                                          const TreeAttentionWorkItem& wi, int32_t r,
                                          int32_t rows) {
  if (r >= rows) return 0;
  const int32_t i = (wi.row_begin + r) / (p.qo_heads / p.kv_heads);
  return min(rq.kv_prefix + VisibleWindow(rq, p.mask_words, i), (wi.chunk + 1) * p.kv_chunk);
}

// Soft-capping in the kernels' base-2 score units (s = log2(e) x the natural score):
// cap tanh(x / cap) of the natural score x is C tanh(s / C) with C = cap log2(e). cap_log2 = C,
// or 0 for none.
__device__ __forceinline__ float SoftCapLog2(float s, float cap_log2) {
  return cap_log2 > 0.0f ? __fmul_rn(cap_log2, tanhf(__fdiv_rn(s, cap_log2))) : s;
}

// Where row r's keys begin (virtual index): 0, or with a sliding window its token's position
// minus the window plus one (see the header). Keys before it are masked like keys past the end.
__device__ __forceinline__ int32_t RowBegin(const TreeAttentionParams& p,
                                            const TreeAttentionRequest& rq,
                                            const TreeAttentionWorkItem& wi, int32_t r,
                                            int32_t rows) {
  if (p.sliding_window <= 0 || r >= rows) return 0;
  const int32_t i = (wi.row_begin + r) / (p.qo_heads / p.kv_heads);
  return max(0, p.positions[rq.token_begin + i] - p.sliding_window + 1);
}

// The logical position of the key at virtual index v (< the row's end) of token i's sequence: the
// committed prefix as it is, then the window entries its mask shows, compacted.
__device__ __forceinline__ int32_t KeyPosition(const TreeAttentionRequest& rq,
                                               const uint64_t* __restrict__ mask_words, int32_t i,
                                               int32_t v) {
  return v < rq.kv_prefix ? v : rq.kv_prefix + WindowEntry(rq, mask_words, i, v - rq.kv_prefix);
}

// A request's paged KV cache: logical position pos lives in slot table[pos / block_size] *
// block_size + pos % block_size (shifts, not divisions, for the usual power-of-two block size).
struct PagedSlots {
  const int32_t* table;
  int32_t bs;
  bool pow2;
  int shift;
  __device__ int32_t BlockOf(int32_t pos) const { return pow2 ? pos >> shift : pos / bs; }
  __device__ int32_t PageOf(int32_t pos) const { return table[BlockOf(pos)]; }
  // The slot of pos whose page (PageOf(pos)) the caller has already read.
  __device__ int64_t SlotIn(int32_t page, int32_t pos) const {
    return static_cast<int64_t>(page) * bs + (pow2 ? pos & (bs - 1) : pos % bs);
  }
  __device__ int64_t SlotOf(int32_t pos) const { return SlotIn(PageOf(pos), pos); }
};

__device__ __forceinline__ PagedSlots MakePagedSlots(const int32_t* block_table,
                                                     int32_t block_size) {
  return PagedSlots{block_table, block_size, (block_size & (block_size - 1)) == 0,
                    __ffs(block_size) - 1};
}

}  // namespace specinfer::kernels
