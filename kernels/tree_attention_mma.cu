// Tree attention on tensor cores: the fp16/bf16 path of LaunchTreeAttention for head_dim 64 and
// 128 (tree_attention.cuh says what it computes, the order that makes a row's bits depend only
// on its keys, and how this path keeps it).
//
// A block: one work item (request, 64 consecutive (token, group head) rows, KV chunk) of one KV
// head, 4 warps, each with a 16-row tile (an item of at most 32 rows, e.g. a decoding token,
// gives each row tile 2 or 4 warps, each computing the output of a part of the head dims). Per
// 32-key tile a warp runs WarpTile: scores S = Q K^T (mma over
// head_dim in 16-wide steps), the online softmax of each row in the accumulator fragments, then
// O = O * corr + P V (mma, P in 16-bit parts). Tiles inside the committed prefix (every tile of a
// causal request) are shared by all rows: they stream through a ring of kStages shared-memory
// tiles filled by asynchronous copies kStages - 1 tiles ahead. The tiles reaching into a tree's
// window come last: the block then loads the request's window (the prefix keys of its first such
// tile, every window entry, a zero row) once into the same shared memory, and each warp runs
// them one token at a time (the rows of a token see the same keys) with a row map that puts the
// token's compacted keys in their tile positions. A window too large for shared memory is
// gathered per token from global memory into the warp's part of the ring instead. Those
// token-by-token tiles are what a wide tree's block spends its time on (a 64-token tree without
// GQA: 16 tokens per warp), so the plan may cut the chunks holding a window into spread items
// (TreeAttentionWorkItem::spread): 16 rows, 4 per warp, each warp's rows in the first rows of its
// mma tile: four times the blocks, a quarter of the tokens per warp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "device_types.cuh"
#include "launch.cuh"
#include "mma.cuh"
#include "tree_attention.cuh"
#include "tree_attention_internal.cuh"
#include "tree_attention_window.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kTreeAttnMmaRowsPerBlock;  // 64: 4 tiles of 16 rows
constexpr int kTile = kTreeAttnTileKv;           // 32 keys: 4 mma column tiles of 8
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kRows == kWarps * 16 && kTile == 32, "one m16 row tile per warp, 4 n8 key tiles");

// P's 16-bit parts: fp16 scales p (<= 1) by 2^15 so that the low part is a normal number (the
// accumulators carry the scale, removed exactly at the end); bf16 has float32's range.
template <typename T>
struct PTraits;
template <>
struct PTraits<__half> {
  static constexpr bool kBf16 = false;
  static constexpr int kParts = SplitPartCount(false);
  static constexpr float kScale = 32768.0f;
  static constexpr float kUnscale = 1.0f / 32768.0f;
};
template <>
struct PTraits<__nv_bfloat16> {
  static constexpr bool kBf16 = true;
  static constexpr int kParts = SplitPartCount(true);
  static constexpr float kScale = 1.0f;
  static constexpr float kUnscale = 1.0f;
};

// Shared memory (bytes). Head rows are padded to kStride elements (row bytes = 16 mod 128), so
// the fragment loads (8 rows x 4 words, or 4 rows of 2-byte pairs) hit distinct banks.
//   [kQ]    T [kRows][kStride]: the block's queries
//   [kEnd]  int32 [kRows]: where each row's keys stop in the chunk
//   [kBegin] int32 [kRows]: where they begin (0 but with a sliding window)
//   [kMap]  int32 [kWarps][kTile]: each warp's row map of its current window tile
//   [kKv]   the ring, kStages x (K tile, V tile) of T [kTile][kStride]; after the shared tiles,
//           the window pool: K rows [pool_rows][kStride], then V rows [pool_rows][kStride]
//           (or, for a window too large, each warp's gathered K and V tile)
template <int kD>
struct MmaLayout {
  static constexpr int kStride = kD + 8;
  static constexpr int kRowBytes = kStride * 2;
  static constexpr int kVecs = kD / 8;  // 16-byte vectors per head row
  static constexpr int kStages = 4;
  static constexpr int kQ = 0;
  static constexpr int kEnd = kQ + kRows * kRowBytes;
  static constexpr int kBegin = kEnd + kRows * 4;
  static constexpr int kMap = kBegin + kRows * 4;
  static constexpr int kKv = kMap + kWarps * kTile * 4;
  static constexpr int kStageBytes = 2 * kTile * kRowBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kLoadIters = kTile * kVecs / kThreads;  // per thread per tile, K and V
  static_assert(kRowBytes % 128 == 16 && kTile * kVecs % kThreads == 0, "layout");
  static_assert(kKv % 16 == 0, "16-byte aligned rows");
  static_assert(kStages >= kWarps, "the fallback gives each warp a stage");
  // Rows of the pool that fit in `bytes` of dynamic shared memory.
  static constexpr int PoolRows(int bytes) { return (bytes - kKv) / (2 * kRowBytes); }
  // Shared memory for a pool of `rows` rows.
  static constexpr int Bytes(int rows) {
    return kKv + (rows * 2 * kRowBytes > kRingBytes ? rows * 2 * kRowBytes : kRingBytes);
  }
};

