// The tile kernels with AVX2 + FMA + F16C: one ymm lane per tile row, a 16-row tile as two
// halves of 8 rows. Per block and token, maddubs multiplies row j's 4 unsigned quants with the
// token's 4 broadcast activation bytes into two 16-bit pair sums in lane j; the pair sums of a
// block's 8 groups of 4 are added in 16 bits where they cannot overflow (4-bit quants:
// 8 x 2 x 15 x 127 = 30480 < 32767), then madd against ones gives the exact 32-bit sums. The
// float part is tiled_matrix.h's summation order, as in the scalar and AVX-512 sets. The 16
// registers hold up to 4 tokens' accumulators; larger tiles run in slices of 4.
//
// Q8_0: the stored quants are q + 128; q is recovered with an XOR, and as maddubs needs an
// unsigned operand, |q| is multiplied with the activation carrying q's sign (ggml's sign trick;
// |pair sum| <= 2 x 128 x 127 = 32512), one madd per group of 4.
//
// Compiled per function for the AVX2 target (the translation unit stays baseline x86-64);
// TileOpsForIsa hands these out only when GetCpuFeatures().use_avx2_kernels.
#include "backend/cpu/tiled_kernels.h"

#if defined(SPECINFER_HAVE_X86_KERNELS)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#define SI_AVX2_TARGET "avx2,fma,f16c"
#define SI_AVX2 __attribute__((target(SI_AVX2_TARGET)))
#define SI_AVX2_INLINE __attribute__((target(SI_AVX2_TARGET), always_inline)) static inline

namespace specinfer::cpu::tiled_avx2 {

namespace {

constexpr int kSlice = 4;  // tokens per register tile

SI_AVX2_INLINE __m256i Bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

SI_AVX2_INLINE __m256 Half8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// As in the AVX-512 kernels: the block 4 ahead towards L1 while this one computes (several
// tokens only; the first half's pass brings the lines of both halves).
template <size_t kBlockBytes>
SI_AVX2_INLINE void Prefetch(const uint8_t* w) {
  constexpr size_t kAhead = 4 * kBlockBytes;
#pragma GCC unroll 9
  for (size_t off = 0; off < kBlockBytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(w + kAhead + off), _MM_HINT_T0);
}

// Bits 8e + s of each 32-bit lane moved to bit 8e + 4 (s in 0..7, a constant once the chunk
// loop is unrolled), as 0x10 in each byte.
SI_AVX2_INLINE __m256i FifthBits(__m256i hb, int s, __m256i bit4) {
  if (s < 4) return _mm256_and_si256(_mm256_slli_epi32(hb, 4 - s), bit4);
  if (s == 4) return _mm256_and_si256(hb, bit4);
  return _mm256_and_si256(_mm256_srli_epi32(hb, s - 4), bit4);
}

// Rows 8h..8h+7 of a Q4_1 / Q4_0 / Q5_1 / Q5_0 tile for T tokens (see the AVX-512 NibbleTile).
// 5-bit quants: a chunk's 16-bit sums reach 4 x 31 x 127 = 15748, so they are widened to 32
// bits every two chunks (31496 < 32767) instead of once per block.
template <int T, bool kMin, bool kBias, size_t kBlockBytes, bool kFive = false>
SI_AVX2_INLINE void NibbleHalf(int64_t nb, const uint8_t* w, int h, const TileAct* x, int64_t xs,
                               float* y, int64_t ys) {
  constexpr size_t kH = kMin ? 64 : 32;  // the fifth bits (kFive)
  constexpr size_t kQ = kH + (kFive ? 64 : 0);
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kBlockBytes) {
    if (T > 1 && h == 0) Prefetch<kBlockBytes>(w);
    __m256i s16[T], s32[T];
    __m256i hb = _mm256_setzero_si256();
    if constexpr (kFive)
      hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kH + 32 * h));
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i p =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kQ + 64 * k + 32 * h));
      __m256i lo = _mm256_and_si256(p, mask);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), mask);
      if constexpr (kFive) {
        lo = _mm256_or_si256(lo, FifthBits(hb, 2 * k, bit4));
        hi = _mm256_or_si256(hi, FifthBits(hb, 2 * k + 1, bit4));
      }
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const int8_t* q = x[t * xs + b].qs;
        const __m256i v = _mm256_add_epi16(_mm256_maddubs_epi16(lo, Bcast4(q + 4 * k)),
                                           _mm256_maddubs_epi16(hi, Bcast4(q + 16 + 4 * k)));
        s16[t] = (kFive ? k % 2 == 0 : k == 0) ? v : _mm256_add_epi16(s16[t], v);
        if (kFive && k == 1) s32[t] = _mm256_madd_epi16(s16[t], ones);
      }
    }
    const __m256 dw = Half8(w + 16 * h);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      __m256i s = _mm256_madd_epi16(s16[t], ones);
      if constexpr (kFive) s = _mm256_add_epi32(s, s32[t]);
      if (kBias) s = _mm256_add_epi32(s, _mm256_set1_epi32(x[t * xs + b].bias));
      const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(x[t * xs + b].d));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[t]);
    }
    if constexpr (kMin) {
      const __m256 mw = Half8(w + 32 + 16 * h);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x[t * xs + b].s), acc[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * ys + 8 * h, acc[t]);
}

