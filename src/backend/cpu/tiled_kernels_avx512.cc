// The tile kernels with AVX-512 F/VL/BW/VNNI: one zmm lane per tile row. Per block and token,
// vpdpbusd adds row j's products of 4 quants into lane j, the token's 4 activation bytes coming
// from a broadcast memory operand, so the 16 rows' exact integer sums of a block take 8
// instructions and no reduction; one convert, one multiply (the scales) and one FMA then follow
// the summation order of tiled_matrix.h for all 16 rows at once. The weight nibbles of a block
// are unpacked once for up to kMaxTileTokens tokens (T accumulators and T integer sums: 2T + 4
// of the 32 registers).
//
// Compiled per function for the AVX-512 target (the translation unit stays baseline x86-64);
// TileOpsForIsa hands these out only when GetCpuFeatures().use_avx512_kernels.
#include "backend/cpu/tiled_kernels.h"

#if defined(SPECINFER_HAVE_X86_KERNELS)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

// GCC 12's AVX-512 conversion intrinsics pass _mm512_undefined_ps() as the unused merge source,
// which -Wmaybe-uninitialized reports at every call.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define SI_512_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"
#define SI_512 __attribute__((target(SI_512_TARGET)))
#define SI_512_INLINE __attribute__((target(SI_512_TARGET), always_inline)) static inline

namespace specinfer::cpu::tiled_avx512 {

namespace {

SI_512_INLINE __m512i Bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The weights stream from memory once per product: ask for the block kAhead blocks on (into
// L1) while this one computes, past the end of the group too (groups are contiguous). Only for
// several tokens: a single token's kernel is bound by the memory stream itself, which the
// hardware prefetchers serve better alone (measured: 8 and 32 tokens 17-23% faster on weights
// from memory, 1 token 24% slower with it).
template <size_t kBlockBytes>
SI_512_INLINE void Prefetch(const uint8_t* w) {
  constexpr size_t kAhead = 4 * kBlockBytes;
#pragma GCC unroll 9
  for (size_t off = 0; off < kBlockBytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(w + kAhead + off), _MM_HINT_T0);
}

// Bits 8e + s of each 32-bit lane moved to bit 8e + 4 (s in 0..7), as 0x10 in each byte.
// (s is a constant once the chunk loop is unrolled.)
SI_512_INLINE __m512i FifthBits(__m512i h, int s, __m512i bit4) {
  if (s < 4) return _mm512_and_si512(_mm512_slli_epi32(h, 4 - s), bit4);
  if (s == 4) return _mm512_and_si512(h, bit4);
  return _mm512_and_si512(_mm512_srli_epi32(h, s - 4), bit4);
}

// Q4_1 / Q4_0 / Q5_1 / Q5_0 tiles: kMin adds the m * s term, kBias starts each block's sum at
// TileAct::bias (Q4_0's -8 * sum q, Q5_0's -16 * sum q), kFive ORs the fifth bits (16 words
// after the scales, tiled_matrix.h) into the nibbles. With one or two tokens the 8 vpdpbusd of a
// block are split over two integer sums (added exactly at the end) so their latency chain is
// halved.
template <int T, bool kMin, bool kBias, size_t kBlockBytes, bool kFive = false>
SI_512_INLINE void NibbleTile(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, float* y,
                              int64_t ys) {
  constexpr bool kSplit = T <= 2;
  constexpr size_t kH = kMin ? 64 : 32;  // the fifth bits (kFive)
  constexpr size_t kQ = kH + (kFive ? 64 : 0);
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kBlockBytes) {
    if constexpr (T > 1) Prefetch<kBlockBytes>(w);
    __m512i s0[T], s1[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      s0[t] = kBias ? _mm512_set1_epi32(x[t * xs + b].bias) : _mm512_setzero_si512();
      if (kSplit) s1[t] = _mm512_setzero_si512();
    }
    __m512i h = _mm512_setzero_si512();
    if constexpr (kFive) h = _mm512_loadu_si512(w + kH);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i p = _mm512_loadu_si512(w + kQ + 64 * k);
      __m512i lo = _mm512_and_si512(p, mask);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), mask);
      if constexpr (kFive) {
        lo = _mm512_or_si512(lo, FifthBits(h, 2 * k, bit4));
        hi = _mm512_or_si512(hi, FifthBits(h, 2 * k + 1, bit4));
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const int8_t* q = x[t * xs + b].qs;
        s0[t] = _mm512_dpbusd_epi32(s0[t], lo, Bcast4(q + 4 * k));
        if (kSplit)
          s1[t] = _mm512_dpbusd_epi32(s1[t], hi, Bcast4(q + 16 + 4 * k));
        else
          s0[t] = _mm512_dpbusd_epi32(s0[t], hi, Bcast4(q + 16 + 4 * k));
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512i s = kSplit ? _mm512_add_epi32(s0[t], s1[t]) : s0[t];
      const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(x[t * xs + b].d));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[t]);
    }
    if constexpr (kMin) {
      const __m512 mw =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32)));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x[t * xs + b].s), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ys, acc[t]);
}