// The running state of a lane's two rows (g = lane / 4 and g + 8 of its warp's 16): the
// accumulators in mma's C layout (acc[n][0..1]: row g, dims 8 n + 2 q and + 1, q = lane % 4;
// acc[n][2..3]: row g + 8), each row's max (log2 units) and sum, the same in the 4 lanes of a quad.
template <int kD, int kSplit>
struct RowState {
  float acc[kD / 8 / kSplit][4];  // this warp's share of the dims (see kSplit)
  float m[2];
  float l[2];
};

// Where a lane's ldmatrix rows are in the tile: krow[h] = the row of key 16 h + 8 (L / 16) +
// L % 8 (scores: key tiles 2h, 2h + 1), vrow[kk] = the row of key 16 kk + 8 ((L / 8) % 2) + L % 8
// (p.V: keys 16 kk .. 16 kk + 15), L the lane. A plain tile maps key c to row c; a window tile
// maps it to the pool row of the token's c-th key.
struct RowMap {
  int32_t krow[2];
  int32_t vrow[2];
};

__device__ __forceinline__ int KeyOfK(int h) {
  const int lane = threadIdx.x % 32;
  return 16 * h + 8 * (lane / 16) + lane % 8;
}
__device__ __forceinline__ int KeyOfV(int kk) {
  const int lane = threadIdx.x % 32;
  return 16 * kk + 8 * ((lane / 8) % 2) + lane % 8;
}

__device__ __forceinline__ RowMap IdentityMap() {
  return RowMap{{KeyOfK(0), KeyOfK(1)}, {KeyOfV(0), KeyOfV(1)}};
}

// The row map of a warp's window tile from map_w[c] (the row of key c).
__device__ __forceinline__ RowMap SharedMap(const int32_t* map_w) {
  return RowMap{{map_w[KeyOfK(0)], map_w[KeyOfK(1)]}, {map_w[KeyOfV(0)], map_w[KeyOfV(1)]}};
}

