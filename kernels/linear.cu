#include <algorithm>
#include <atomic>

#include "device_types.cuh"
#include "kquant.cuh"
#include "launch.cuh"
#include "linear.cuh"
#include "mma.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Floats of activations a staged block holds per chunk (kTok tokens x chunk columns): 32 KiB,
// under the 48 KiB a launch may ask for without opting in, and 4 blocks still fit an SM.
constexpr int kStageFloats = 8192;

// Block types (K-quants included): a lane's step is one 32-element block or K-quant group.
__host__ __device__ constexpr bool IsQuant(ElemType t) { return ElemBlockElems(t) > 1; }
// Columns a lane sums contiguously per step: 8 (16 bytes of fp16), one 32-element block or one
// 32-element group of a K-quant super-block.
__host__ __device__ constexpr int GroupOf(ElemType t) { return IsQuant(t) ? 32 : 8; }
// Columns of x staged per chunk. A multiple of 32 groups (a whole warp step), so a chunk boundary
// never moves a column to another lane or changes the order in which a lane visits its columns.
__host__ __device__ constexpr int ChunkOf(ElemType t, int tok) {
  return kStageFloats / tok / (GroupOf(t) * 32) * (GroupOf(t) * 32);
}
// Staged layout, in float4s: per token, GroupOf / 4 planes of (chunk / GroupOf + 1); float4 q of
// group g of the chunk is at q * plane + g. A warp's lanes read consecutive groups, so each
// 16-byte load of a quarter warp hits 8 distinct bank quads (no conflicts); the + 1 staggers the
// planes for the stores.
__host__ __device__ constexpr int PlaneOf(ElemType t, int tok) {
  return ChunkOf(t, tok) / GroupOf(t) + 1;
}
__host__ __device__ constexpr int TokStrideOf(ElemType t, int tok) {
  return GroupOf(t) / 4 * PlaneOf(t, tok);
}
__host__ __device__ constexpr int StageBytes(ElemType t, int tok) {
  return tok * TokStrideOf(t, tok) * 16;
}

// Activations of the current token tile, straight from global memory (decode: one token, whose
// 16 KiB stay in L1).
struct GlobalX {
  const float* x;  // [tile tokens, cols], the tile's first token
  int64_t cols;
  __device__ __forceinline__ float4 Get4(int t, int64_t c) const {
    return *reinterpret_cast<const float4*>(x + t * cols + c);
  }
  __device__ __forceinline__ float Get1(int t, int64_t c) const { return x[t * cols + c]; }
};

// Activations of the current token tile and column chunk [k0, k0 + chunk), from shared memory.
template <ElemType W, int kTok>
struct SharedX {
  static constexpr int kGroup = GroupOf(W), kChunk = ChunkOf(W, kTok);
  static constexpr int kPlane = PlaneOf(W, kTok), kTokStride = TokStrideOf(W, kTok);
  const float4* s;
  int64_t k0;
  __device__ __forceinline__ float4 Get4(int t, int64_t c) const {
    const int lc = static_cast<int>(c - k0);
    return s[t * kTokStride + lc % kGroup / 4 * kPlane + lc / kGroup];
  }
  // Column-wise layout [kTok, kChunk] floats, used when cols is not a multiple of the group.
  __device__ __forceinline__ float Get1(int t, int64_t c) const {
    return reinterpret_cast<const float*>(s)[t * kChunk + static_cast<int>(c - k0)];
  }

  // The whole block copies tokens [0, nt) x columns [k0, k0 + kw) of x (the tile's first token)
  // into s. vec: cols is a multiple of the group, so rows of x are 16-byte aligned.
  __device__ __forceinline__ static void Stage(float4* s, const float* x, int64_t cols, int nt,
                                               int64_t k0, int kw, bool vec) {
    if (vec && kw == kChunk) {
      // Full chunk (all but the last): each thread copies fixed columns of every token, without
      // divisions.
      constexpr int kPer = kChunk / 4;  // float4s per token, a multiple of kThreads
      static_assert(kPer % kThreads == 0);
#pragma unroll 4
      for (int t = 0; t < nt; ++t) {
#pragma unroll
        for (int j = 0; j < kPer / kThreads; ++j) {
          const int lc = (j * kThreads + static_cast<int>(threadIdx.x)) * 4;
          s[t * kTokStride + lc % kGroup / 4 * kPlane + lc / kGroup] =
              *reinterpret_cast<const float4*>(x + t * cols + k0 + lc);
        }
      }
    } else if (vec) {
      const int per = kw / 4;
      for (int i = threadIdx.x; i < nt * per; i += kThreads) {
        const int t = i / per, lc = i % per * 4;
        s[t * kTokStride + lc % kGroup / 4 * kPlane + lc / kGroup] =
            *reinterpret_cast<const float4*>(x + t * cols + k0 + lc);
      }
    } else {
      float* sf = reinterpret_cast<float*>(s);
      for (int i = threadIdx.x; i < nt * kw; i += kThreads) {
        const int t = i / kw, lc = i % kw;
        sf[t * kChunk + lc] = x[t * cols + k0 + lc];
      }
    }
  }
};

__host__ __device__ constexpr bool IsQ5(ElemType t) {
  return t == ElemType::kQ5_0 || t == ElemType::kQ5_1;
}
// Whether a block's elements are d * q + m (the minimum m factors out: m * sum x).
__host__ __device__ constexpr bool HasMin(ElemType t) {
  return t == ElemType::kQ4_1 || t == ElemType::kQ5_1;
}
// 32-bit words of packed quants per block: Q8_0 one byte per element, Q4 one nibble, Q5 a nibble
// and (a fifth word) the 32 high bits.
__host__ __device__ constexpr int QuantWords(ElemType t) {
  return t == ElemType::kQ8_0 ? 8 : IsQ5(t) ? 5 : 4;
}