// Q8_0 tiles: quants stored plus 128 (unsigned), each block's sum starting at -128 * sum q.
template <int T>
SI_512_INLINE void ByteTile(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, float* y,
                            int64_t ys) {
  constexpr bool kSplit = T <= 2;
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += kTileQ8_0Bytes) {
    if constexpr (T > 1) Prefetch<kTileQ8_0Bytes>(w);
    __m512i s0[T], s1[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      s0[t] = _mm512_set1_epi32(x[t * xs + b].bias);
      if (kSplit) s1[t] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i q = _mm512_loadu_si512(w + 32 + 64 * k);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512i a = Bcast4(x[t * xs + b].qs + 4 * k);
        if (kSplit && k % 2 == 1)
          s1[t] = _mm512_dpbusd_epi32(s1[t], q, a);
        else
          s0[t] = _mm512_dpbusd_epi32(s0[t], q, a);
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512i s = kSplit ? _mm512_add_epi32(s0[t], s1[t]) : s0[t];
      const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(x[t * xs + b].d));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ys, acc[t]);
}

// Float tiles (F32, F16, BF16): column c's 16 row values are one zmm (widened exactly from F16
// by vcvtph2ps, from BF16 by a shift), and each token's even- or odd-column accumulator takes one
// FMA per column with the token's value broadcast from memory: the two chains of
// tiled_matrix.h, all 16 rows at once, the column loaded once for T tokens (2T accumulators).
// (vdpbf16ps would take BF16 pairs in one instruction but sums each pair before accumulating,
// another order: not used.)
enum class FloatType { kF32, kF16, kBF16 };