// One tile for the warp's 16 rows: key c of the tile is a row of k_t and v_t (rows of kStride
// elements, zero where no row sees the key) as `map` says; q_w the warp's 16 query rows. A row
// takes part where active[h] (h = 0: row g, 1: row g + 8) and sees key c where begin[h] <= k0 + c
// < end[h]; the others keep their state. nk: the keys any active row sees (1..32, warp-uniform);
// key tiles past it are not computed (their scores would be masked), and the p.V step of
// keys 16..31 is skipped when nk <= 16 (its p are all zero: adding zero products leaves the
// accumulators as they are). The arithmetic is the same for every row, whichever rows are active
// beside it, and the same for any map that gives the same keys. kSplit warps share the 16 rows,
// each computing their scores and softmax whole (the same bits) and the output of its part dim_part
// of the head dims (kD / kSplit of them).
template <typename T, int kD, int kSplit>
__device__ __forceinline__ void WarpTile(const T* q_w, const T* k_t, const T* v_t,
                                         const RowMap& map, int32_t k0, int32_t nk,
                                         const int32_t (&begin)[2], const int32_t (&end)[2],
                                         const bool (&active)[2], float qscale, float cap_log2,
                                         int dim_part, RowState<kD, kSplit>& st) {
  using L = MmaLayout<kD>;
  using P = PTraits<T>;
  const int lane = threadIdx.x % 32, q = lane % 4;
  const int half8 = 8 * ((lane / 8) % 2);  // the column half a lane addresses (K, Q)

  // Scores, 16 head dims per step in order; key tiles 2h and 2h + 1 together.
  float s[4][4];
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
  const T* q_row = q_w + (lane % 8 + half8) * L::kStride + 8 * (lane / 16);
  const T* k_row[2] = {k_t + map.krow[0] * L::kStride + half8,
                       k_t + map.krow[1] * L::kStride + half8};
  const int key_pairs = nk > 16 ? 2 : 1;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[4];
    LdMatrixX4<false>(a, q_row + 16 * ks);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h >= key_pairs) break;
      uint32_t b[4];  // key tile 2h: b[0], b[1]; 2h + 1: b[2], b[3]
      LdMatrixX4<false>(b, k_row[h] + 16 * ks);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      Mma16816<P::kBf16>(s[2 * h], a, b0);
      Mma16816<P::kBf16>(s[2 * h + 1], a, b1);
    }
  }

  // Softmax step of each row over its visible keys: the tile's max (exact in any order), one
  // rescale of the running state, p = 2^(s - max), and the tile's sum of p in a fixed order (the
  // lane's 8 in pairs, then the quad's butterfly: every lane of the quad gets the same bits).
  float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2;
      const int32_t key = k0 + 8 * n + 2 * q + (e & 1);
      const bool vis = active[h] && key < end[h] && key >= begin[h];
      s[n][e] = vis ? SoftCapLog2(__fmul_rn(s[n][e], qscale), cap_log2) : -INFINITY;
      tmax[h] = fmaxf(tmax[h], s[n][e]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(kFull, tmax[h], 1));
    tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(kFull, tmax[h], 2));
  }
  float corr[2], m_new[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // Finite unless the row has seen no key yet (a sliding window's masked start: corr and
    // every p are then 0, and the state stays as it was).
    m_new[h] = active[h] ? fmaxf(st.m[h], tmax[h]) : st.m[h];
    corr[h] = !active[h] ? 1.0f : st.m[h] == -INFINITY ? 0.0f : exp2f(st.m[h] - m_new[h]);
  }
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[n][e] = s[n][e] == -INFINITY ? 0.0f : exp2f(s[n][e] - m_new[e / 2]);
  float sum[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int e = 2 * h;
    sum[h] = __fadd_rn(__fadd_rn(__fadd_rn(s[0][e], s[0][e + 1]), __fadd_rn(s[1][e], s[1][e + 1])),
                       __fadd_rn(__fadd_rn(s[2][e], s[2][e + 1]), __fadd_rn(s[3][e], s[3][e + 1])));
    sum[h] = __fadd_rn(sum[h], __shfl_xor_sync(kFull, sum[h], 1));
    sum[h] = __fadd_rn(sum[h], __shfl_xor_sync(kFull, sum[h], 2));
    if (active[h]) {
      st.l[h] = __fmaf_rn(st.l[h], corr[h], sum[h]);
      st.m[h] = m_new[h];
    }
  }
#pragma unroll
  for (int n = 0; n < kD / 8 / kSplit; ++n) {
    st.acc[n][0] = __fmul_rn(st.acc[n][0], corr[0]);
    st.acc[n][1] = __fmul_rn(st.acc[n][1], corr[0]);
    st.acc[n][2] = __fmul_rn(st.acc[n][2], corr[1]);
    st.acc[n][3] = __fmul_rn(st.acc[n][3], corr[1]);
  }

  // O += P V, 16 keys per step in order, each step's parts of P in order. The score fragments of
  // two adjacent key tiles are the A fragment of a 16-key step (rows g, g + 8; keys 2q, 2q + 1
  // and 2q + 8, 2q + 9); V's B fragments come transposed from its [key][dim] rows.
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    if (kk >= key_pairs) break;
    float pv[8] = {s[2 * kk][0],     s[2 * kk][1],     s[2 * kk][2],     s[2 * kk][3],
                   s[2 * kk + 1][0], s[2 * kk + 1][1], s[2 * kk + 1][2], s[2 * kk + 1][3]};