// Block b of a row: its quants packed 4 bytes to a word (blocks are only 2-byte aligned, so read
// as 16-bit halves), its scale d and, for Q4_1/Q5_1, its minimum m (element j is d * q_j (+ m)).
// Q5: words 0-3 are the nibbles, word 4 the high bits (qh).
template <ElemType W>
__device__ __forceinline__ void LoadQuantBlock(const uint8_t* wrow, int64_t b,
                                               uint32_t (&wd)[QuantWords(W)], float& d, float& m) {
  const uint16_t* p;
  m = 0.0f;
  if constexpr (W == ElemType::kQ8_0) {
    const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(wrow) + b;
    d = HalfBitsToFloat(blk->d);
    p = reinterpret_cast<const uint16_t*>(blk->qs);
  } else if constexpr (W == ElemType::kQ4_0) {
    const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(wrow) + b;
    d = HalfBitsToFloat(blk->d);
    p = reinterpret_cast<const uint16_t*>(blk->qs);
  } else if constexpr (IsQ5(W)) {
    const uint8_t* qh;
    if constexpr (W == ElemType::kQ5_0) {
      const BlockQ5_0* blk = reinterpret_cast<const BlockQ5_0*>(wrow) + b;
      d = HalfBitsToFloat(blk->d);
      qh = blk->qh;
      p = reinterpret_cast<const uint16_t*>(blk->qs);
    } else {
      const BlockQ5_1* blk = reinterpret_cast<const BlockQ5_1*>(wrow) + b;
      d = HalfBitsToFloat(blk->d);
      m = HalfBitsToFloat(blk->m);
      qh = blk->qh;
      p = reinterpret_cast<const uint16_t*>(blk->qs);
    }
    const uint16_t* h = reinterpret_cast<const uint16_t*>(qh);
    wd[4] = static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;
  } else {
    const BlockQ4_1* blk = reinterpret_cast<const BlockQ4_1*>(wrow) + b;
    d = HalfBitsToFloat(blk->d);
    m = HalfBitsToFloat(blk->m);
    p = reinterpret_cast<const uint16_t*>(blk->qs);
  }
  // The packed quants (Q5: its nibbles; the high bits are word 4, above).
#pragma unroll
  for (int k = 0; k < (W == ElemType::kQ8_0 ? 8 : 4); ++k)
    wd[k] = static_cast<uint32_t>(p[2 * k]) | static_cast<uint32_t>(p[2 * k + 1]) << 16;
}

// Quant of element 4 * j + e (j < 8, e < 4) of a block, as float. Q8_0: byte 4j + e. Q4: for
// element i < 16 the low nibble of byte i, for i >= 16 the high nibble of byte i - 16. Q5: that
// nibble and bit i of qh as its fifth bit.
template <ElemType W>
__device__ __forceinline__ float QuantAt(const uint32_t (&wd)[QuantWords(W)], int j, int e) {
  if constexpr (W == ElemType::kQ8_0) {
    return static_cast<float>(static_cast<int8_t>((wd[j] >> (8 * e)) & 0xff));
  } else if constexpr (IsQ5(W)) {
    const int i = 4 * j + e;
    const uint32_t v = ((wd[j & 3] >> (8 * e + (j >= 4 ? 4 : 0))) & 15) | ((wd[4] >> i) & 1) << 4;
    return static_cast<float>(v) - (W == ElemType::kQ5_0 ? 16.0f : 0.0f);
  } else {
    const uint32_t v = (wd[j & 3] >> (8 * e + (j >= 4 ? 4 : 0))) & 15;
    return static_cast<float>(v) - (W == ElemType::kQ4_0 ? 8.0f : 0.0f);
  }
}

// Elements [c, c + 8) of a row of type W (16-byte aligned), as float.
template <ElemType W>
__device__ __forceinline__ void LoadRow8(const uint8_t* wrow, int64_t c, float (&wf)[8]) {
  if constexpr (W == ElemType::kF32) {
    const float4 a = *reinterpret_cast<const float4*>(wrow + c * 4);
    const float4 b = *reinterpret_cast<const float4*>(wrow + c * 4 + 16);
    wf[0] = a.x, wf[1] = a.y, wf[2] = a.z, wf[3] = a.w;
    wf[4] = b.x, wf[5] = b.y, wf[6] = b.z, wf[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(wrow + c * 2);
    const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (W == ElemType::kF16) {
        wf[i] = __half2float(__ushort_as_half(h[i]));
      } else {
        wf[i] = __uint_as_float(static_cast<uint32_t>(h[i]) << 16);
      }
    }
  }
}

