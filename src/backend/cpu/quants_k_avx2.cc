// AVX2 K-quant x Q8_K dot products (formats and the order of the float steps: quants_k.h).
//
// Per block, the weight quants are unpacked to 32-byte vectors of unsigned values (Q3_K's and
// Q6_K's signed quants with an offset: q + 4, q + 32), multiplied with the activation bytes by
// _mm256_maddubs_epi16 (pairwise s16 sums; no saturation: |pair| <= 2 * 63 * 127 = 16002) and
// weighted by the sub-block scales with _mm256_madd_epi16 into s32 lanes. The lanes' sum is the
// block's exact isum (the offsets are taken back out with the activations' bsums), so the float
// steps after it, done one block at a time in scalar float32 as in the scalar kernels, give the
// same result bit for bit. The multi-token kernels unpack each weight block once for up to
// kMaxMultiDot activation rows and run the same steps per row.
//
// Functions carry __attribute__((target("avx2,fma,f16c"))) like quants_avx2.cc; the file is
// compiled with -ffp-contract=off (CMakeLists.txt) so that no multiply-add is fused.
#include "backend/cpu/quants_k.h"

#if defined(SPECINFER_HAVE_X86_KERNELS)

#include <immintrin.h>

#include <cstring>

#include "tensor/half.h"

#define SI_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SI_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

namespace specinfer::cpu::avx2 {

namespace {

SI_AVX2_INLINE int32_t HsumI32(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

SI_AVX2_INLINE __m256i Load(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// acc += sum over pairs of (u * p) * scale: u unsigned bytes, p signed, scale s16 per lane pair.
SI_AVX2_INLINE __m256i MulAcc(__m256i acc, __m256i u, const int8_t* p, __m256i scale) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, Load(p)), scale));
}

// Scales for 32 elements forming two 16-element sub-blocks (low 128-bit lane: the first).
SI_AVX2_INLINE __m256i ScalePair(int a, int b) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(b)),
                          _mm_set1_epi16(static_cast<int16_t>(a)));
}

SI_AVX2_INLINE __m256i Bits2(__m256i v, int shift) {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(3));
}

// 0x10 (Q5_K) or 0x04 (Q3_K) in the bytes whose bit `bit` of v is set.
SI_AVX2_INLINE __m256i BitAsValue(__m256i v, int bit, int value) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m),
                          _mm256_set1_epi8(static_cast<char>(value)));
}

// Q4_K/Q5_K's 12 packed scale bytes -> sc[0..7] (bytes 0..7) and m[0..7] (bytes 8..15), as
// llama.cpp unpacks them (the same values as GetScaleMinK4).
SI_AVX2_INLINE void UnpackScalesK4(const uint8_t* scales, uint8_t out[16]) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, scales, 12);
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t mins_lo = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = mins_lo;
  u[0] &= kmask1;
  std::memcpy(out, u, 16);
}

// sum_j m[j] * (bsums[2j] + bsums[2j + 1]) for the 8 minimums m (bytes) of Q4_K/Q5_K.
SI_AVX2_INLINE int32_t MinSum8(const uint8_t* m, const int16_t* bsums) {
  const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)));
  const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums));
  const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums + 8));
  // |pair| <= 2 * 16 * 127: no int16 overflow
  __m128i r = _mm_madd_epi16(mins, _mm_hadd_epi16(b0, b1));
  r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

// sum_s w[s] * bsums[s] over the 16 sub-blocks, for 16 int16 weights.
SI_AVX2_INLINE int32_t WeightedBsums16(__m256i w16, const int16_t* bsums) {
  return HsumI32(_mm256_madd_epi16(w16, Load(bsums)));
}

SI_AVX2_INLINE __m256i I8ToI16x16(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

SI_AVX2_INLINE const BlockQ8_K* Row(const void* x, size_t stride, int t, int64_t i) {
  return reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(x) + t * stride) + i;
}

template <int C>
SI_AVX2_INLINE void DotQ2_K(int64_t n, const void* w, const void* x, size_t stride, float* out) {
  const BlockQ2_K* a = static_cast<const BlockQ2_K*>(w);
  float acc[C] = {};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    __m256i sum[C];
    for (int t = 0; t < C; ++t) sum[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qv = Load(a[i].qs + 32 * h);
      for (int c = 0; c < 4; ++c) {
        const int s = 8 * h + 2 * c;
        const __m256i sc = ScalePair(a[i].scales[s] & 0xF, a[i].scales[s + 1] & 0xF);
        const __m256i u = Bits2(qv, 2 * c);
        for (int t = 0; t < C; ++t) {
          sum[t] = MulAcc(sum[t], u, Row(x, stride, t, i)->qs + 128 * h + 32 * c, sc);
        }
      }
    }
    const float dw = Fp16ToFp32(a[i].d), dmw = Fp16ToFp32(a[i].dmin);
    const __m256i mins16 = _mm256_srli_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a[i].scales))), 4);
    for (int t = 0; t < C; ++t) {
      const BlockQ8_K* b = Row(x, stride, t, i);
      const int32_t msum = WeightedBsums16(mins16, b->bsums);
      const float dd = dw * b->d, dm = dmw * b->d;
      acc[t] += dd * static_cast<float>(HsumI32(sum[t])) - dm * static_cast<float>(msum);
    }
  }
  for (int t = 0; t < C; ++t) out[t] = acc[t];
}

