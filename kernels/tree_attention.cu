#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device_types.cuh"
#include "launch.cuh"
#include "tree_attention.cuh"
#include "tree_attention_internal.cuh"
#include "tree_attention_window.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kTreeAttnRowsPerBlock;  // 16 rows per block; row r belongs to warp r % 4
constexpr int kRowsPerWarp = kRows / kWarps;  // 4
constexpr int kTile = kTreeAttnTileKv;        // 32: one key per lane in the softmax
constexpr int kParts = 4;                     // partial sums of one q . k dot product
constexpr int kScoreRows = 2;                 // rows whose scores a thread computes together
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kTile == 32 && kThreads == kTile * kParts, "scores: one thread per (key, part)");
static_assert(kTile % 8 == 0, "window tiles: V rows loaded 8 keys at a time");
static_assert(kRows % kScoreRows == 0, "score row groups stay inside the block's rows");
static_assert(kRowsPerWarp % 2 == 0, "softmax: row pairs");

// Shared-memory layout (bytes) and the fixed arithmetic of a head row of kDMax elements of T.
template <typename T, int kDMax>
struct Layout {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte chunk
  static constexpr int kChunks = kDMax / kVec;                   // chunks per head row
  static constexpr int kChunksPerPart = kChunks / kParts;  // part j: chunks j, j + 4, j + 8...
  static constexpr int kDPerLane = kDMax / 32;             // output dims of a lane (contiguous)
  // K rows are padded to a stride of 64 mod 128 bytes: the score phase's 16-byte reads (8
  // threads: 2 keys x 4 parts, each part a 64-byte span mod 128) then hit distinct banks.
  static constexpr int kKStrideBytes = (kDMax * static_cast<int>(sizeof(T)) + 127) / 128 * 128 + 64;
  static constexpr int kKStride = kKStrideBytes / static_cast<int>(sizeof(T));
  static constexpr int kQ = 0;                           // float [kRows][kDMax], scaled
  static constexpr int kK = kQ + kRows * kDMax * 4;      // T [kTile][kKStride]
  static constexpr int kV = kK + kTile * kKStrideBytes;  // T [kTile][kDMax]
  // float [kRows][kTile]: scores, then p
  static constexpr int kS = kV + kTile * kDMax * static_cast<int>(sizeof(T));
  static constexpr int kEnd = kS + kRows * kTile * 4;  // int32 [kRows]
  static constexpr int kBegin = kEnd + kRows * 4;      // int32 [kRows]
  static constexpr int kBytes = kBegin + kRows * 4;
  // 16-byte K (and V) loads per thread per tile; held in registers (prefetching the next tile
  // during this one's arithmetic) when that is few enough registers.
  static constexpr int kLoadIters = kTile * kChunks / kThreads;
  static constexpr bool kPrefetch = kLoadIters <= 8;
  static_assert(kChunks % kParts == 0 && kTile * kChunks % kThreads == 0, "head row chunks");
  static_assert(kK % 16 == 0 && kV % 16 == 0 && kS % 16 == 0, "16-byte aligned regions");
};

// The n elements of T at `src` (aligned to their size, up to 16 bytes) as float.
template <typename T, int kN>
__device__ __forceinline__ void LoadFloats(const T* src, float (&dst)[kN]) {
  constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int i = 0; i < kN / kPer; ++i) {
      const uint4 raw = reinterpret_cast<const uint4*>(src)[i];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kPer; ++j) dst[i * kPer + j] = ToFloat(e[j]);
    }
  } else if constexpr (kBytes == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < kN; ++j) dst[j] = ToFloat(e[j]);
  } else if constexpr (kBytes == 4) {
    const uint32_t raw = *reinterpret_cast<const uint32_t*>(src);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < kN; ++j) dst[j] = ToFloat(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) dst[j] = ToFloat(src[j]);
  }
}