// acc[i][t] += this lane's share of columns [k0, k1) of row i times token t, for t < nt. The
// share and its order are fixed by the column alone: groups lane, lane + 32, ... of the row
// (k0 is a multiple of a warp step), each summed in order with explicit FMAs.
template <ElemType W, int kRw, int kTok, typename X>
__device__ __forceinline__ void DotChunk(const X& xs, const uint8_t* (&wrow)[kRw], int64_t k0,
                                         int64_t k1, int nt, bool vec, int lane,
                                         float (&acc)[kRw][kTok]) {
  if constexpr (IsKQuant(W)) {
    // One 32-element group of a super-block per lane per step. Its weights are computed exactly
    // as the CPU dequantises them (kquant.cuh) and multiply-added in column order, as the float
    // types do: the K-quants' two-level scales do not factor out of a group as Q4_1's do.
    for (int64_t gi = k0 / 32 + lane; gi * 32 < k1; gi += 32) {
      const int64_t c = gi * 32;
      uint32_t wd[kRw][8];
      float dl[kRw][2], ml[kRw][2];
#pragma unroll
      for (int i = 0; i < kRw; ++i)
        LoadKGroup<W>(wrow[i], gi / 8, static_cast<int>(gi % 8), wd[i], dl[i], ml[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float wf[kRw][4];
#pragma unroll
        for (int i = 0; i < kRw; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            wf[i][e] = KWeight<W>(dl[i][j / 4], ml[i][j / 4], wd[i][j], e);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t < nt) {
            const float4 a = xs.Get4(t, c + 4 * j);
#pragma unroll
            for (int i = 0; i < kRw; ++i) {
              float s = acc[i][t];
              s = __fmaf_rn(wf[i][0], a.x, s);
              s = __fmaf_rn(wf[i][1], a.y, s);
              s = __fmaf_rn(wf[i][2], a.z, s);
              s = __fmaf_rn(wf[i][3], a.w, s);
              acc[i][t] = s;
            }
          }
        }
      }
    }
  } else if constexpr (IsQuant(W)) {
    // One 32-element block per lane per step: sum_j q_j x_j, scaled once per block. The loop
    // runs over the block's 8 float4s of x, each read once and used for all kRw rows.
    for (int64_t b = k0 / 32 + lane; b * 32 < k1; b += 32) {
      const int64_t c = b * 32;
      uint32_t wd[kRw][QuantWords(W)];
      float d[kRw], m[kRw];
#pragma unroll
      for (int i = 0; i < kRw; ++i) LoadQuantBlock<W>(wrow[i], b, wd[i], d[i], m[i]);
      float s[kRw][kTok], sx[kTok];
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        sx[t] = 0.0f;
#pragma unroll
        for (int i = 0; i < kRw; ++i) s[i][t] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float q[kRw][4];
#pragma unroll
        for (int i = 0; i < kRw; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) q[i][e] = QuantAt<W>(wd[i], j, e);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t < nt) {
            const float4 a = xs.Get4(t, c + 4 * j);
#pragma unroll
            for (int i = 0; i < kRw; ++i) {
              s[i][t] = __fmaf_rn(q[i][0], a.x, s[i][t]);
              s[i][t] = __fmaf_rn(q[i][1], a.y, s[i][t]);
              s[i][t] = __fmaf_rn(q[i][2], a.z, s[i][t]);
              s[i][t] = __fmaf_rn(q[i][3], a.w, s[i][t]);
            }
            if constexpr (HasMin(W))
              sx[t] = __fadd_rn(sx[t], __fadd_rn(__fadd_rn(a.x, a.y), __fadd_rn(a.z, a.w)));
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kRw; ++i)
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t < nt) {
            acc[i][t] = __fmaf_rn(d[i], s[i][t], acc[i][t]);
            if constexpr (HasMin(W)) acc[i][t] = __fmaf_rn(m[i], sx[t], acc[i][t]);
          }
        }
    }
  } else if (vec) {
    // 8 columns (16 bytes of fp16) per lane per step; the activations loaded for a token serve
    // all kRw rows, the weights all kTok tokens.
#pragma unroll 2
    for (int64_t c = k0 + lane * 8; c < k1; c += 256) {
      float wf[kRw][8];
#pragma unroll
      for (int i = 0; i < kRw; ++i) LoadRow8<W>(wrow[i], c, wf[i]);
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t < nt) {
          const float4 a = xs.Get4(t, c), b = xs.Get4(t, c + 4);
#pragma unroll
          for (int i = 0; i < kRw; ++i) {
            float s = acc[i][t];
            s = __fmaf_rn(wf[i][0], a.x, s);
            s = __fmaf_rn(wf[i][1], a.y, s);
            s = __fmaf_rn(wf[i][2], a.z, s);
            s = __fmaf_rn(wf[i][3], a.w, s);
            s = __fmaf_rn(wf[i][4], b.x, s);
            s = __fmaf_rn(wf[i][5], b.y, s);
            s = __fmaf_rn(wf[i][6], b.z, s);
            s = __fmaf_rn(wf[i][7], b.w, s);
            acc[i][t] = s;
          }
        }
      }
    }
  } else {
    // cols not a multiple of 8: column lane, lane + 32, ... one at a time.
    for (int64_t c = k0 + lane; c < k1; c += 32) {
      float wv[kRw];
#pragma unroll
      for (int i = 0; i < kRw; ++i) wv[i] = LoadElement(W, wrow[i], c);
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t < nt) {
          const float xv = xs.Get1(t, c);
#pragma unroll
          for (int i = 0; i < kRw; ++i) acc[i][t] = __fmaf_rn(wv[i], xv, acc[i][t]);
        }
      }
    }
  }
}

// Blocks per SM that ptxas must fit (caps registers, without spills on sm_90): decode as many as
// the old one-row kernel got (12 caps it at 42 registers; it needs 32-40), the K-quants 8 (64:
// Q3_K's two bit planes spill at 40); float types 4 at 8 tokens (128 registers), 3 at 16 (168);
// Q4 3; Q8_0 and the K-quants 2 (233-255: 4 rows of 32 unpacked bytes, plus the K-quants'
// scales); Q5_0 3, Q5_1 2 (its high-bit words and minimum spill 8-16 bytes at 3).
__host__ __device__ constexpr int MinBlocksOf(ElemType t, int tok, bool staged) {
  if (!staged) return IsKQuant(t) ? 8 : 12;
  return t == ElemType::kQ8_0 || t == ElemType::kQ5_1 || IsKQuant(t) ? 2
         : IsQuant(t) || tok > 8                                     ? 3
                                                                     : 4;
}

// A warp computes rows [r0, r0 + kRw) for tiles of kTok tokens in turn. kStaged: the block
// copies each (token tile, column chunk) of x into shared memory once and its four warps read
// it from there; otherwise x comes from global memory (decode).
template <ElemType W, int kRw, int kTok, bool kStaged>
__global__ void __launch_bounds__(kThreads, MinBlocksOf(W, kTok, kStaged))
    LinearKernel(const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
                 const float* __restrict__ x, int32_t n, float* y, float beta) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRw;
  if (!kStaged && r0 >= rows) return;  // no barriers to keep
  const int64_t row_bytes = ElemRowBytes(W, cols);
  // Rows past the end read the last row (never written back): every warp reaches the barriers.
  const uint8_t* wrow[kRw];