#pragma unroll
    for (int i = 0; i < 8; ++i) pv[i] = __fmul_rn(pv[i], P::kScale);
    uint32_t parts[P::kParts][4];
    SplitParts<P::kBf16>(pv, parts);
    const T* v_row = v_t + map.vrow[kk] * L::kStride + dim_part * (kD / kSplit) + 8 * (lane / 16);
#pragma unroll
    for (int n2 = 0; n2 < kD / 16 / kSplit; ++n2) {
      uint32_t b[4];  // dims 16 n2 .. + 7: b[0], b[1]; + 8 .. + 15: b[2], b[3]
      LdMatrixX4<true>(b, v_row + 16 * n2);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int part = 0; part < P::kParts; ++part) {
        Mma16816<P::kBf16>(st.acc[2 * n2], parts[part], b0);
        Mma16816<P::kBf16>(st.acc[2 * n2 + 1], parts[part], b1);
      }
    }
  }
}

// One work item with `rows` rows. kWarpRows 16: kSplit warps per 16-row tile (kSplit = 4 / the
// row tiles it has, so that a decoding token or a small tree keeps every warp busy); kWarpRows 4
// (a spread item, kSplit 1): warp w owns rows 4w .. 4w + 3 in its tile's first rows (the mma's
// other rows are computed and dropped), so the window's tokens are a quarter per warp.
template <typename T, typename OutT, int kD, int kSplit, int kWarpRows>
__device__ __forceinline__ void AttendItem(const TreeAttentionParams& p,
                                           const TreeAttentionWorkItem& wi,
                                           const TreeAttentionRequest& rq, int32_t pool_rows,
                                           int32_t rows) {
  using L = MmaLayout<kD>;
  using PT = PTraits<T>;
  constexpr int kStages = L::kStages;
  SPECINFER_DYNAMIC_SHARED(float4, attn_smem);
  char* const smem = reinterpret_cast<char*>(attn_smem);
  T* const q_s = reinterpret_cast<T*>(smem + L::kQ);
  int32_t* const end_s = reinterpret_cast<int32_t*>(smem + L::kEnd);
  int32_t* const begin_s = reinterpret_cast<int32_t*>(smem + L::kBegin);
  char* const kv_s = smem + L::kKv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  int32_t* const map_w = reinterpret_cast<int32_t*>(smem + L::kMap) + warp * kTile;

  const int32_t kvh = blockIdx.y;
  const int32_t group = p.qo_heads / p.kv_heads;
  static_assert(kWarpRows == 16 || (kWarpRows == 4 && kSplit == 1), "warp layouts");
  const int dim_part = warp % kSplit;
  const int first_row = kWarpRows == 16 ? 16 * (warp / kSplit) : 4 * warp;  // the warp's rows
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const float qscale = p.scale * kLog2e;
  const float cap_log2 = p.softcap * kLog2e;  // soft-capping in base-2 units (0: none)
  const int32_t c0 = wi.chunk * p.kv_chunk;

  // Query rows (row = i * group + g: token i, head kvh * group + g), zero past the last row.
  for (int idx = threadIdx.x; idx < kRows * L::kVecs; idx += kThreads) {
    const int rr = idx / L::kVecs, d0 = (idx % L::kVecs) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (rr < rows) {
      const int32_t row = wi.row_begin + rr;
      const int64_t t = rq.token_begin + row / group;
      const int32_t h = kvh * group + row % group;
      val = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.q) + (t * p.qo_heads + h) * kD +
                                            d0);
    }
    *reinterpret_cast<uint4*>(q_s + rr * L::kStride + d0) = val;
  }
  // Where each row's virtual sequence stops in this chunk (0 past the last row) and begins.
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

  // This lane's rows in the block (mma rows g and g + 8), -1 where it has none.
  const int lane_row[2] = {kWarpRows == 16 || g < 4 ? first_row + g : -1,
                           kWarpRows == 16 ? first_row + g + 8 : -1};
  const int32_t end[2] = {lane_row[0] < 0 ? 0 : end_s[lane_row[0]],
                          lane_row[1] < 0 ? 0 : end_s[lane_row[1]]};
  const int32_t begin[2] = {lane_row[0] < 0 ? 0 : begin_s[lane_row[0]],
                            lane_row[1] < 0 ? 0 : begin_s[lane_row[1]]};
  int32_t warp_end = 0;  // where the warp's rows' keys stop
  for (int r = first_row; r < first_row + kWarpRows; ++r) warp_end = max(warp_end, end_s[r]);
  RowState<kD, kSplit> st;