// One row's online-softmax step over one tile of its keys, run by the warp that owns the row
// (lane = key of the tile; s = the key's score, -inf where `visible` is false). The same code for
// every kind of tile, so a row's numbers depend only on its keys: the tile's max (exact in any
// order), one rescale of the running state (corr), and the tile's sum of p by a fixed butterfly
// (every lane gets the same bits: each step adds a + b and b + a). Returns this lane's p.
__device__ __forceinline__ float RowTileSoftmax(float s, bool visible, float& m, float& l,
                                                float& corr) {
  float tmax = visible ? s : -INFINITY;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(kFull, tmax, o));
  // Finite unless the row has seen no key yet (a sliding window's masked start: then corr and
  // every p are 0, and the state stays as it was).
  const float m_new = fmaxf(m, tmax);
  corr = m == -INFINITY ? 0.0f : exp2f(m - m_new);
  const float pk = visible ? exp2f(s - m_new) : 0.0f;
  float sum = pk;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(kFull, sum, o));
  l = __fmaf_rn(l, corr, sum);
  m = m_new;
  return pk;
}

// RowTileSoftmax for two rows of the warp at once (s: the lane's score in, its p out; a row
// that does not reach into the tile, active false, keeps its state): the same operations per
// row in the same order, the two rows' butterflies interleaved so that their shuffles are in
// flight together rather than one row's after the other's.
__device__ __forceinline__ void PairTileSoftmax(float& s0, float& s1, bool vis0, bool vis1,
                                                bool act0, bool act1, float& m0, float& m1,
                                                float& l0, float& l1, float& corr0, float& corr1) {
  float t0 = vis0 ? s0 : -INFINITY, t1 = vis1 ? s1 : -INFINITY;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    t0 = fmaxf(t0, __shfl_xor_sync(kFull, t0, o));
    t1 = fmaxf(t1, __shfl_xor_sync(kFull, t1, o));
  }
  const float n0 = fmaxf(m0, t0), n1 = fmaxf(m1, t1);  // as in RowTileSoftmax
  corr0 = !act0 ? 1.0f : m0 == -INFINITY ? 0.0f : exp2f(m0 - n0);
  corr1 = !act1 ? 1.0f : m1 == -INFINITY ? 0.0f : exp2f(m1 - n1);
  s0 = vis0 ? exp2f(s0 - n0) : 0.0f;
  s1 = vis1 ? exp2f(s1 - n1) : 0.0f;
  float u0 = s0, u1 = s1;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    u0 = __fadd_rn(u0, __shfl_xor_sync(kFull, u0, o));
    u1 = __fadd_rn(u1, __shfl_xor_sync(kFull, u1, o));
  }
  if (act0) {
    l0 = __fmaf_rn(l0, corr0, u0);
    m0 = n0;
  }
  if (act1) {
    l1 = __fmaf_rn(l1, corr1, u1);
    m1 = n1;
  }
}

// Dot-product order (the same for every row and key, whichever phase computes it): part j sums
// its chunks j, j + 4, ... element by element with fma from 0; then (p0 + p1) + (p2 + p3).
// Elements past head_dim count as zero (fma(0, 0, x) == x: a part is never -0).

// Part `part` of q . k for a K row in global memory (scalar loads when !vec).
template <typename T, int kDMax>
__device__ __forceinline__ float DotPartGlobal(const float* __restrict__ qr,
                                               const T* __restrict__ krow, int32_t hd, bool vec,
                                               int part) {
  using L = Layout<T, kDMax>;
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < L::kChunksPerPart; ++i) {
    const int d0 = (part + kParts * i) * L::kVec;
    if (d0 >= hd) break;
    float kf[L::kVec];
    if (vec) {
      LoadFloats<T, L::kVec>(krow + d0, kf);
    } else {
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) kf[e] = d0 + e < hd ? ToFloat(krow[d0 + e]) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) acc = __fmaf_rn(qr[d0 + e], kf[e], acc);
  }
  return acc;
}