#pragma unroll
  for (int i = 0; i < kRw; ++i) wrow[i] = w + (r0 + i < rows ? r0 + i : rows - 1) * row_bytes;
  const bool vec = cols % GroupOf(W) == 0;  // always, for the block types
  const int64_t chunk = kStaged ? ChunkOf(W, kTok) : cols;
  [[maybe_unused]] float4* stage = nullptr;
  if constexpr (kStaged) {
    SPECINFER_DYNAMIC_SHARED(float4, smem);
    stage = smem;
  }

  // Each token tile reads the block's weight rows again: from L2 when they still fit there.
  for (int t0 = 0; t0 < n; t0 += kTok) {
    const int nt = min(kTok, n - t0);
    const float* xt = x + static_cast<int64_t>(t0) * cols;
    float acc[kRw][kTok];
#pragma unroll
    for (int i = 0; i < kRw; ++i)
#pragma unroll
      for (int t = 0; t < kTok; ++t) acc[i][t] = 0.0f;

    for (int64_t k0 = 0; k0 < cols; k0 += chunk) {
      const int64_t k1 = k0 + chunk < cols ? k0 + chunk : cols;
      if constexpr (kStaged) {
        __syncthreads();  // every warp is done with the previous chunk
        SharedX<W, kTok>::Stage(stage, xt, cols, nt, k0, static_cast<int>(k1 - k0), vec);
        __syncthreads();
        if (r0 < rows)
          DotChunk<W, kRw, kTok>(SharedX<W, kTok>{stage, k0}, wrow, k0, k1, nt, vec, lane, acc);
      } else {
        DotChunk<W, kRw, kTok>(GlobalX{xt, cols}, wrow, k0, k1, nt, vec, lane, acc);
      }
    }

#pragma unroll
    for (int i = 0; i < kRw; ++i)
#pragma unroll
      for (int t = 0; t < kTok; ++t) acc[i][t] = WarpSum(acc[i][t]);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < kRw; ++i) {
        if (r0 + i >= rows) break;
        for (int t = 0; t < nt; ++t) {
          float* out = y + static_cast<int64_t>(t0 + t) * rows + r0 + i;
          *out = beta == 0.0f ? acc[i][t] : __fmaf_rn(beta, *out, acc[i][t]);
        }
      }
    }
  }  // token tiles
}

template <ElemType W, int kRw, int kTok, bool kStaged>
cudaError_t LaunchShape(const void* w, int64_t rows, int64_t cols, const float* x, int32_t n,
                        float* y, float beta, cudaStream_t stream) {
  constexpr int kBlockRows = kWarps * kRw;
  if ((rows + kBlockRows - 1) / kBlockRows > 0x7fffffff) return cudaErrorInvalidValue;
  const unsigned gx = static_cast<unsigned>((rows + kBlockRows - 1) / kBlockRows);
  const size_t shared = kStaged ? StageBytes(W, kTok) : 0;
  SPECINFER_LAUNCH(dim3(gx, 1), dim3(kThreads), shared, stream, LinearKernel<W, kRw, kTok, kStaged>)
  (static_cast<const uint8_t*>(w), rows, cols, x, n, y, beta);
  return cudaGetLastError();
}

// Shapes by token count. Any choice gives the same bits (the order of additions does not depend
// on it); it only trades weight traffic against activation traffic and registers.
template <ElemType W>
cudaError_t LaunchTyped(const void* w, int64_t rows, int64_t cols, const float* x, int32_t n,
                        float* y, float beta, cudaStream_t stream) {
  static_assert(StageBytes(W, 8) <= 48 * 1024);
  // Decode: pure weight bandwidth; one row per warp and many blocks, x from L1.
  if (n == 1) return LaunchShape<W, 1, 1, false>(w, rows, cols, x, n, y, beta, stream);
  // Trees: 4 rows per warp, so each staged activation read serves 4 weight rows.
  // Larger trees, float types: 16 tokens per tile, so the weights are read (mostly from L2) half
  // as often. A block type's chunk must give every lane one 32-element block (1024 columns),
  // which leaves room for 8 tokens in the 32 KiB.
  if constexpr (IsQuant(W)) {
    return LaunchShape<W, 4, 8, true>(w, rows, cols, x, n, y, beta, stream);
  } else {
    static_assert(StageBytes(W, 16) <= 48 * 1024);
    if (n <= 8) return LaunchShape<W, 4, 8, true>(w, rows, cols, x, n, y, beta, stream);
    return LaunchShape<W, 4, 16, true>(w, rows, cols, x, n, y, beta, stream);
  }
}

// ---- Tensor-core path: F16 and BF16 weights, cols a multiple of 32 ----
//
// The float32 activations are split into 16-bit parts whose sum is x to about float32 precision,
// and each part goes through the tensor cores against the (exact) 16-bit weights:
//   F16:  x s = hi + lo, hi = fp16(x s), lo = fp16(x s - hi), s = 2^(14 - e) a per-token power of
//         two that puts max |x s| in [2^13, 2^14) (fp16 would overflow at 65504 otherwise);
//         y = (W hi + W lo) / s, exact division.
//   BF16: x = hi + mid + lo, three bf16 roundings of what remains (bf16 has float32's range).
// Order of additions for y[t, r], fixed by `cols` alone: the columns are cut into 32-column steps,
// step k belongs to partition k % kMmaWarps; a partition's steps go in increasing order through
// the tensor cores (each step: parts in order, two m16n8k16 products each, accumulating), and
// the kMmaWarps partition sums are added in partition order. Neither the token count, the
// token's place nor the shape chosen below changes it: batch-invariant, as the CUDA-core path.
// Within a step a lane's 16-byte loads hold columns c..c+7 of its row; the tensor cores see them
// permuted (columns c..c+3 as k = 2q, 2q+1, 2q+8, 2q+9 of the first product, c+4..c+7 of the
// second), the same permutation for weights and activations, so the products are W x exactly.
// Shape: a block of kMmaWarps warps owns 16 * kM rows and 8 * kT tokens; warp p computes
// partition p for all of them, and the block adds the partitions through shared memory.

constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;

__host__ __device__ constexpr bool UsesMma(ElemType t, int64_t cols) {
  return (t == ElemType::kF16 || t == ElemType::kBF16) && cols % 32 == 0;
}

// log2 of the F16 scale of a token whose largest |x| is max_abs: max_abs 2^shift in [2^13, 2^14)
// (0 for zeros or infinities).
__device__ __forceinline__ int ScaleShift(float max_abs) {
  if (!(max_abs > 0.0f && max_abs <= 3.4e38f)) return 0;
  int e = 0;
  (void)frexpf(max_abs, &e);  // max_abs = f 2^e, f in [0.5, 1)
  return max(-100, min(100, 14 - e));
}