template <FloatType F>
SI_512_INLINE __m512 LoadColumn(const uint8_t* p) {
  if constexpr (F == FloatType::kF32) return _mm512_loadu_ps(p);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (F == FloatType::kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <FloatType F, int T>
SI_512_INLINE void FloatTile(int64_t n, const uint8_t* w, const float* x, int64_t xs, float* y,
                             int64_t ys) {
  constexpr size_t kCol = F == FloatType::kF32 ? kTileF32ColumnBytes : kTileF16ColumnBytes;
  __m512 acc[2][T];  // [column parity][token]
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 4 <= n; c += 4, w += 4 * kCol) {
    // 4 columns: 256 (F32) or 128 bytes; the lines 1 KiB on towards L1 for several tokens.
    if constexpr (T > 1) {
#pragma GCC unroll 4
      for (size_t off = 0; off < 4 * kCol; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + 1024 + off), _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512 wc = LoadColumn<F>(w + k * kCol);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        acc[k % 2][t] = _mm512_fmadd_ps(wc, _mm512_set1_ps(x[t * xs + c + k]), acc[k % 2][t]);
    }
  }
  for (; c < n; ++c, w += kCol) {  // c even, then odd
    const __m512 wc = LoadColumn<F>(w);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      acc[c % 2][t] = _mm512_fmadd_ps(wc, _mm512_set1_ps(x[t * xs + c]), acc[c % 2][t]);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ys, _mm512_add_ps(acc[0][t], acc[1][t]));
}

template <FloatType F>
SI_512_INLINE void FloatByCount(int64_t n, const uint8_t* w, const float* x, int64_t xs,
                                int count, float* y, int64_t ys) {
  switch (count) {
    case 1: return FloatTile<F, 1>(n, w, x, xs, y, ys);
    case 2: return FloatTile<F, 2>(n, w, x, xs, y, ys);
    case 3: return FloatTile<F, 3>(n, w, x, xs, y, ys);
    case 4: return FloatTile<F, 4>(n, w, x, xs, y, ys);
    case 5: return FloatTile<F, 5>(n, w, x, xs, y, ys);
    case 6: return FloatTile<F, 6>(n, w, x, xs, y, ys);
    case 7: return FloatTile<F, 7>(n, w, x, xs, y, ys);
    default: return FloatTile<F, 8>(n, w, x, xs, y, ys);
  }
}

// Calls K<T> for count = T in 1..kMaxTileTokens.
template <template <int> class K>
SI_512_INLINE void ByCount(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, int count,
                           float* y, int64_t ys) {
  switch (count) {
    case 1: return K<1>::Run(nb, w, x, xs, y, ys);
    case 2: return K<2>::Run(nb, w, x, xs, y, ys);
    case 3: return K<3>::Run(nb, w, x, xs, y, ys);
    case 4: return K<4>::Run(nb, w, x, xs, y, ys);
    case 5: return K<5>::Run(nb, w, x, xs, y, ys);
    case 6: return K<6>::Run(nb, w, x, xs, y, ys);
    case 7: return K<7>::Run(nb, w, x, xs, y, ys);
    default: return K<8>::Run(nb, w, x, xs, y, ys);
  }
}
static_assert(kMaxTileTokens == 8);

template <int T>
struct Q4_1K {
  SI_512_INLINE void Run(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, float* y,
                         int64_t ys) {
    NibbleTile<T, true, false, kTileQ4_1Bytes>(nb, w, x, xs, y, ys);
  }
};
template <int T>
struct Q4_0K {
  SI_512_INLINE void Run(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, float* y,
                         int64_t ys) {
    NibbleTile<T, false, true, kTileQ4_0Bytes>(nb, w, x, xs, y, ys);
  }
};
template <int T>
struct Q5_1K {
  SI_512_INLINE void Run(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, float* y,
                         int64_t ys) {
    NibbleTile<T, true, false, kTileQ5_1Bytes, true>(nb, w, x, xs, y, ys);
  }
};
template <int T>
struct Q5_0K {
  SI_512_INLINE void Run(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, float* y,
                         int64_t ys) {
    NibbleTile<T, false, true, kTileQ5_0Bytes, true>(nb, w, x, xs, y, ys);
  }
};
template <int T>
struct Q8_0K {
  SI_512_INLINE void Run(int64_t nb, const uint8_t* w, const TileAct* x, int64_t xs, float* y,
                         int64_t ys) {
    ByteTile<T>(nb, w, x, xs, y, ys);
  }
};

}  // namespace

SI_512 void DotQ4_1(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                    float* y, int64_t y_stride) {
  ByCount<Q4_1K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_512 void DotQ4_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                    float* y, int64_t y_stride) {
  ByCount<Q4_0K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_512 void DotQ8_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                    float* y, int64_t y_stride) {
  ByCount<Q8_0K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_512 void DotQ5_1(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                    float* y, int64_t y_stride) {
  ByCount<Q5_1K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_512 void DotQ5_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                    float* y, int64_t y_stride) {
  ByCount<Q5_0K>(n / kQK, w, static_cast<const TileAct*>(x), x_stride, count, y, y_stride);
}

SI_512 void DotF32(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                   float* y, int64_t y_stride) {
  FloatByCount<FloatType::kF32>(n, w, static_cast<const float*>(x), x_stride, count, y, y_stride);
}

SI_512 void DotF16(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                   float* y, int64_t y_stride) {
  FloatByCount<FloatType::kF16>(n, w, static_cast<const float*>(x), x_stride, count, y, y_stride);
}

SI_512 void DotBF16(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count,
                    float* y, int64_t y_stride) {
  FloatByCount<FloatType::kBF16>(n, w, static_cast<const float*>(x), x_stride, count, y,
                                 y_stride);
}

// ---- Activation quantisation (TileOps::prep) ----
//
// Q8_1 exactly as scalar::FromFloatQ8_1 (quants.cc) and avx2::FromFloatQ8_1, written straight
// into TileAct: per block d = amax / 127 (NaN ignored), q = roundf(x / d) clamped to +-127 (NaN
// -> 0, through the same truncate-and-step steps as the AVX2 version), d and d * sum q rounded to
// fp16. Each step is an IEEE operation on one value, so the lanes give what the scalar code
// gives; the per-block scalar work (the maximum, the divisions, the fp16 rounding) runs for 16
// blocks at once. A pass quantises every token's activations before each matrix group, serially
// for up to ~100 tokens (matmul.cc): on a 32-token pass the AVX2 version was ~5% of the time.
namespace {

// |v| (AVX-512 F has no float and/or/andnot: the integer ones on the same bits).
SI_512_INLINE __m512 Abs(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

SI_512_INLINE __m512i QuantizeHalf(__m512 v, __m512 id) {
  __m512 s = _mm512_mul_ps(v, id);
  s = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, s, _CMP_ORD_Q), s);  // NaN -> 0
  const __m512 t = _mm512_roundscale_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = Abs(_mm512_sub_ps(s, t));
  // copysign(1, s)
  const __m512 away = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_and_si512(_mm512_castps_si512(s), _mm512_set1_epi32(INT32_MIN)),
      _mm512_castps_si512(_mm512_set1_ps(1.0f))));
  __m512 r = _mm512_mask_add_ps(t, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ),
                                t, away);
  r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvttps_epi32(r);
}