// Blocks per SM the register budget must allow (left alone, the compiler takes registers up to
// the next occupancy step down: 16-bit x 128 ~145 for 3 blocks): enough warps, and so K/V loads
// in flight, for the memory-bound shapes; 16-bit x 128 gets 128 registers for 4 blocks.
template <typename T, int kDMax>
constexpr int MinBlocks() {
  if constexpr (sizeof(T) == 2) return kDMax <= 64 ? 5 : kDMax <= 128 ? 4 : 1;
  return kDMax <= 32 ? 6 : kDMax <= 64 ? 4 : 1;
}
// Row pairs in the softmax (PairTileSoftmax) except for float32 x 256, whose registers are
// already short (it spills more with them).
template <typename T, int kDMax>
constexpr bool kPairSoftmax = !(sizeof(T) == 4 && kDMax > 128);

template <typename T, typename OutT, int kDMax>
__global__ void __launch_bounds__(kThreads, (MinBlocks<T, kDMax>()))
    TreeAttentionKernel(const TreeAttentionParams p) {
  using L = Layout<T, kDMax>;
  constexpr int kVec = L::kVec;
  constexpr int kDPerLane = L::kDPerLane;
  SPECINFER_DYNAMIC_SHARED(float4, attn_smem);
  char* const smem = reinterpret_cast<char*>(attn_smem);
  float* const q_s = reinterpret_cast<float*>(smem + L::kQ);  // [kRows][kDMax]
  T* const k_s = reinterpret_cast<T*>(smem + L::kK);          // [kTile][kKStride]
  T* const v_s = reinterpret_cast<T*>(smem + L::kV);          // [kTile][kDMax]
  float* const s_s = reinterpret_cast<float*>(smem + L::kS);  // [kRows][kTile]: scores, then p
  int32_t* const end_s = reinterpret_cast<int32_t*>(smem + L::kEnd);      // [kRows]
  int32_t* const begin_s = reinterpret_cast<int32_t*>(smem + L::kBegin);  // [kRows]

  const TreeAttentionWorkItem wi = p.work[blockIdx.x];
  const TreeAttentionRequest rq = p.requests[wi.request];
  const int32_t kvh = blockIdx.y;
  const int32_t group = p.qo_heads / p.kv_heads;
  const int32_t hd = p.head_dim;
  const int32_t rows = min(kRows, rq.token_count * group - wi.row_begin);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* q = static_cast<const T*>(p.q);
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const float qscale = p.scale * kLog2e;
  const float cap_log2 = p.softcap * kLog2e;
  const int32_t c0 = wi.chunk * p.kv_chunk;

  // Queries of the block's rows (row = i * group + g: token i, head kvh * group + g), scaled,
  // as float32, zero past head_dim and past the last row.
  for (int idx = threadIdx.x; idx < kRows * kDMax; idx += kThreads) {
    const int rr = idx / kDMax, d = idx % kDMax;
    float val = 0.0f;
    if (rr < rows && d < hd) {
      const int32_t row = wi.row_begin + rr;
      const int64_t t = rq.token_begin + row / group;
      const int32_t h = kvh * group + row % group;
      val = ToFloat(q[(t * p.qo_heads + h) * hd + d]) * qscale;
    }
    q_s[idx] = val;
  }
  // A row's keys, in order, are its "virtual" sequence: positions 0..kv_prefix-1, then the
  // window entries its mask shows, compacted. Tiles are cut in that sequence, so a row's result
  // depends only on the keys it sees: a tree node gets bit for bit what decoding its path one
  // token at a time gets, and a request what it gets in any batch (see the header). end_s: where
  // each row's keys stop in this chunk (virtual index); begin_s: where they begin (0 but with a
  // sliding window).
  if (threadIdx.x < kRows) {
    end_s[threadIdx.x] = RowEnd(p, rq, wi, static_cast<int32_t>(threadIdx.x), rows);
    begin_s[threadIdx.x] = RowBegin(p, rq, wi, static_cast<int32_t>(threadIdx.x), rows);
  }
  __syncthreads();
  int32_t c1 = c0;            // end of the chunk's keys over all rows
  int32_t first = INT32_MAX;  // the first key any row sees (sliding windows)
  for (int r = 0; r < rows; ++r) {
    c1 = max(c1, end_s[r]);
    first = min(first, begin_s[r]);
  }
  // Tiles before every row's sliding window are skipped (they would leave every state as it is:
  // no key visible, corr 1, p 0).
  const int32_t k_first = c0 + max(0, first - c0) / kTile * kTile;

  // This warp's rows: r = warp + 4 j (its keys end at end_s[r], 0 past the last row, read from
  // shared memory rather than held: registers are tight); lane owns dims [lane * kDPerLane,
  // + kDPerLane).
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDPerLane];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int e = 0; e < kDPerLane; ++e) acc[j][e] = 0.0f;
  }

  const bool causal = rq.mask_begin < 0;
  const PagedSlots paged = MakePagedSlots(p.block_tables + rq.block_table_begin, p.block_size);
  // 16-byte K/V loads when every head row is a whole number of them (and so 16-byte aligned:
  // the caches' base addresses are).
  const bool vec_loads =
      hd % kVec == 0 &&
      (reinterpret_cast<uintptr_t>(kc) | reinterpret_cast<uintptr_t>(vc)) % 16 == 0;
  // Tiles whose keys are the same for every row (inside the committed prefix, or any tile of a
  // causal request: its rows' keys are positions 0, 1, ... too) are staged in shared memory and
  // shared by the block; the others reach into a tree's window and each warp reads its rows'
  // keys from global memory (they come last: a few tiles per row at most).
  auto is_shared = [&](int32_t t0) { return causal || t0 + kTile <= rq.kv_prefix; };

  // Staging of shared tiles: registers (16-byte vectors, idx = chunk of a key's row) filled
  // one tile ahead, so the loads overlap the previous tile's arithmetic.
  // Lane k looks up the page of key k of a tile once, a tile ahead of its loads (shared tiles
  // are loaded in order), so that the page table's latency is not on their path.
  uint4 kreg[L::kLoadIters], vreg[L::kLoadIters];
  auto page_of = [&](int32_t t0) {
    return t0 + lane < c1 && is_shared(t0) ? paged.PageOf(t0 + lane) : 0;
  };
  int32_t page_ahead = page_of(k_first);  // the page of the next tile load_tile loads
  auto load_tile = [&](int32_t t0) {
    const int32_t len = min(kTile, c1 - t0);
    const int64_t lane_row =
        lane < len ? (paged.SlotIn(page_ahead, t0 + lane) * p.kv_heads + kvh) * hd : 0;
    page_ahead = page_of(t0 + kTile);
#pragma unroll
    for (int it = 0; it < L::kLoadIters; ++it) {
      const int idx = threadIdx.x + kThreads * it;
      const int kk = idx / L::kChunks, d0 = (idx % L::kChunks) * kVec;
      const int64_t row_off = __shfl_sync(kFull, lane_row, kk);
      kreg[it] = make_uint4(0, 0, 0, 0);
      vreg[it] = make_uint4(0, 0, 0, 0);
      if (kk < len && d0 < hd) {
        const int64_t off = row_off + d0;
        kreg[it] = *reinterpret_cast<const uint4*>(kc + off);
        vreg[it] = *reinterpret_cast<const uint4*>(vc + off);
      }
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int it = 0; it < L::kLoadIters; ++it) {
      const int idx = threadIdx.x + kThreads * it;
      const int kk = idx / L::kChunks, d0 = (idx % L::kChunks) * kVec;
      *reinterpret_cast<uint4*>(k_s + kk * L::kKStride + d0) = kreg[it];
      *reinterpret_cast<uint4*>(v_s + kk * kDMax + d0) = vreg[it];
    }
  };
  // Element-wise staging for head sizes that are not whole 16-byte vectors.
  auto stage_scalar = [&](int32_t t0) {
    const int32_t len = min(kTile, c1 - t0);
    for (int idx = threadIdx.x; idx < kTile * kDMax; idx += kThreads) {
      const int kk = idx / kDMax, d = idx % kDMax;
      T kv = FromFloat<T>(0.0f), vv = FromFloat<T>(0.0f);
      if (kk < len && d < hd) {
        const int64_t off = (paged.SlotOf(t0 + kk) * p.kv_heads + kvh) * hd + d;
        kv = kc[off];
        vv = vc[off];
      }
      k_s[kk * L::kKStride + d] = kv;
      v_s[kk * kDMax + d] = vv;
    }
  };

  bool prefetched = false;
  for (int32_t k0 = k_first; k0 < c1; k0 += kTile) {
    if (is_shared(k0)) {
      if (vec_loads && !prefetched) load_tile(k0);
      __syncthreads();  // the previous tile is no longer being read
      if (vec_loads) {
        store_tile();
      } else {
        stage_scalar(k0);
      }
      __syncthreads();
      prefetched = false;
      if constexpr (L::kPrefetch) {
        const int32_t n0 = k0 + kTile;
        if (vec_loads && n0 < c1 && is_shared(n0)) {
          load_tile(n0);
          prefetched = true;
        }
      }

      // Scores: thread (key, part) keeps its part of the key's row in registers and runs it
      // against every row that sees this tile; the 4 parts of a key are adjacent lanes. Rows go
      // kScoreRows at a time: their fma chains are independent, so they interleave instead of
      // each waiting out one chain's latency (each row's own chain and order are unchanged).
      {
        const int key = threadIdx.x / kParts, part = threadIdx.x % kParts;
        float kf[L::kChunksPerPart][kVec];
#pragma unroll
        for (int i = 0; i < L::kChunksPerPart; ++i)
          LoadFloats<T, kVec>(k_s + key * L::kKStride + (part + kParts * i) * kVec, kf[i]);
        for (int r0 = 0; r0 < rows; r0 += kScoreRows) {
          // Block-uniform. Rows past `rows` have zero queries and end 0; a row that does not
          // see the tile gets a score nobody reads (its softmax and output skip the tile).
          bool any = false;
#pragma unroll
          for (int u = 0; u < kScoreRows; ++u) any |= end_s[r0 + u] > k0;
          if (!any) continue;
          float sc[kScoreRows];
#pragma unroll
          for (int u = 0; u < kScoreRows; ++u) sc[u] = 0.0f;
#pragma unroll
          for (int i = 0; i < L::kChunksPerPart; ++i) {
            const int d0 = (part + kParts * i) * kVec;
#pragma unroll
            for (int e4 = 0; e4 < kVec; e4 += 4) {
              float4 q4[kScoreRows];
#pragma unroll
              for (int u = 0; u < kScoreRows; ++u)
                q4[u] = *reinterpret_cast<const float4*>(q_s + (r0 + u) * kDMax + d0 + e4);
#pragma unroll
              for (int u = 0; u < kScoreRows; ++u) {
                sc[u] = __fmaf_rn(q4[u].x, kf[i][e4], sc[u]);
                sc[u] = __fmaf_rn(q4[u].y, kf[i][e4 + 1], sc[u]);
                sc[u] = __fmaf_rn(q4[u].z, kf[i][e4 + 2], sc[u]);
                sc[u] = __fmaf_rn(q4[u].w, kf[i][e4 + 3], sc[u]);
              }
            }
          }
#pragma unroll
          for (int u = 0; u < kScoreRows; ++u)  // p0 + p1, p2 + p3
            sc[u] = __fadd_rn(sc[u], __shfl_xor_sync(kFull, sc[u], 1));
#pragma unroll
          for (int u = 0; u < kScoreRows; ++u)  // (p0 + p1) + (p2 + p3)
            sc[u] = __fadd_rn(sc[u], __shfl_xor_sync(kFull, sc[u], 2));
          if (part == 0) {
#pragma unroll
            for (int u = 0; u < kScoreRows; ++u)
              s_s[(r0 + u) * kTile + key] = SoftCapLog2(sc[u], cap_log2);
          }
        }
      }
      __syncthreads();

      // Softmax of each row of the warp (p replaces the score), then its output update.
      float corr[kRowsPerWarp];
      int32_t nk_max = 0;  // keys any of the warp's rows sees in this tile
      // Rows two at a time, their butterflies interleaved (see PairTileSoftmax), or one by one.
      if constexpr (!kPairSoftmax<T, kDMax>) {
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j) {
          corr[j] = 1.0f;
          if (end_s[warp + kWarps * j] <= k0) continue;  // warp-uniform
          const int r = warp + kWarps * j;
          const bool visible = k0 + lane < end_s[r] && k0 + lane >= begin_s[r];
          const float pk = RowTileSoftmax(s_s[r * kTile + lane], visible, m[j], l[j], corr[j]);
          s_s[r * kTile + lane] = pk;
          nk_max = max(nk_max, min(kTile, end_s[warp + kWarps * j] - k0));
        }
      } else {
#pragma unroll
        for (int j0 = 0; j0 < kRowsPerWarp; j0 += 2) {
          const int32_t e0 = end_s[warp + kWarps * j0], e1 = end_s[warp + kWarps * (j0 + 1)];
          corr[j0] = corr[j0 + 1] = 1.0f;
          if (e0 <= k0 && e1 <= k0) continue;  // warp-uniform
          nk_max = max(nk_max, min(kTile, max(e0, e1) - k0));
          float* const s0 = s_s + (warp + kWarps * j0) * kTile + lane;
          float* const s1 = s_s + (warp + kWarps * (j0 + 1)) * kTile + lane;
          const bool vis0 = k0 + lane < e0 && k0 + lane >= begin_s[warp + kWarps * j0];
          const bool vis1 = k0 + lane < e1 && k0 + lane >= begin_s[warp + kWarps * (j0 + 1)];
          const bool act0 = e0 > k0, act1 = e1 > k0;
          float p0 = *s0, p1 = *s1;
          PairTileSoftmax(p0, p1, vis0, vis1, act0, act1, m[j0], m[j0 + 1], l[j0], l[j0 + 1],
                          corr[j0], corr[j0 + 1]);
          *s0 = p0;
          *s1 = p1;
        }
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        if (end_s[warp + kWarps * j] <= k0) continue;
#pragma unroll
        for (int e = 0; e < kDPerLane; ++e) acc[j][e] = __fmul_rn(acc[j][e], corr[j]);
      }
      // Keys in order; p is 0 past a row's last key (an exact no-op: acc is never -0).
      for (int k = 0; k < nk_max; k += 4) {
        float4 p4[kRowsPerWarp];
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j)
          p4[j] = end_s[warp + kWarps * j] > k0
                      ? *reinterpret_cast<const float4*>(s_s + (warp + kWarps * j) * kTile + k)
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          float vf[kDPerLane];
          LoadFloats<T, kDPerLane>(v_s + (k + kk) * kDMax + lane * kDPerLane, vf);
#pragma unroll
          for (int j = 0; j < kRowsPerWarp; ++j) {
            if (end_s[warp + kWarps * j] <= k0) continue;
            const float pk = kk == 0 ? p4[j].x : kk == 1 ? p4[j].y : kk == 2 ? p4[j].z : p4[j].w;
#pragma unroll
            for (int e = 0; e < kDPerLane; ++e) acc[j][e] = __fmaf_rn(pk, vf[e], acc[j][e]);
          }
        }
      }
    } else {
      // A tile reaching into the tree's window: each warp on its own rows, lane = key.
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        if (end_s[warp + kWarps * j] <= k0) continue;  // warp-uniform
        const int r = warp + kWarps * j;
        const int32_t i = (wi.row_begin + r) / group;
        const int32_t v = k0 + lane;
        const bool visible = v < end_s[r] && v >= begin_s[r];
        int64_t slot = 0;
        float sc = 0.0f;
        if (visible) {
          const int32_t pos = KeyPosition(rq, p.mask_words, i, v);
          slot = paged.SlotOf(pos);
          const T* krow = kc + (slot * p.kv_heads + kvh) * hd;
          const float* qr = q_s + r * kDMax;
          float part[kParts];
#pragma unroll
          for (int pp = 0; pp < kParts; ++pp)
            part[pp] = DotPartGlobal<T, kDMax>(qr, krow, hd, vec_loads, pp);
          sc = SoftCapLog2(__fadd_rn(__fadd_rn(part[0], part[1]), __fadd_rn(part[2], part[3])),
                           cap_log2);
        }
        float cj;
        const float pk = RowTileSoftmax(sc, visible, m[j], l[j], cj);
#pragma unroll
        for (int e = 0; e < kDPerLane; ++e) acc[j][e] = __fmul_rn(acc[j][e], cj);
        // Keys in order, their V rows loaded kBatch at a time (independent loads in flight).
        constexpr int kBatch = 8;
        const int32_t nk = min(kTile, end_s[warp + kWarps * j] - k0);
        for (int kb = 0; kb < nk; kb += kBatch) {
          float pb[kBatch], vb[kBatch][kDPerLane];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int k = kb + u;  // < kTile: nk <= kTile and kTile % kBatch == 0
            pb[u] = __shfl_sync(kFull, pk, k);
            const int64_t sl = __shfl_sync(kFull, slot, k);
            const T* vrow = vc + (sl * p.kv_heads + kvh) * hd;
#pragma unroll
            for (int e = 0; e < kDPerLane; ++e) {
              const int d = lane * kDPerLane + e;
              vb[u][e] = k < nk && d < hd ? ToFloat(vrow[d]) : 0.0f;
            }
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            if (kb + u >= nk) break;
#pragma unroll
            for (int e = 0; e < kDPerLane; ++e) acc[j][e] = __fmaf_rn(pb[u], vb[u][e], acc[j][e]);
          }
        }
      }
    }
  }

  // Results: final rows, or partial rows for the merge.
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int r = warp + kWarps * j;
    if (r >= rows) continue;
    const int32_t row = wi.row_begin + r;
    const int32_t tok = row / group;
    const int32_t h = kvh * group + row % group;
    if (rq.num_chunks == 1) {
      const int64_t t = rq.token_begin + tok;
      OutT* o = static_cast<OutT*>(p.out) + (t * p.qo_heads + h) * hd;
      const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
#pragma unroll
      for (int e = 0; e < kDPerLane; ++e) {
        const int d = lane * kDPerLane + e;
        if (d < hd) o[d] = FromFloat<OutT>(acc[j][e] * inv);
      }
    } else {
      const int64_t prow = rq.partial_begin +
                           (static_cast<int64_t>(wi.chunk) * rq.token_count + tok) * p.qo_heads + h;
      float* o = p.partial_out + prow * hd;
#pragma unroll
      for (int e = 0; e < kDPerLane; ++e) {
        const int d = lane * kDPerLane + e;
        if (d < hd) o[d] = acc[j][e];
      }
      if (lane == 0) {
        p.partial_ml[prow * 2] = m[j];
        p.partial_ml[prow * 2 + 1] = l[j];
      }
    }
  }
}