// Where the pre-split activations start in the scratch (floats; 16-byte aligned): after the F16
// scales, scale[t] and scale[n + t] = 1 / scale[t].
__host__ __device__ constexpr int64_t PartsOffset(int32_t n) {
  return (2 * int64_t{n} + 3) / 4 * 4;
}

// For more than 8 tokens the activations are split once, here, rather than by every block of the
// product: parts[p][t][c] (16-bit), p < 2 (F16) or 3 (BF16), by the same arithmetic as the
// product kernel's own split (SplitParts), so either gives the same bits. F16 first finds
// scale[t] = 2^(14 - e) with max_c |x[t, c]| in [2^(e-1), 2^e) (1 for a token of zeros or with
// infinities; NaNs are passed over), and scale[n + t] = 1 / scale[t]. One block per token.
template <bool kBf16>
__global__ void __launch_bounds__(256)
    SplitKernel(const float* __restrict__ x, int64_t cols, int32_t n, float* __restrict__ scale,
                uint16_t* __restrict__ parts) {
  const int t = blockIdx.x;
  const float* xt = x + static_cast<int64_t>(t) * cols;
  float s = 1.0f;
  if constexpr (!kBf16) {
    float m = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += 256) m = fmaxf(m, fabsf(xt[c]));
    m = WarpMax(m);
    __shared__ float part[8];
    __shared__ float block_scale;
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 1; i < 8; ++i) m = fmaxf(m, part[i]);
      const int shift = ScaleShift(m);
      block_scale = scale[t] = ldexpf(1.0f, shift);
      scale[n + t] = ldexpf(1.0f, -shift);
    }
    __syncthreads();
    s = block_scale;
  }
  constexpr int kParts = kBf16 ? 3 : 2;
  for (int64_t c = threadIdx.x * 8; c < cols; c += 256 * 8) {
    const float4 x0 = *reinterpret_cast<const float4*>(xt + c);
    const float4 x1 = *reinterpret_cast<const float4*>(xt + c + 4);
    float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    if constexpr (!kBf16) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(v[i], s);
    }
    uint32_t p[kParts][4];
    SplitParts<kBf16>(v, p);
#pragma unroll
    for (int k = 0; k < kParts; ++k) {
      *reinterpret_cast<uint4*>(parts + (static_cast<int64_t>(k) * n + t) * cols + c) =
          make_uint4(p[k][0], p[k][1], p[k][2], p[k][3]);
    }
  }
}

// A lane's weight rows for kM 16-row tiles from row r0: rows g and g + 8 of each (past the end:
// the last row, never written back).
template <int kM>
__device__ __forceinline__ void WeightRows(const uint16_t* w, int64_t rows, int64_t cols,
                                           int64_t r0, int g, const uint16_t* (&wr)[kM][2]) {
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = r0 + 16 * m + 8 * h + g;
      wr[m][h] = w + (r < rows ? r : rows - 1) * cols;
    }
}

// The A fragments of one 32-column step at column c (= step * 32 + 8 q): each row's columns
// c..c+7 in one 16-byte load, c..c+3 for the first product, c+4..c+7 for the second (see above).
template <int kM>
__device__ __forceinline__ void LoadWeightStep(const uint16_t* (&wr)[kM][2], int64_t c,
                                               uint32_t (&a)[kM][2][4]) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const uint4 r = *reinterpret_cast<const uint4*>(wr[m][0] + c);
    const uint4 v = *reinterpret_cast<const uint4*>(wr[m][1] + c);
    a[m][0][0] = r.x, a[m][0][1] = v.x, a[m][0][2] = r.y, a[m][0][3] = v.y;
    a[m][1][0] = r.z, a[m][1][1] = v.z, a[m][1][2] = r.w, a[m][1][3] = v.w;
  }
}

