#include "device_types.cuh"
#include "kquant.cuh"
#include "launch.cuh"
#include "linear.cuh"

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

// 32-bit words of packed quants per block: Q8_0 one byte per element, Q4 one nibble.
__host__ __device__ constexpr int QuantWords(ElemType t) { return t == ElemType::kQ8_0 ? 8 : 4; }

// Block b of a row: its quants packed 4 bytes to a word (blocks are only 2-byte aligned, so read
// as 16-bit halves), its scale d and, for Q4_1, its minimum m (element j is d * q_j (+ m)).
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
  } else {
    const BlockQ4_1* blk = reinterpret_cast<const BlockQ4_1*>(wrow) + b;
    d = HalfBitsToFloat(blk->d);
    m = HalfBitsToFloat(blk->m);
    p = reinterpret_cast<const uint16_t*>(blk->qs);
  }
#pragma unroll
  for (int k = 0; k < QuantWords(W); ++k)
    wd[k] = static_cast<uint32_t>(p[2 * k]) | static_cast<uint32_t>(p[2 * k + 1]) << 16;
}

// Quant of element 4 * j + e (j < 8, e < 4) of a block, as float. Q8_0: byte 4j + e. Q4: for
// element i < 16 the low nibble of byte i, for i >= 16 the high nibble of byte i - 16.
template <ElemType W>
__device__ __forceinline__ float QuantAt(const uint32_t (&wd)[QuantWords(W)], int j, int e) {
  if constexpr (W == ElemType::kQ8_0) {
    return static_cast<float>(static_cast<int8_t>((wd[j] >> (8 * e)) & 0xff));
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
            if constexpr (W == ElemType::kQ4_1)
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
            if constexpr (W == ElemType::kQ4_1) acc[i][t] = __fmaf_rn(m[i], sx[t], acc[i][t]);
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
// scales).
__host__ __device__ constexpr int MinBlocksOf(ElemType t, int tok, bool staged) {
  if (!staged) return IsKQuant(t) ? 8 : 12;
  return t == ElemType::kQ8_0 || IsKQuant(t) ? 2 : IsQuant(t) || tok > 8 ? 3 : 4;
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

}  // namespace

cudaError_t LaunchLinear(ElemType type, const void* w, int64_t rows, int64_t cols, const float* x,
                         int32_t n, float* y, float beta, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || n <= 0) return cudaErrorInvalidValue;
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