SI_512 void PrepQ8Blocks(const float* x, int64_t n, TileAct* out, int32_t offset) {
  const int64_t blocks = n / kQK;
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int count = static_cast<int>(std::min<int64_t>(16, blocks - b0));
    alignas(64) float amax[16] = {};
    for (int j = 0; j < count; ++j) {
      const float* p = x + (b0 + j) * kQK;
      // max(a, b) returns b where a is NaN: NaN lanes keep what was there (0 at first).
      __m512 m = _mm512_max_ps(Abs(_mm512_loadu_ps(p)), _mm512_setzero_ps());
      m = _mm512_max_ps(Abs(_mm512_loadu_ps(p + 16)), m);
      amax[j] = _mm512_reduce_max_ps(m);
    }
    const __m512 d = _mm512_div_ps(_mm512_load_ps(amax), _mm512_set1_ps(127.0f));
    const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ),
                                          _mm512_set1_ps(1.0f), d);
    alignas(64) float ids[16];
    _mm512_store_ps(ids, id);
    alignas(64) int32_t sums[16] = {};
    for (int j = 0; j < count; ++j) {
      const float* p = x + (b0 + j) * kQK;
      const __m512 vid = _mm512_set1_ps(ids[j]);
      const __m512i q0 = QuantizeHalf(_mm512_loadu_ps(p), vid);
      const __m512i q1 = QuantizeHalf(_mm512_loadu_ps(p + 16), vid);
      sums[j] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      TileAct& a = out[b0 + j];
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.qs), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.qs + 16), _mm512_cvtepi32_epi8(q1));
    }
    const __m512i vsum = _mm512_load_si512(sums);
    // fp16 round trips (round to nearest even, as _cvtss_sh and Fp32ToFp16).
    const __m512 dh = _mm512_cvtph_ps(_mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    const __m512 sh = _mm512_cvtph_ps(_mm512_cvtps_ph(
        _mm512_mul_ps(d, _mm512_cvtepi32_ps(vsum)), _MM_FROUND_TO_NEAREST_INT));
    alignas(64) float dv[16], sv[16];
    alignas(64) int32_t bias[16];
    _mm512_store_ps(dv, dh);
    _mm512_store_ps(sv, sh);
    _mm512_store_si512(bias, _mm512_mullo_epi32(vsum, _mm512_set1_epi32(-offset)));
    for (int j = 0; j < count; ++j) {
      out[b0 + j].d = dv[j];
      out[b0 + j].s = sv[j];
      out[b0 + j].bias = bias[j];
    }
  }
}

}  // namespace

template <int kOffset>
void PrepQ8(const float* x, int64_t n, TileAct* out) {
  PrepQ8Blocks(x, n, out, kOffset);
}

template void PrepQ8<0>(const float*, int64_t, TileAct*);
template void PrepQ8<8>(const float*, int64_t, TileAct*);
template void PrepQ8<16>(const float*, int64_t, TileAct*);
template void PrepQ8<128>(const float*, int64_t, TileAct*);

}  // namespace specinfer::cpu::tiled_avx512

#endif  // SPECINFER_HAVE_X86_KERNELS

#if defined(SPECINFER_HAVE_X86_KERNELS)
namespace specinfer::cpu::tiled_avx512 {

// 12 independent vpdpbusd chains (more than latency x throughput), `iters` rounds: 768 int8
// multiply-adds per round.
SI_512 int64_t PeakLoop(int64_t iters) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  for (int64_t r = 0; r < iters; ++r) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    asm volatile("" : "+v"(a), "+v"(b));
  }
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  asm volatile("" : : "v"(s));  // the sums are live: the loop is not dropped
  return iters * 768;
}

}  // namespace specinfer::cpu::tiled_avx512
#endif