// Blocks per SM ptxas must fit (no spills on sm_80/sm_90): 2 (128 registers) for one row tile
// (decode's prefetched weights and activations), one for two (their 64 accumulators). A 4096-row
// matrix has 256 blocks of one row tile: about 2 per SM of an H100 anyway.
template <ElemType W, int kM, int kT>
__global__ void __launch_bounds__(kMmaThreads, kM == 1 ? 2 : 1)
    LinearMmaKernel(const uint16_t* __restrict__ w, int64_t rows, int64_t cols,
                    const float* __restrict__ x, int32_t n, const float* __restrict__ scale,
                    const uint16_t* __restrict__ split, float* y, float beta) {
  constexpr bool kBf16 = W == ElemType::kBF16;
  constexpr int kParts = kBf16 ? 3 : 2;
  // More than 8 tokens: the activations come split (SplitKernel); else the block splits them.
  constexpr bool kPreSplit = kT > 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16 * kM;
  const int t0 = static_cast<int>(blockIdx.y) * 8 * kT;

  // This lane's weight rows; its B-fragment token is g of each 8-token tile.
  const uint16_t* wr[kM][2];
  WeightRows<kM>(w, rows, cols, r0, g, wr);
  // F16 scales: for up to 8 tokens the block computes its tokens' own (a maximum is exact, so
  // they equal SplitKernel's), which saves a dependent launch per product on the decode path;
  // else from `scale` (SplitKernel). The weights of the first steps are asked into L2 first,
  // so the scan's latency overlaps their fetch.
  constexpr bool kOwnScale = !kBf16 && kT == 1;
  __shared__ float own_scale[kOwnScale ? 2 : 1][kOwnScale ? 8 * kT : 1];
  if constexpr (kOwnScale) {
    for (int64_t k = warp, u = 0; u < 4 && k < cols / 32; ++u, k += kMmaWarps) {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        PrefetchL2(wr[m][0] + k * 32 + q * 8);
        PrefetchL2(wr[m][1] + k * 32 + q * 8);
      }
    }
  }
  // Launched as a dependent of the previous kernel (decode, sm_90): the weights above may be
  // fetched while it runs; the activations and the output only after it is done.
  GridDependencyWait();
  if constexpr (kOwnScale) {
    // `per` warps share a token (all 8 for decode).
    __shared__ float warp_max[kMmaWarps];
    const int nt = min(8, n - t0);
    const int per = nt == 1 ? 8 : nt == 2 ? 4 : nt <= 4 ? 2 : 1;
    const int j = warp / per;
    float m = 0.0f;
    if (j < nt) {
      const float4* xt = reinterpret_cast<const float4*>(x + static_cast<int64_t>(t0 + j) * cols);
      for (int64_t i = warp % per * 32 + lane; i < cols / 4; i += per * 32) {
        const float4 v = xt[i];
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
      }
    }
    m = WarpMax(m);
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    const int tid = static_cast<int>(threadIdx.x);
    if (tid < nt) {
      m = 0.0f;
      for (int w = tid * per; w < (tid + 1) * per; ++w) m = fmaxf(m, warp_max[w]);
      const int shift = ScaleShift(m);
      own_scale[0][tid] = ldexpf(1.0f, shift);
      own_scale[1][tid] = ldexpf(1.0f, -shift);
    }
    __syncthreads();
  }
  float xs[kT];
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    const int t = t0 + 8 * j + g;
    xs[j] = kOwnScale && t < n ? own_scale[0][8 * j + g] : 1.0f;
  }

  float acc[kM][kT][4];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int j = 0; j < kT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][j][i] = 0.0f;

  // kU steps of the partition per iteration, their weights (and, for up to 16 tokens, their
  // activations) loaded before any is multiplied, so that many loads are in flight (decode is
  // nothing but weight traffic); the steps still go through the tensor cores in increasing order.
  constexpr int kU = kT == 1 ? 4 : 2;
  constexpr bool kPrefetchX = !kPreSplit;
  const int64_t steps = cols / 32;
  for (int64_t k = warp; k < steps; k += kU * kMmaWarps) {
    const int64_t left = (steps - k + kMmaWarps - 1) / kMmaWarps;  // of this partition
    const int here = left < kU ? static_cast<int>(left) : kU;
    uint32_t a[kU][kM][2][4];
    float4 xv[kPrefetchX ? kU : 1][kPrefetchX ? kT : 1][2];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (u != 0 && u >= here) break;
      const int64_t c = (k + u * kMmaWarps) * 32 + q * 8;
      LoadWeightStep<kM>(wr, c, a[u]);
      if constexpr (kPrefetchX) {
#pragma unroll
        for (int j = 0; j < kT; ++j) xv[u][j][0] = xv[u][j][1] = make_float4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < kT; ++j) {
          const int t = t0 + 8 * j + g;
          if (t < n) {
            const float* xt = x + static_cast<int64_t>(t) * cols + c;
            xv[u][j][0] = *reinterpret_cast<const float4*>(xt);
            xv[u][j][1] = *reinterpret_cast<const float4*>(xt + 4);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (u != 0 && u >= here) break;
      const int64_t c = (k + u * kMmaWarps) * 32 + q * 8;
#pragma unroll
      for (int j = 0; j < kT; ++j) {
        const int t = t0 + 8 * j + g;
        uint32_t parts[kParts][4];
        if constexpr (kPreSplit) {
#pragma unroll
          for (int p = 0; p < kParts; ++p) {
            uint4 h = make_uint4(0, 0, 0, 0);
            if (t < n) h = *reinterpret_cast<const uint4*>(split + (int64_t{p} * n + t) * cols + c);
            parts[p][0] = h.x, parts[p][1] = h.y, parts[p][2] = h.z, parts[p][3] = h.w;
          }
        } else {
          float4 x0 = make_float4(0, 0, 0, 0), x1 = x0;
          if constexpr (kPrefetchX) x0 = xv[u][j][0], x1 = xv[u][j][1];
          float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
          if constexpr (!kBf16) {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(v[i], xs[j]);  // exact: a power of two
          }
          SplitParts<kBf16>(v, parts);
        }
#pragma unroll
        for (int p = 0; p < kParts; ++p) {
          const uint32_t b0[2] = {parts[p][0], parts[p][1]};
          const uint32_t b1[2] = {parts[p][2], parts[p][3]};
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            Mma16816<kBf16>(acc[m][j], a[u][m][0], b0);
            Mma16816<kBf16>(acc[m][j], a[u][m][1], b1);
          }
        }
      }
    }
  }

  // Partition sums in partition order, one 16-row tile at a time through shared memory.
  __shared__ float part[kMmaWarps][kT * 32 * 4];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    __syncthreads();  // the previous tile's sums are read
#pragma unroll
    for (int j = 0; j < kT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) part[warp][(j * 32 + lane) * 4 + i] = acc[m][j][i];
    __syncthreads();
    for (int e = threadIdx.x; e < kT * 32 * 4; e += kMmaThreads) {
      const int j = e / 128, l = e / 4 % 32, i = e % 4;
      const int64_t r = r0 + 16 * m + l / 4 + (i >= 2 ? 8 : 0);
      const int t = t0 + 8 * j + 2 * (l % 4) + (i & 1);
      if (r >= rows || t >= n) continue;
      float s = part[0][e];
#pragma unroll
      for (int p = 1; p < kMmaWarps; ++p) s = __fadd_rn(s, part[p][e]);
      if constexpr (kOwnScale) {
        s = __fmul_rn(s, own_scale[1][t - t0]);  // exact: a power of two
      } else if constexpr (!kBf16) {
        s = __fmul_rn(s, scale[n + t]);
      }
      float* out = y + static_cast<int64_t>(t) * rows + r;
      *out = beta == 0.0f ? s : __fmaf_rn(beta, *out, s);
    }
  }
}

// 17-64 tokens: blocks that own a partition rather than all of them. LinearMmaKernel's block
// holds all 8 partitions of its 16 or 32 rows, so every block reads every column's activations
// (from L2): for 32 or 64 tokens 4 bytes of activation parts per weight byte. Here block (x, p)
// computes partition p alone for 256 rows (warp w: 32 of them, 2 row tiles) and up to 8 kT
// tokens (kT = 4 or 8 token tiles): the partition's activation parts of each step are staged once
// in shared memory (asynchronous copies, two buffers) and read there by all 8 warps, a quarter or
// half a byte per weight byte. Each warp runs its steps exactly as LinearMmaKernel's warp p does
// (steps p, p + 8, ... in order, parts in order, two m16n8k16 products each) and writes its
// partition sums to partial[p][t][r]; LinearPartSumKernel adds the 8 in partition order, as
// LinearMmaKernel's epilogue does, so the bits are the same.
constexpr int kPartRowTiles = 2;                           // 16-row tiles per warp
constexpr int kPartRows = kMmaWarps * 16 * kPartRowTiles;  // 256 rows per block
constexpr int kPartTokens = 64;                            // the most tokens (8 tiles)