// Rows 8h..8h+7 of a Q8_0 tile for T tokens.
template <int T>
SI_AVX2_INLINE void ByteHalf(int64_t nb, const uint8_t* w, int h, const TileAct* x, int64_t xs,
                             float* y, int64_t ys) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kTileQ8_0Bytes) {
    if (T > 1 && h == 0) Prefetch<kTileQ8_0Bytes>(w);
    __m256i s[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i q = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 + 64 * k + 32 * h)), flip);
      const __m256i aq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m256i a = _mm256_sign_epi8(Bcast4(x[t * xs + b].qs + 4 * k), q);
        s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, a), ones));
      }
    }
    const __m256 dw = Half8(w + 16 * h);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(x[t * xs + b].d));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), d, acc[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * ys + 8 * h, acc[t]);
}

template <int T>
struct Q4_1K {
  SI_AVX2_INLINE void Run(int64_t nb, const uint8_t* w, int h, const TileAct* x, int64_t xs,
                          float* y, int64_t ys) {
    NibbleHalf<T, true, false, kTileQ4_1Bytes>(nb, w, h, x, xs, y, ys);
  }
};
template <int T>
struct Q4_0K {
  SI_AVX2_INLINE void Run(int64_t nb, const uint8_t* w, int h, const TileAct* x, int64_t xs,
                          float* y, int64_t ys) {
    NibbleHalf<T, false, true, kTileQ4_0Bytes>(nb, w, h, x, xs, y, ys);
  }
};
template <int T>
struct Q5_1K {
  SI_AVX2_INLINE void Run(int64_t nb, const uint8_t* w, int h, const TileAct* x, int64_t xs,
                          float* y, int64_t ys) {
    NibbleHalf<T, true, false, kTileQ5_1Bytes, true>(nb, w, h, x, xs, y, ys);
  }
};
template <int T>
struct Q5_0K {
  SI_AVX2_INLINE void Run(int64_t nb, const uint8_t* w, int h, const TileAct* x, int64_t xs,
                          float* y, int64_t ys) {
    NibbleHalf<T, false, true, kTileQ5_0Bytes, true>(nb, w, h, x, xs, y, ys);
  }
};
template <int T>
struct Q8_0K {
  SI_AVX2_INLINE void Run(int64_t nb, const uint8_t* w, int h, const TileAct* x, int64_t xs,
                          float* y, int64_t ys) {
    ByteHalf<T>(nb, w, h, x, xs, y, ys);
  }
};

// Float tiles (F32, F16, BF16): column c's 16 row values as two ymm (widened exactly), each
// token's even- or odd-column accumulators (one per half) one FMA per column with the token's
// value broadcast: the two chains of tiled_matrix.h. Slices of kFloatSlice tokens (4T
// accumulators, 12 of the 16 registers); further slices read the tile again from cache.
constexpr int kFloatSlice = 3;
enum class FloatType { kF32, kF16, kBF16 };