template <int C>
SI_AVX2_INLINE void DotQ3_K(int64_t n, const void* w, const void* x, size_t stride, float* out) {
  const BlockQ3_K* a = static_cast<const BlockQ3_K*>(w);
  float acc[C] = {};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int8_t sc[16];
    GetScalesQ3_K(a[i].scales, sc);
    __m256i sum[C];
    for (int t = 0; t < C; ++t) sum[t] = _mm256_setzero_si256();
    const __m256i hm = Load(a[i].hmask);
    for (int h = 0; h < 2; ++h) {
      const __m256i qv = Load(a[i].qs + 32 * h);
      for (int c = 0; c < 4; ++c) {
        const int s = 8 * h + 2 * c;
        const __m256i scv = ScalePair(sc[s], sc[s + 1]);
        // q + 4 = low bits + 4 * high bit, in 0..7
        const __m256i u = _mm256_or_si256(Bits2(qv, 2 * c), BitAsValue(hm, 4 * h + c, 4));
        for (int t = 0; t < C; ++t) {
          sum[t] = MulAcc(sum[t], u, Row(x, stride, t, i)->qs + 128 * h + 32 * c, scv);
        }
      }
    }
    const float dw = Fp16ToFp32(a[i].d);
    for (int t = 0; t < C; ++t) {
      const BlockQ8_K* b = Row(x, stride, t, i);
      int32_t off = 0;
      for (int s = 0; s < 16; ++s) off += sc[s] * b->bsums[s];
      const int32_t isum = HsumI32(sum[t]) - 4 * off;
      acc[t] += dw * b->d * static_cast<float>(isum);
    }
  }
  for (int t = 0; t < C; ++t) out[t] = acc[t];
}

// Q4_K (kQ5 = false) and Q5_K (kQ5 = true): 8 sub-blocks of 32 with a 6-bit scale and minimum.
template <int C, bool kQ5, typename Block>
SI_AVX2_INLINE void DotQ45_K(int64_t n, const void* w, const void* x, size_t stride,
                             float* out) {
  const Block* a = static_cast<const Block*>(w);
  float acc[C] = {};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t scm[16];  // sc[0..7], m[0..7]
    UnpackScalesK4(a[i].scales, scm);
    const uint8_t* sc = scm;
    __m256i sum[C];
    for (int t = 0; t < C; ++t) sum[t] = _mm256_setzero_si256();
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kQ5) qh = Load(a[i].qh);
    for (int j = 0; j < 4; ++j) {
      const __m256i qv = Load(a[i].qs + 32 * j);
      __m256i lo = _mm256_and_si256(qv, _mm256_set1_epi8(0xF));
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), _mm256_set1_epi8(0xF));
      if constexpr (kQ5) {
        lo = _mm256_or_si256(lo, BitAsValue(qh, 2 * j, 16));
        hi = _mm256_or_si256(hi, BitAsValue(qh, 2 * j + 1, 16));
      }
      const __m256i sc_lo = _mm256_set1_epi16(static_cast<int16_t>(sc[2 * j]));
      const __m256i sc_hi = _mm256_set1_epi16(static_cast<int16_t>(sc[2 * j + 1]));
      for (int t = 0; t < C; ++t) {
        const int8_t* p = Row(x, stride, t, i)->qs + 64 * j;
        sum[t] = MulAcc(MulAcc(sum[t], lo, p, sc_lo), hi, p + 32, sc_hi);
      }
    }
    const float dw = Fp16ToFp32(a[i].d), dmw = Fp16ToFp32(a[i].dmin);
    for (int t = 0; t < C; ++t) {
      const BlockQ8_K* b = Row(x, stride, t, i);
      const int32_t msum = MinSum8(scm + 8, b->bsums);
      const float dd = dw * b->d, dm = dmw * b->d;
      acc[t] += dd * static_cast<float>(HsumI32(sum[t])) - dm * static_cast<float>(msum);
    }
  }
  for (int t = 0; t < C; ++t) out[t] = acc[t];
}