// Blocks per SM ptxas must fit without spills (sm_80/sm_90): 2 (128 registers) for 4 token tiles,
// one for 8 (their 64 accumulators; F16 spills at 128 registers).
template <ElemType W, int kT>
__global__ void __launch_bounds__(kMmaThreads, kT <= 4 ? 2 : 1)
    LinearPartKernel(const uint16_t* __restrict__ w, int64_t rows, int64_t cols, int32_t n,
                     const uint16_t* __restrict__ split, float* __restrict__ partial) {
  constexpr bool kBf16 = W == ElemType::kBF16;
  constexpr int kParts = kBf16 ? 3 : 2;
  constexpr int kM = kPartRowTiles, kTokens = 8 * kT;
  // [buffer][part][token][32 columns] 16-bit: one step's activation parts for the block's tokens.
  __shared__ uint4 stage[2][kParts][kTokens][4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int p = static_cast<int>(blockIdx.y);  // the partition
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kPartRows + warp * 16 * kM;
  const int64_t steps = cols / 32;

  const uint16_t* wr[kM][2];
  WeightRows<kM>(w, rows, cols, r0, g, wr);
  // Step k's parts into buffer b: thread i copies 16 bytes (token i / 4, columns 8 (i % 4)..).
  auto issue = [&](int64_t k, int b) {
    if (k < steps) {
#pragma unroll
      for (int part = 0; part < kParts; ++part)
#pragma unroll
        for (int i = threadIdx.x; i < kTokens * 4; i += kMmaThreads) {
          const int t = i / 4, c8 = i % 4;
          const uint16_t* src =
              split + (int64_t{part} * n + (t < n ? t : 0)) * cols + k * 32 + c8 * 8;
          CpAsync16(&stage[b][part][t][c8], src, t < n);
        }
    }
    CpAsyncCommit();
  };
  auto load_w = [&](int64_t k, uint32_t(&a)[kM][2][4]) {
    LoadWeightStep<kM>(wr, k * 32 + q * 8, a);
  };

  float acc[kM][kT][4] = {};

  uint32_t a[kM][2][4];
  if (p < steps) load_w(p, a);
  issue(p, 0);
  int b = 0;
  for (int64_t k = p; k < steps; k += kMmaWarps, b ^= 1) {
    // The next step's weights, in flight during this one (the last step reloads its own).
    uint32_t an[kM][2][4];
    const bool more = k + kMmaWarps < steps;
    load_w(more ? k + kMmaWarps : k, an);
    issue(k + kMmaWarps, b ^ 1);
    CpAsyncWait<1>();  // this step's parts (this thread's copies)
    __syncthreads();   // everyone's
#pragma unroll
    for (int j = 0; j < kT; ++j) {
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
        const uint4 h = stage[b][part][8 * j + g][q];
        const uint32_t b0[2] = {h.x, h.y};
        const uint32_t b1[2] = {h.z, h.w};
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          Mma16816<kBf16>(acc[m][j], a[m][0], b0);
          Mma16816<kBf16>(acc[m][j], a[m][1], b1);
        }
      }
    }
    __syncthreads();  // nobody reads buffer b while the next step's copies go into it
    if (!more) break;
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[m][h][i] = an[m][h][i];
  }
  CpAsyncWait<0>();

  // This warp's partition sums: acc[m][j][i] is row 16 m + g (+ 8 for i >= 2), token 8 j + 2 q
  // (+ 1 for odd i).
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int j = 0; j < kT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t r = r0 + 16 * m + g + (i >= 2 ? 8 : 0);
        const int t = 8 * j + 2 * q + (i & 1);
        if (r < rows && t < n) partial[(int64_t{p} * n + t) * rows + r] = acc[m][j][i];
      }
}

// y[t, r] = the 8 partition sums added in partition order (then F16's exact unscaling and beta),
// LinearMmaKernel's epilogue.
template <bool kF16>
__global__ void __launch_bounds__(256)
    LinearPartSumKernel(const float* __restrict__ partial, int64_t rows, int32_t n,
                        const float* __restrict__ scale, float* y, float beta) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (e >= rows * n) return;
  const int64_t t = e / rows;
  float s = partial[e];
#pragma unroll
  for (int p = 1; p < kMmaWarps; ++p) s = __fadd_rn(s, partial[p * rows * n + e]);
  if constexpr (kF16) s = __fmul_rn(s, scale[n + t]);  // exact: a power of two
  y[e] = beta == 0.0f ? s : __fmaf_rn(beta, y[e], s);
}

std::atomic<bool> g_partition_blocks{true};  // SetLinearPartitionBlocks

// Where the partition sums start in the scratch (floats), after the F16 scales and the parts.
__host__ __device__ constexpr int64_t PartialOffset(ElemType type, int64_t cols, int32_t n) {
  return (PartsOffset(n) + (type == ElemType::kF16 ? 2 : 3) * int64_t{n} * cols / 2 + 3) / 4 * 4;
}

template <ElemType W, int kT>
cudaError_t LaunchPartShape(const void* w, int64_t rows, int64_t cols, int32_t n, float* scratch,
                            float* y, float beta, cudaStream_t stream) {
  const int64_t gx = (rows + kPartRows - 1) / kPartRows;
  if (gx > 0x7fffffff || n > 8 * kT || rows * n / 256 >= 0x7fffffff) return cudaErrorInvalidValue;
  float* partial = scratch + PartialOffset(W, cols, n);
  SPECINFER_LAUNCH(dim3(static_cast<unsigned>(gx), kMmaWarps), dim3(kMmaThreads), 0, stream,
                   LinearPartKernel<W, kT>)
  (static_cast<const uint16_t*>(w), rows, cols, n,
   reinterpret_cast<const uint16_t*>(scratch + PartsOffset(n)), partial);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  const int64_t elems = rows * n;
  SPECINFER_LAUNCH(dim3(static_cast<unsigned>((elems + 255) / 256)), dim3(256), 0, stream,
                   LinearPartSumKernel<W == ElemType::kF16>)
  (partial, rows, n, scratch, y, beta);
  return cudaGetLastError();
}