// Combines the chunks of split requests: grid (num_tokens, qo_heads), 128 threads over head_dim.
template <typename OutT>
__global__ void TreeAttentionMergeKernel(const TreeAttentionParams p) {
  const int32_t t = blockIdx.x, h = blockIdx.y;
  const TreeAttentionRequest rq = p.requests[p.token_request[t]];
  if (rq.num_chunks == 1) return;
  const int32_t i = t - rq.token_begin;
  const int32_t hd = p.head_dim;
  auto prow = [&](int32_t c) {
    return rq.partial_begin + (static_cast<int64_t>(c) * rq.token_count + i) * p.qo_heads + h;
  };
  float mx = -INFINITY;
  for (int32_t c = 0; c < rq.num_chunks; ++c) mx = fmaxf(mx, p.partial_ml[prow(c) * 2]);
  float total = 0.0f;
  if (mx != -INFINITY) {
    for (int32_t c = 0; c < rq.num_chunks; ++c) {
      const float mc = p.partial_ml[prow(c) * 2];
      if (mc != -INFINITY) total += p.partial_ml[prow(c) * 2 + 1] * exp2f(mc - mx);
    }
  }
  OutT* o = static_cast<OutT*>(p.out) + (static_cast<int64_t>(t) * p.qo_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float v = 0.0f;
    if (total > 0.0f) {
      for (int32_t c = 0; c < rq.num_chunks; ++c) {
        const float mc = p.partial_ml[prow(c) * 2];
        if (mc != -INFINITY) v += p.partial_out[prow(c) * hd + d] * exp2f(mc - mx);
      }
      v *= 1.0f / total;  // as the unsplit path: acc * (1 / l)
    }
    o[d] = FromFloat<OutT>(v);
  }
}