template <int C>
SI_AVX2_INLINE void DotQ6_K(int64_t n, const void* w, const void* x, size_t stride, float* out) {
  const BlockQ6_K* a = static_cast<const BlockQ6_K*>(w);
  float acc[C] = {};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const int8_t* sc = a[i].scales;
    __m256i sum[C];
    for (int t = 0; t < C; ++t) sum[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = Load(a[i].ql + 64 * h), ql1 = Load(a[i].ql + 64 * h + 32);
      const __m256i qhv = Load(a[i].qh + 32 * h);
      const __m256i nib = _mm256_set1_epi8(0xF);
      // q + 32 of the four 32-element groups c of this half (elements 128h + 32c ...)
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, nib), _mm256_slli_epi16(Bits2(qhv, 0), 4)),
          _mm256_or_si256(_mm256_and_si256(ql1, nib), _mm256_slli_epi16(Bits2(qhv, 2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), nib),
                          _mm256_slli_epi16(Bits2(qhv, 4), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), nib),
                          _mm256_slli_epi16(Bits2(qhv, 6), 4)),
      };
      for (int c = 0; c < 4; ++c) {
        const int s = 8 * h + 2 * c;
        const __m256i scv = ScalePair(sc[s], sc[s + 1]);
        for (int t = 0; t < C; ++t) {
          sum[t] = MulAcc(sum[t], u[c], Row(x, stride, t, i)->qs + 128 * h + 32 * c, scv);
        }
      }
    }
    const float dw = Fp16ToFp32(a[i].d);
    const __m256i sc16 = I8ToI16x16(sc);
    for (int t = 0; t < C; ++t) {
      const BlockQ8_K* b = Row(x, stride, t, i);
      const int32_t isum = HsumI32(sum[t]) - 32 * WeightedBsums16(sc16, b->bsums);
      acc[t] += dw * b->d * static_cast<float>(isum);
    }
  }
  for (int t = 0; t < C; ++t) out[t] = acc[t];
}

// Dispatches a runtime count (1..4) to the templates.
#define SI_KQUANT_MULTI(NAME, CALL)                                                         \
  SI_AVX2 void NAME(int64_t n, const void* w, const void* x, size_t x_stride, int count,    \
                    float* out) {                                                           \
    switch (count) {                                                                        \
      case 4: return CALL(4)(n, w, x, x_stride, out);                                       \
      case 3: return CALL(3)(n, w, x, x_stride, out);                                       \
      case 2: return CALL(2)(n, w, x, x_stride, out);                                       \
      default: return CALL(1)(n, w, x, x_stride, out);                                      \
    }                                                                                       \
  }

#define SI_Q2(c) DotQ2_K<c>
#define SI_Q3(c) DotQ3_K<c>
#define SI_Q4(c) DotQ45_K<c, false, BlockQ4_K>
#define SI_Q5(c) DotQ45_K<c, true, BlockQ5_K>
#define SI_Q6(c) DotQ6_K<c>

}  // namespace

SI_AVX2 float VecDotQ2_KQ8_K(int64_t n, const void* w, const void* x) {
  float r;
  DotQ2_K<1>(n, w, x, 0, &r);
  return r;
}
SI_AVX2 float VecDotQ3_KQ8_K(int64_t n, const void* w, const void* x) {
  float r;
  DotQ3_K<1>(n, w, x, 0, &r);
  return r;
}
SI_AVX2 float VecDotQ4_KQ8_K(int64_t n, const void* w, const void* x) {
  float r;
  DotQ45_K<1, false, BlockQ4_K>(n, w, x, 0, &r);
  return r;
}
SI_AVX2 float VecDotQ5_KQ8_K(int64_t n, const void* w, const void* x) {
  float r;
  DotQ45_K<1, true, BlockQ5_K>(n, w, x, 0, &r);
  return r;
}
SI_AVX2 float VecDotQ6_KQ8_K(int64_t n, const void* w, const void* x) {
  float r;
  DotQ6_K<1>(n, w, x, 0, &r);
  return r;
}

SI_KQUANT_MULTI(VecDotQ2_KQ8_KMulti, SI_Q2)
SI_KQUANT_MULTI(VecDotQ3_KQ8_KMulti, SI_Q3)
SI_KQUANT_MULTI(VecDotQ4_KQ8_KMulti, SI_Q4)
SI_KQUANT_MULTI(VecDotQ5_KQ8_KMulti, SI_Q5)
SI_KQUANT_MULTI(VecDotQ6_KQ8_KMulti, SI_Q6)

}  // namespace specinfer::cpu::avx2

#endif  // SPECINFER_HAVE_X86_KERNELS