template <ElemType W, int kM, int kT>
cudaError_t LaunchMmaShape(const void* w, int64_t rows, int64_t cols, const float* x, int32_t n,
                           float* scratch, float* y, float beta, cudaStream_t stream) {
  const int64_t gx = (rows + 16 * kM - 1) / (16 * kM);
  const int64_t gy = (n + 8 * kT - 1) / (8 * kT);
  if (gx > 0x7fffffff || gy > 65535) return cudaErrorInvalidValue;
  const uint16_t* split =
      kT > 1 ? reinterpret_cast<const uint16_t*>(scratch + PartsOffset(n)) : nullptr;
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  if constexpr (kT == 1) {
    // Decode and small trees: a dependent launch hides the launch gap behind the previous kernel.
    return LaunchDependent(grid, dim3(kMmaThreads), 0, stream, LinearMmaKernel<W, kM, kT>,
                           static_cast<const uint16_t*>(w), rows, cols, x, n,
                           static_cast<const float*>(scratch), split, y, beta);
  }
  SPECINFER_LAUNCH(grid, dim3(kMmaThreads), 0, stream, LinearMmaKernel<W, kM, kT>)
  (static_cast<const uint16_t*>(w), rows, cols, x, n, scratch, split, y, beta);
  return cudaGetLastError();
}

// Shapes by token count; any gives the same bits. A block reads its weight rows once for its
// 8 kT tokens and the tokens' activations once for its 16 kM rows: more rows per block for
// more tokens keeps activation traffic (from L2) near the weight traffic.
template <ElemType W>
cudaError_t LaunchMma(const void* w, int64_t rows, int64_t cols, const float* x, int32_t n,
                      float* scratch, float* y, float beta, cudaStream_t stream) {
  if (n <= 8) return LaunchMmaShape<W, 1, 1>(w, rows, cols, x, n, scratch, y, beta, stream);
  if (scratch == nullptr) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(dim3(static_cast<unsigned>(n)), dim3(256), 0, stream,
                   SplitKernel<W == ElemType::kBF16>)
  (x, cols, n, scratch, reinterpret_cast<uint16_t*>(scratch + PartsOffset(n)));
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (n <= 16) return LaunchMmaShape<W, 1, 2>(w, rows, cols, x, n, scratch, y, beta, stream);
  const bool parts = g_partition_blocks.load(std::memory_order_relaxed);
  if (n <= 32) {
    return parts ? LaunchPartShape<W, 4>(w, rows, cols, n, scratch, y, beta, stream)
                 : LaunchMmaShape<W, 1, 4>(w, rows, cols, x, n, scratch, y, beta, stream);
  }
  if (n <= kPartTokens && parts)
    return LaunchPartShape<W, 8>(w, rows, cols, n, scratch, y, beta, stream);
  return LaunchMmaShape<W, 2, 8>(w, rows, cols, x, n, scratch, y, beta, stream);
}

}  // namespace

void SetLinearPartitionBlocks(bool on) { g_partition_blocks.store(on); }

int64_t LinearScratchFloats(ElemType type, int64_t rows, int64_t cols, int32_t n) {
  if (!UsesMma(type, cols)) return 0;
  if (n <= 8) return 0;  // the product kernel splits the activations itself
  // The F16 scales, then 2 (F16) or 3 (BF16) 16-bit parts per activation; for 17-64 tokens then
  // the 8 partition sums of every output (LinearPartKernel). The most any n' <= n needs.
  int64_t need = PartsOffset(n) + (type == ElemType::kF16 ? 2 : 3) * int64_t{n} * cols / 2;
  if (n > 16) {
    const int32_t m = std::min(n, kPartTokens);
    need = std::max(need, PartialOffset(type, cols, m) + int64_t{kMmaWarps} * m * rows);
  }
  return need;
}

cudaError_t LaunchLinear(ElemType type, const void* w, int64_t rows, int64_t cols, const float* x,
                         int32_t n, float* y, float beta, cudaStream_t stream, float* scratch) {
  if (rows <= 0 || cols <= 0 || n <= 0) return cudaErrorInvalidValue;
  if (UsesMma(type, cols)) {
    return type == ElemType::kF16
               ? LaunchMma<ElemType::kF16>(w, rows, cols, x, n, scratch, y, beta, stream)
               : LaunchMma<ElemType::kBF16>(w, rows, cols, x, n, scratch, y, beta, stream);
  }
  switch (type) {
    case ElemType::kF32:
      return LaunchTyped<ElemType::kF32>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kF16:
      return LaunchTyped<ElemType::kF16>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kBF16:
      return LaunchTyped<ElemType::kBF16>(w, rows, cols, x, n, y, beta, stream);
    default:
      break;
  }
  if (cols % ElemBlockElems(type) != 0) return cudaErrorInvalidValue;
  switch (type) {
    case ElemType::kQ8_0:
      return LaunchTyped<ElemType::kQ8_0>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ4_0:
      return LaunchTyped<ElemType::kQ4_0>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ4_1:
      return LaunchTyped<ElemType::kQ4_1>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ5_0:
      return LaunchTyped<ElemType::kQ5_0>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ5_1:
      return LaunchTyped<ElemType::kQ5_1>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ2_K:
      return LaunchTyped<ElemType::kQ2_K>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ3_K:
      return LaunchTyped<ElemType::kQ3_K>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ4_K:
      return LaunchTyped<ElemType::kQ4_K>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ5_K:
      return LaunchTyped<ElemType::kQ5_K>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ6_K:
      return LaunchTyped<ElemType::kQ6_K>(w, rows, cols, x, n, y, beta, stream);
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace specinfer::kernels