template <FloatType F>
SI_AVX2_INLINE __m256 LoadHalfColumn(const uint8_t* p) {
  if constexpr (F == FloatType::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (F == FloatType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <FloatType F, int T>
SI_AVX2_INLINE void FloatSlice(int64_t n, const uint8_t* w, const float* x, int64_t xs, float* y,
                               int64_t ys) {
  constexpr size_t kCol = F == FloatType::kF32 ? kTileF32ColumnBytes : kTileF16ColumnBytes;
  __m256 acc[2][2][T];  // [column parity][half][token]
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t)
    acc[0][0][t] = acc[0][1][t] = acc[1][0][t] = acc[1][1][t] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 2 <= n; c += 2, w += 2 * kCol) {
    if (T > 1 && c % 4 == 0) {
      for (size_t off = 0; off < 4 * kCol; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + 1024 + off), _MM_HINT_T0);
    }
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {
      const __m256 w0 = LoadHalfColumn<F>(w + p * kCol);
      const __m256 w1 = LoadHalfColumn<F>(w + p * kCol + kCol / 2);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m256 b = _mm256_broadcast_ss(x + t * xs + c + p);
        acc[p][0][t] = _mm256_fmadd_ps(w0, b, acc[p][0][t]);
        acc[p][1][t] = _mm256_fmadd_ps(w1, b, acc[p][1][t]);
      }
    }
  }
  if (c < n) {  // a last, even column
    const __m256 w0 = LoadHalfColumn<F>(w), w1 = LoadHalfColumn<F>(w + kCol / 2);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256 b = _mm256_broadcast_ss(x + t * xs + c);
      acc[0][0][t] = _mm256_fmadd_ps(w0, b, acc[0][0][t]);
      acc[0][1][t] = _mm256_fmadd_ps(w1, b, acc[0][1][t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    _mm256_storeu_ps(y + t * ys, _mm256_add_ps(acc[0][0][t], acc[1][0][t]));
    _mm256_storeu_ps(y + t * ys + 8, _mm256_add_ps(acc[0][1][t], acc[1][1][t]));
  }
}

template <FloatType F>
SI_AVX2_INLINE void FloatTile(int64_t n, const uint8_t* w, const float* x, int64_t xs, int count,
                              float* y, int64_t ys) {
  for (int t0 = 0; t0 < count; t0 += kFloatSlice) {
    const float* xt = x + t0 * xs;
    float* yt = y + t0 * ys;
    switch (std::min(kFloatSlice, count - t0)) {
      case 1: FloatSlice<F, 1>(n, w, xt, xs, yt, ys); break;
      case 2: FloatSlice<F, 2>(n, w, xt, xs, yt, ys); break;
      default: FloatSlice<F, 3>(n, w, xt, xs, yt, ys); break;
    }
  }
}

// Both halves of the tile, tokens in slices of kSlice.
template <template <int> class K>
SI_AVX2_INLINE void Tile(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, int count,
                         float* y, int64_t ys) {
  for (int h = 0; h < 2; ++h) {
    for (int t0 = 0; t0 < count; t0 += kSlice) {
      const TileAct* xt = x + t0 * xs;
      float* yt = y + t0 * ys;
      switch (std::min(kSlice, count - t0)) {
        case 1: K<1>::Run(nb, w, h, xt, xs, yt, ys); break;
        case 2: K<2>::Run(nb, w, h, xt, xs, yt, ys); break;
        case 3: K<3>::Run(nb, w, h, xt, xs, yt, ys); break;
        default: K<4>::Run(nb, w, h, xt, xs, yt, ys); break;
      }
    }
  }
}

}  // namespace

SI_AVX2 void DotQ4_1(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                     float* y, int64_t y_stride) {
  Tile<Q4_1K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_AVX2 void DotQ4_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                     float* y, int64_t y_stride) {
  Tile<Q4_0K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_AVX2 void DotQ8_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                     float* y, int64_t y_stride) {
  Tile<Q8_0K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_AVX2 void DotQ5_1(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                     float* y, int64_t y_stride) {
  Tile<Q5_1K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_AVX2 void DotQ5_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                     float* y, int64_t y_stride) {
  Tile<Q5_0K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_AVX2 void DotF32(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                    float* y, int64_t y_stride) {
  FloatTile<FloatType::kF32>(n, w, static_cast<const float*>(x), x_stride, count, y, y_stride);
}

SI_AVX2 void DotF16(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                    float* y, int64_t y_stride) {
  FloatTile<FloatType::kF16>(n, w, static_cast<const float*>(x), x_stride, count, y, y_stride);
}

SI_AVX2 void DotBF16(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                     float* y, int64_t y_stride) {
  FloatTile<FloatType::kBF16>(n, w, static_cast<const float*>(x), x_stride, count, y, y_stride);
}

}  // namespace specinfer::cpu::tiled_avx2

#endif  // SPECINFER_HAVE_X86_KERNELS

#if defined(SPECINFER_HAVE_X86_KERNELS)
namespace specinfer::cpu::tiled_avx2 {

// 6 independent vpmaddubsw per round (3 x 2 distinct operands, so none is computed once for
// all; their 16-bit results added into 6 sums, few enough to stay in the 16 registers):
// 192 int8 multiply-adds per round.
SI_AVX2 int64_t PeakLoop(int64_t iters) {
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3),
          b0 = _mm256_set1_epi8(5), b1 = _mm256_set1_epi8(6);
  for (int64_t r = 0; r < iters; ++r) {
    c0 = _mm256_add_epi16(c0, _mm256_maddubs_epi16(a0, b0));
    c1 = _mm256_add_epi16(c1, _mm256_maddubs_epi16(a1, b0));
    c2 = _mm256_add_epi16(c2, _mm256_maddubs_epi16(a2, b0));
    c3 = _mm256_add_epi16(c3, _mm256_maddubs_epi16(a0, b1));
    c4 = _mm256_add_epi16(c4, _mm256_maddubs_epi16(a1, b1));
    c5 = _mm256_add_epi16(c5, _mm256_maddubs_epi16(a2, b1));
    asm volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(b0), "+x"(b1));
  }
  const __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(c0, c1), c2),
                                     _mm256_add_epi16(_mm256_add_epi16(c3, c4), c5));
  asm volatile("" : : "x"(s));  // the sums are live: the loop is not dropped
  return iters * 192;
}

}  // namespace specinfer::cpu::tiled_avx2
#endif