#pragma unroll
  for (int n = 0; n < kD / 8 / kSplit; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) st.acc[n][e] = 0.0f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.0f;

  const bool causal = rq.mask_begin < 0;
  const PagedSlots paged = MakePagedSlots(p.block_tables + rq.block_table_begin, p.block_size);
  auto kv_offset = [&](int64_t slot, int d0) { return (slot * p.kv_heads + kvh) * kD + d0; };
  const T* const q_w = q_s + first_row * L::kStride;  // the tile's 16 rows (in the block's 64)

  // Shared tiles [c0, s_end): every tile of a causal request, else those inside the prefix.
  const int32_t tail_begin = rq.kv_prefix / kTile * kTile;  // the first window tile
  const int32_t s_end = causal ? c1 : max(c0, min(c1, tail_begin));
  const int32_t n_shared = (s_end - c0 + kTile - 1) / kTile;
  // Tiles before every row's sliding window are skipped (they would leave every state as it is:
  // no key visible, corr 1, p 0).
  const int32_t t_first = min(n_shared, max(0, first - c0) / kTile);
  auto stage_k = [&](int t) { return reinterpret_cast<T*>(kv_s + (t % kStages) * L::kStageBytes); };
  // The pages of the keys this thread copies for the next tile to issue, read a tile ahead of the
  // copies so that the page table's latency is not on their path.
  int32_t pages[L::kLoadIters];
  auto load_pages = [&](int t) {
#pragma unroll
    for (int it = 0; it < L::kLoadIters; ++it) {
      const int32_t pos = c0 + t * kTile + (threadIdx.x + kThreads * it) / L::kVecs;
      pages[it] = t < n_shared && pos < c1 ? paged.PageOf(pos) : 0;
    }
  };
  auto issue = [&](int t) {  // tile t's asynchronous copies, in its ring stage
    if (t < n_shared) {
      const int32_t t0 = c0 + t * kTile;
      T* const ks = stage_k(t);
      T* const vs = ks + kTile * L::kStride;
#pragma unroll
      for (int it = 0; it < L::kLoadIters; ++it) {
        const int idx = threadIdx.x + kThreads * it;
        const int kk = idx / L::kVecs, d0 = (idx % L::kVecs) * 8;
        const bool valid = t0 + kk < c1;
        const int64_t off = valid ? kv_offset(paged.SlotIn(pages[it], t0 + kk), d0) : 0;
        CpAsync16(ks + kk * L::kStride + d0, kc + off, valid);
        CpAsync16(vs + kk * L::kStride + d0, vc + off, valid);
      }
    }
    CpAsyncCommit();  // a group per tile, empty past the last: the waits count tiles
    load_pages(t + 1);
  };
  const RowMap identity = IdentityMap();
  load_pages(t_first);