template <typename T, typename OutT, int kDMax>
cudaError_t LaunchTyped(const TreeAttentionParams& p, cudaStream_t stream) {
  constexpr size_t smem = Layout<T, kDMax>::kBytes;
  // Above 48 KiB a kernel must opt in (once per instantiation).
  static const cudaError_t attr =
      cudaFuncSetAttribute(reinterpret_cast<const void*>(&TreeAttentionKernel<T, OutT, kDMax>),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  if (p.num_work == 0) return cudaSuccess;
  SPECINFER_LAUNCH(dim3(p.num_work, p.kv_heads), kThreads, smem, stream,
                   TreeAttentionKernel<T, OutT, kDMax>)
  (p);
  return cudaGetLastError();
}

template <typename OutT>
cudaError_t LaunchMerge(const TreeAttentionParams& p, cudaStream_t stream) {
  SPECINFER_LAUNCH(dim3(p.num_tokens, p.qo_heads), 128, 0, stream, TreeAttentionMergeKernel<OutT>)
  (p);
  return cudaGetLastError();
}

template <typename T, typename OutT>
cudaError_t LaunchForHeadDim(const TreeAttentionParams& p, cudaStream_t stream) {
  if (p.head_dim <= 32) return LaunchTyped<T, OutT, 32>(p, stream);
  if (p.head_dim <= 64) return LaunchTyped<T, OutT, 64>(p, stream);
  if (p.head_dim <= 128) return LaunchTyped<T, OutT, 128>(p, stream);
  return LaunchTyped<T, OutT, 256>(p, stream);
}

}  // namespace