#pragma unroll
  for (int u = 0; u < kStages - 1; ++u) issue(t_first + u);
  for (int t = t_first; t < n_shared; ++t) {
    CpAsyncWait<kStages - 2>();  // tile t has landed (this thread's part)
    __syncthreads();             // everyone's part; nobody still reads tile t - 1's stage
    issue(t + kStages - 1);      // into tile t - 1's stage
    const int32_t k0 = c0 + t * kTile;
    const bool active[2] = {end[0] > k0, end[1] > k0};
    if (warp_end > k0) {
      const T* ks = stage_k(t);
      WarpTile<T, kD, kSplit>(q_w, ks, ks + kTile * L::kStride, identity, k0,
                              min(kTile, warp_end - k0), begin, end, active, qscale, cap_log2,
                              dim_part, st);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // the ring is free

  // Tiles reaching into the tree's window: [s_end, c1).
  if (!causal && s_end < c1) {                       // block-uniform
    const int32_t tail = rq.kv_prefix - tail_begin;  // prefix keys of the first window tile
    const int32_t window = rq.masked_kv + rq.token_count;
    const bool pooled = tail + window + 1 <= pool_rows;  // block-uniform
    T* const pool_k = reinterpret_cast<T*>(kv_s);
    T* const pool_v = pool_k + pool_rows * L::kStride;
    if (pooled) {
      // Pool rows: the tail's prefix keys, the window entries, then a zero row.
      const int32_t n = tail + window + 1;
      for (int idx = threadIdx.x; idx < n * L::kVecs; idx += kThreads) {
        const int32_t row = idx / L::kVecs;
        const int d0 = (idx % L::kVecs) * 8;
        const bool valid = row < tail + window;
        const int64_t off = valid ? kv_offset(paged.SlotOf(tail_begin + row), d0) : 0;
        CpAsync16(pool_k + row * L::kStride + d0, kc + off, valid);
        CpAsync16(pool_v + row * L::kStride + d0, vc + off, valid);
      }
      CpAsyncCommit();
      CpAsyncWait<0>();
      __syncthreads();
    }
    T* const own_k = reinterpret_cast<T*>(kv_s + warp * L::kStageBytes);  // the fallback's tile
    T* const own_v = own_k + kTile * L::kStride;
    for (int32_t k0 = s_end; k0 < c1; k0 += kTile) {
      if (warp_end <= k0) break;  // warp-uniform
      for (int rr = 0; rr < kWarpRows; ++rr) {
        const int r = first_row + rr;
        if (r >= rows) break;
        const int32_t i = (wi.row_begin + r) / group;
        if (rr > 0 && (wi.row_begin + r - 1) / group == i) continue;  // its token's rows are done
        const int32_t e = end_s[r];
        if (e <= k0 || begin_s[r] >= k0 + kTile) continue;  // (a token's rows begin alike)
        // Lane c: where the token's key at virtual position k0 + c is (none past its end).
        const int32_t v = k0 + lane;
        const int32_t pos = v >= e ? -1 : KeyPosition(rq, p.mask_words, i, v);
        __syncwarp();  // the previous token's tile is no longer being read
        if (pooled) {
          map_w[lane] = pos < 0 ? tail + window : pos - tail_begin;
        } else {
          const int64_t slot = pos < 0 ? -1 : paged.SlotOf(pos);
          for (int idx = lane; idx < kTile * L::kVecs; idx += 32) {
            const int kk = idx / L::kVecs, d0 = (idx % L::kVecs) * 8;
            const int64_t sl = __shfl_sync(kFull, slot, kk);
            const int64_t off = sl >= 0 ? kv_offset(sl, d0) : 0;
            CpAsync16(own_k + kk * L::kStride + d0, kc + off, sl >= 0);
            CpAsync16(own_v + kk * L::kStride + d0, vc + off, sl >= 0);
          }
          CpAsyncCommit();
          CpAsyncWait<0>();
        }
        __syncwarp();
        const bool active[2] = {
            lane_row[0] >= 0 && lane_row[0] < rows && (wi.row_begin + lane_row[0]) / group == i,
            lane_row[1] >= 0 && lane_row[1] < rows && (wi.row_begin + lane_row[1]) / group == i};
        const int32_t nk = min(kTile, e - k0);
        if (pooled) {
          WarpTile<T, kD, kSplit>(q_w, pool_k, pool_v, SharedMap(map_w), k0, nk, begin, end, active,
                                  qscale, cap_log2, dim_part, st);
        } else {
          WarpTile<T, kD, kSplit>(q_w, own_k, own_v, identity, k0, nk, begin, end, active, qscale,
                                  cap_log2, dim_part, st);
        }
      }
    }
  }

  // Results: final rows, or partial rows (and max, sum) for the merge; each warp its dims.
  const int dim0 = dim_part * (kD / kSplit);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane_row[h];
    if (r < 0 || r >= rows) continue;
    const int32_t row = wi.row_begin + r;
    const int32_t tok = row / group;
    const int32_t head = kvh * group + row % group;
    if (rq.num_chunks == 1) {
      const int64_t t = rq.token_begin + tok;
      OutT* o = static_cast<OutT*>(p.out) + (t * p.qo_heads + head) * kD;
      const float inv = st.l[h] > 0.0f ? 1.0f / st.l[h] : 0.0f;
#pragma unroll
      for (int n = 0; n < kD / 8 / kSplit; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          o[dim0 + 8 * n + 2 * q + j] =
              FromFloat<OutT>(__fmul_rn(__fmul_rn(st.acc[n][2 * h + j], PT::kUnscale), inv));
    } else {
      const int64_t prow = rq.partial_begin +
                           (static_cast<int64_t>(wi.chunk) * rq.token_count + tok) * p.qo_heads +
                           head;
      float* o = p.partial_out + prow * kD;
#pragma unroll
      for (int n = 0; n < kD / 8 / kSplit; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          o[dim0 + 8 * n + 2 * q + j] = __fmul_rn(st.acc[n][2 * h + j], PT::kUnscale);
      if (q == 0 && dim_part == 0) {
        p.partial_ml[prow * 2] = st.m[h];
        p.partial_ml[prow * 2 + 1] = st.l[h];
      }
    }
  }
}

template <typename T, typename OutT, int kD>
__global__ void __launch_bounds__(kThreads, 2)
    TreeAttentionMmaKernel(const TreeAttentionParams p, int32_t pool_rows) {
  const TreeAttentionWorkItem wi = p.work[blockIdx.x];
  const TreeAttentionRequest rq = p.requests[wi.request];
  const int32_t rows = min(wi.spread ? kTreeAttnSpreadRows : kRows,
                           rq.token_count * (p.qo_heads / p.kv_heads) - wi.row_begin);
  if (wi.spread) {
    AttendItem<T, OutT, kD, 1, 4>(p, wi, rq, pool_rows, rows);
  } else if (rows <= 16) {
    AttendItem<T, OutT, kD, 4, 16>(p, wi, rq, pool_rows, rows);
  } else if (rows <= 32) {
    AttendItem<T, OutT, kD, 2, 16>(p, wi, rq, pool_rows, rows);
  } else {
    AttendItem<T, OutT, kD, 1, 16>(p, wi, rq, pool_rows, rows);
  }
}

template <typename T, typename OutT, int kD>
cudaError_t LaunchTyped(const TreeAttentionParams& p, cudaStream_t stream) {
  using L = MmaLayout<kD>;
  // The kernel may take all the shared memory a block can have (opt-in, set once); the pool is
  // sized for the plan's largest window, within that.
  static int limit = 0;
  static const cudaError_t attr = [] {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(reinterpret_cast<const void*>(&TreeAttentionMmaKernel<T, OutT, kD>),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
    return e;
  }();
  if (attr != cudaSuccess) return attr;
  if (L::Bytes(0) > limit) return cudaErrorInvalidConfiguration;
  if (p.num_work == 0) return cudaSuccess;
  // The ring's memory holds a pool of 128 rows; a larger window takes more, up to the limit.
  const int32_t pool_rows = std::max(L::PoolRows(L::Bytes(0)),
                                     std::min<int32_t>(p.max_window + kTile, L::PoolRows(limit)));
  const size_t smem = static_cast<size_t>(L::Bytes(pool_rows));
  SPECINFER_LAUNCH(dim3(p.num_work, p.kv_heads), kThreads, smem, stream,
                   TreeAttentionMmaKernel<T, OutT, kD>)
  (p, pool_rows);
  return cudaGetLastError();
}

template <typename T, typename OutT>
cudaError_t LaunchForHeadDim(const TreeAttentionParams& p, cudaStream_t stream) {
  return p.head_dim == 64 ? LaunchTyped<T, OutT, 64>(p, stream)
                          : LaunchTyped<T, OutT, 128>(p, stream);
}

}  // namespace

cudaError_t LaunchTreeAttentionMma(const TreeAttentionParams& p, AttnType in_type, bool out_float,
                                   cudaStream_t stream) {
  // 16-byte loads of q, K and V rows.
  if (!TreeAttentionUsesMma(in_type, p.head_dim) ||
      (reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.k_cache) |
       reinterpret_cast<uintptr_t>(p.v_cache)) %
              16 !=
          0)
    return cudaErrorInvalidValue;
  if (in_type == AttnType::kF16)
    return out_float ? LaunchForHeadDim<__half, float>(p, stream)
                     : LaunchForHeadDim<__half, __half>(p, stream);
  return out_float ? LaunchForHeadDim<__nv_bfloat16, float>(p, stream)
                   : LaunchForHeadDim<__nv_bfloat16, __nv_bfloat16>(p, stream);
}

}  // namespace specinfer::kernels