namespace {

cudaError_t Launch(const TreeAttentionParams& p, AttnType in_type, bool out_float, bool mma,
                   cudaStream_t stream) {
  if (p.head_dim <= 0 || p.head_dim > kTreeAttnMaxHeadDim || p.kv_heads <= 0 ||
      p.qo_heads % p.kv_heads != 0 || p.block_size <= 0 || p.kv_chunk <= 0 ||
      p.kv_chunk % kTile != 0 || p.num_tokens <= 0 || p.kv_heads > 65535 || p.qo_heads > 65535 ||
      p.rows_per_item != (mma ? kTreeAttnMmaRowsPerBlock : kTreeAttnRowsPerBlock) ||
      (p.any_split &&
       (p.partial_out == nullptr || p.partial_ml == nullptr || p.token_request == nullptr)))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  if (mma) {
    err = LaunchTreeAttentionMma(p, in_type, out_float, stream);
  } else {
    switch (in_type) {
      case AttnType::kF32:
        err = LaunchForHeadDim<float, float>(p, stream);
        break;
      case AttnType::kF16:
        err = out_float ? LaunchForHeadDim<__half, float>(p, stream)
                        : LaunchForHeadDim<__half, __half>(p, stream);
        break;
      case AttnType::kBF16:
        err = out_float ? LaunchForHeadDim<__nv_bfloat16, float>(p, stream)
                        : LaunchForHeadDim<__nv_bfloat16, __nv_bfloat16>(p, stream);
        break;
      default:
        return cudaErrorInvalidValue;
    }
  }
  if (err != cudaSuccess || !p.any_split) return err;
  if (out_float || in_type == AttnType::kF32) return LaunchMerge<float>(p, stream);
  return in_type == AttnType::kF16 ? LaunchMerge<__half>(p, stream)
                                   : LaunchMerge<__nv_bfloat16>(p, stream);
}

}  // namespace

cudaError_t LaunchTreeAttention(const TreeAttentionParams& p, AttnType in_type, bool out_float,
                                cudaStream_t stream) {
  return Launch(p, in_type, out_float, TreeAttentionUsesMma(in_type, p.head_dim), stream);
}

cudaError_t LaunchTreeAttentionCudaCores(const TreeAttentionParams& p, AttnType in_type,
                                         bool out_float, cudaStream_t stream) {
  return Launch(p, in_type, out_float, /*mma=*/false, stream);
}

}  // namespace specinfer::kernels
