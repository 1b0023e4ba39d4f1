// AVX2 + FMA + F16C versions of the block routines (see quants.h for the formats).
//
// Every function carries __attribute__((target("avx2,fma,f16c"))) instead of the translation unit
// being built with -mavx2, so the binary stays baseline x86-64; type_ops.cc hands these out only
// when GetCpuFeatures().use_avx2_kernels. Helpers are always_inline with the same target (GCC
// refuses to inline an AVX2 intrinsic into a function without it, lambdas included).
//
// Integer dot products use ggml's technique: per 32-element block, one _mm256_maddubs_epi16
// (u8 x s8 -> pairwise s16 sums), one _mm256_madd_epi16 against ones (-> 8 x s32), a conversion
// to float and one FMA with the product of the two block scales. maddubs cannot saturate here:
// |pair sum| <= 2 * 128 * 127 = 32512 < 32767 for Q8 x Q8 (the activation side is never -128),
// and far less for 4/5-bit weights. Q4_1 x Q8_1, the default model's hot path, goes further and
// handles two blocks per step (StepQ4_1Pair), about 15% faster than the one-block loop.
#include "backend/cpu/quants.h"

#if defined(SPECINFER_HAVE_X86_KERNELS)

#include <immintrin.h>

#include <cstring>
#include <utility>

#include "tensor/half.h"

#define SI_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SI_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
// For lambdas passed to the inline skeletons (a lambda does not inherit its function's target).
#define SI_AVX2_LAMBDA __attribute__((target("avx2,fma,f16c"), always_inline))

namespace specinfer::cpu::avx2 {

namespace {

SI_AVX2_INLINE float Half(uint16_t h) { return _cvtsh_ss(h); }

SI_AVX2_INLINE float Hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

SI_AVX2_INLINE float Hmax(__m256 v) {
  __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  r = _mm_max_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

SI_AVX2_INLINE int32_t HsumI32(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

// 16 bytes of nibbles -> 32 bytes 0..15 in element order (low nibbles, then high nibbles).
SI_AVX2_INLINE __m256i Nibbles32(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// The 32 bits of qh -> 32 bytes, 0xFF where bit k is set, 0 elsewhere.
SI_AVX2_INLINE __m256i HighBits32(const uint8_t* qh) {
  uint32_t x;
  std::memcpy(&x, qh, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101,
                                         0x0000000000000000);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  // Byte k holds byte k/8 of x; set every bit but bit k%8, then test for all ones.
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// sum of u8 x s8 products in groups of 4 -> 8 floats.
SI_AVX2_INLINE __m256 MulSumU8I8(__m256i ux, __m256i sy) {
  const __m256i dot16 = _mm256_maddubs_epi16(ux, sy);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot16, _mm256_set1_epi16(1)));
}

// sum of s8 x s8 products in groups of 4 -> 8 floats (moves x's sign onto y).
SI_AVX2_INLINE __m256 MulSumI8I8(__m256i x, __m256i y) {
  return MulSumU8I8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

SI_AVX2_INLINE __m256i Load32(const int8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Writes 32 signed bytes as 32 floats d * q (+ m when kOffset).
template <bool kOffset>
SI_AVX2_INLINE void StoreScaledI8(__m256i q, __m256 d, __m256 m, float* dst) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
    // d * q is exact in float32 (11-bit d times a <= 8-bit q), so FMA rounds like mul + add.
    // Without an offset a plain multiply keeps the sign of zero products (-0 for d < 0).
    _mm256_storeu_ps(dst + 8 * k, kOffset ? _mm256_fmadd_ps(f, d, m) : _mm256_mul_ps(f, d));
  }
}

// One block of 32 floats -> int8 with roundf semantics, bit-identical to scalar::FromFloat*.
// Returns d (amax / 127) and writes the int32 sum of the quants.
SI_AVX2_INLINE float QuantizeBlock8(const float* x, int8_t* qs, int32_t* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), amax);  // NaN operand -> keeps amax
  }
  const float max_scalar = Hmax(amax);
  const float d = max_scalar / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 mul = _mm256_set1_ps(id);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 lim = _mm256_set1_ps(127.0f), neg_lim = _mm256_set1_ps(-127.0f);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    __m256 s = _mm256_mul_ps(v[k], mul);
    s = _mm256_and_ps(s, _mm256_cmp_ps(s, s, _CMP_ORD_Q));  // NaN -> 0
    // roundf: truncate, then step away from zero when the dropped fraction is >= 0.5. s - t is
    // exact, so this never double-rounds (unlike adding 0.5 first).
    const __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(s, t));
    const __m256 away = _mm256_or_ps(_mm256_and_ps(s, sign), one);  // copysign(1, s)
    __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), away));
    r = _mm256_min_ps(_mm256_max_ps(r, neg_lim), lim);
    q[k] = _mm256_cvttps_epi32(r);
  }
  *sum = HsumI32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  // Pack 4 x 8 int32 -> 32 int8; the per-lane packs leave 4-byte groups in the order
  // 0,2,4,6,1,3,5,7, which the permute undoes.
  const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
  __m256i p = _mm256_packs_epi16(p01, p23);
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), p);
  return d;
}

// ---- per-block dot steps (accumulate into acc) ----

SI_AVX2_INLINE void StepQ4_0(const BlockQ4_0& a, const BlockQ8_0& b, __m256& acc) {
  const __m256 d = _mm256_set1_ps(Half(a.d) * Half(b.d));
  const __m256i qa = _mm256_sub_epi8(Nibbles32(a.qs), _mm256_set1_epi8(8));
  acc = _mm256_fmadd_ps(d, MulSumI8I8(qa, Load32(b.qs)), acc);
}

SI_AVX2_INLINE void StepQ4_1(const BlockQ4_1& a, const BlockQ8_1& b, __m256& acc, float& summs) {
  const __m256 d = _mm256_set1_ps(Half(a.d) * Half(b.d));
  summs += Half(a.m) * Half(b.s);
  acc = _mm256_fmadd_ps(d, MulSumU8I8(Nibbles32(a.qs), Load32(b.qs)), acc);
}

// Two consecutive Q4_1 blocks at once (faster than two StepQ4_1, ~15% on Zen): one F16C
// conversion for the four weight and four activation fp16 fields, one nibble split for both
// blocks' 32 bytes (low nibbles of both in one register, high nibbles in another, activations
// regrouped to match), and one madd/convert/FMA for both, with the block scales broadcast per
// 128-bit lane. Lanes 1 and 3 of `ms` accumulate m_w * s_x of the two blocks.
SI_AVX2_INLINE void StepQ4_1Pair(const BlockQ4_1* a, const BlockQ8_1* b, __m256& acc, __m128& ms) {
  uint32_t w0, w1, x0, x1;  // (d, m) and (d, s) pairs
  std::memcpy(&w0, &a[0].d, 4);
  std::memcpy(&w1, &a[1].d, 4);
  std::memcpy(&x0, &b[0].d, 4);
  std::memcpy(&x1, &b[1].d, 4);
  const __m256 h = _mm256_cvtph_ps(_mm_set_epi32(static_cast<int>(x1), static_cast<int>(x0),
                                                 static_cast<int>(w1), static_cast<int>(w0)));
  // [d_w0 d_x0, m_w0 s_x0, d_w1 d_x1, m_w1 s_x1]
  const __m128 p = _mm_mul_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  ms = _mm_add_ps(ms, p);
  const __m256 d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p),
                                            _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i q = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(a[1].qs),
                                        reinterpret_cast<const __m128i*>(a[0].qs));
  const __m256i lo = _mm256_and_si256(q, mask);                        // elements 0..15
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);  // elements 16..31
  const __m256i y0 = Load32(b[0].qs), y1 = Load32(b[1].qs);
  const __m256i ylo = _mm256_permute2x128_si256(y0, y1, 0x20);
  const __m256i yhi = _mm256_permute2x128_si256(y0, y1, 0x31);
  // |each i16| <= 2 * 2 * 15 * 127 = 7620: the add cannot overflow.
  const __m256i p16 =
      _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
  const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
  acc = _mm256_fmadd_ps(d, f, acc);
}

SI_AVX2_INLINE void StepQ5_0(const BlockQ5_0& a, const BlockQ8_0& b, __m256& acc) {
  const __m256 d = _mm256_set1_ps(Half(a.d) * Half(b.d));
  // (q | hbit << 4) - 16 as int8: q where the bit is set, q | 0xF0 where it is not.
  const __m256i qa = _mm256_or_si256(Nibbles32(a.qs),
                                     _mm256_andnot_si256(HighBits32(a.qh), _mm256_set1_epi8(-16)));
  acc = _mm256_fmadd_ps(d, MulSumI8I8(qa, Load32(b.qs)), acc);
}

SI_AVX2_INLINE void StepQ5_1(const BlockQ5_1& a, const BlockQ8_1& b, __m256& acc, float& summs) {
  const __m256 d = _mm256_set1_ps(Half(a.d) * Half(b.d));
  summs += Half(a.m) * Half(b.s);
  const __m256i qa =
      _mm256_or_si256(Nibbles32(a.qs), _mm256_and_si256(HighBits32(a.qh), _mm256_set1_epi8(0x10)));
  acc = _mm256_fmadd_ps(d, MulSumU8I8(qa, Load32(b.qs)), acc);
}

template <typename BW, typename BX>
SI_AVX2_INLINE void StepQ8(const BW& a, const BX& b, __m256& acc) {
  const __m256 d = _mm256_set1_ps(Half(a.d) * Half(b.d));
  acc = _mm256_fmadd_ps(d, MulSumI8I8(Load32(a.qs), Load32(b.qs)), acc);
}

// The block loop of the dot products without an offset term: two independent accumulators, so
// consecutive blocks' FMAs overlap; an odd last block goes to the first. Every caller's
// summation order is exactly this one (the results are bit-checked against the scalar kernels).
template <typename BW, typename BX, void (*Step)(const BW&, const BX&, __m256&)>
SI_AVX2_INLINE float DotBlocks(int64_t n, const void* w, const void* x) {
  const BW* a = static_cast<const BW*>(w);
  const BX* b = static_cast<const BX*>(x);
  const int64_t nb = n / kQK;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    Step(a[i], b[i], acc0);
    Step(a[i + 1], b[i + 1], acc1);
  }
  if (i < nb) Step(a[i], b[i], acc0);
  return Hsum(_mm256_add_ps(acc0, acc1));
}

}  // namespace

// ---- to_float ----

SI_AVX2 void ToFloatF16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
  for (; i < n; ++i) dst[i] = Fp16ToFp32(h[i]);
}

SI_AVX2 void ToFloatBF16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; ++i) dst[i] = Bf16ToFp32(h[i]);
}

SI_AVX2 void ToFloatQ4_0(const void* src, float* dst, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const __m256i q = _mm256_sub_epi8(Nibbles32(b[i].qs), _mm256_set1_epi8(8));
    StoreScaledI8<false>(q, _mm256_set1_ps(Half(b[i].d)), _mm256_setzero_ps(), dst);
  }
}

SI_AVX2 void ToFloatQ4_1(const void* src, float* dst, int64_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    StoreScaledI8<true>(Nibbles32(b[i].qs), _mm256_set1_ps(Half(b[i].d)),
                        _mm256_set1_ps(Half(b[i].m)), dst);
  }
}

SI_AVX2 void ToFloatQ5_0(const void* src, float* dst, int64_t n) {
  const BlockQ5_0* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const __m256i q = _mm256_or_si256(
        Nibbles32(b[i].qs), _mm256_andnot_si256(HighBits32(b[i].qh), _mm256_set1_epi8(-16)));
    StoreScaledI8<false>(q, _mm256_set1_ps(Half(b[i].d)), _mm256_setzero_ps(), dst);
  }
}

SI_AVX2 void ToFloatQ5_1(const void* src, float* dst, int64_t n) {
  const BlockQ5_1* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const __m256i q = _mm256_or_si256(
        Nibbles32(b[i].qs), _mm256_and_si256(HighBits32(b[i].qh), _mm256_set1_epi8(0x10)));
    StoreScaledI8<true>(q, _mm256_set1_ps(Half(b[i].d)), _mm256_set1_ps(Half(b[i].m)), dst);
  }
}

SI_AVX2 void ToFloatQ8_0(const void* src, float* dst, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    StoreScaledI8<false>(Load32(b[i].qs), _mm256_set1_ps(Half(b[i].d)), _mm256_setzero_ps(), dst);
  }
}

SI_AVX2 void ToFloatQ8_1(const void* src, float* dst, int64_t n) {
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    StoreScaledI8<false>(Load32(b[i].qs), _mm256_set1_ps(Half(b[i].d)), _mm256_setzero_ps(), dst);
  }
}

// ---- from_float ----

SI_AVX2 void FromFloatQ8_0(const float* src, void* dst, int64_t n) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    int32_t sum;
    const float d = QuantizeBlock8(src, y[i].qs, &sum);
    y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
  }
}

SI_AVX2 void FromFloatQ8_1(const float* src, void* dst, int64_t n) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    int32_t sum;
    const float d = QuantizeBlock8(src, y[i].qs, &sum);
    y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    y[i].s = _cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT);
  }
}

// ---- vec_dot ----

SI_AVX2 float VecDotF32(int64_t n, const void* w, const void* x) {
  const float* a = static_cast<const float*>(w);
  const float* b = static_cast<const float*>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  float sum = Hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// VecDotF32 for T activation rows: each weight vector is loaded once for all rows, and every row
// keeps VecDotF32's four accumulators and order, so each result is bit-identical to it. T <= 3
// keeps the 4 * T accumulators in registers.
template <int T>
SI_AVX2_INLINE void DotF32Rows(int64_t n, const float* a, const float* x, size_t stride,
                               float* out) {
  __m256 acc[T][4];
#pragma GCC unroll 3
  for (int t = 0; t < T; ++t)
    acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256 w = _mm256_loadu_ps(a + i + 8 * k);
#pragma GCC unroll 3
      for (int t = 0; t < T; ++t)
        acc[t][k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * stride + i + 8 * k), acc[t][k]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 w = _mm256_loadu_ps(a + i);
#pragma GCC unroll 3
    for (int t = 0; t < T; ++t)
      acc[t][0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * stride + i), acc[t][0]);
  }
#pragma GCC unroll 3
  for (int t = 0; t < T; ++t) {
    float sum = Hsum(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]),
                                   _mm256_add_ps(acc[t][2], acc[t][3])));
    for (int64_t j = i; j < n; ++j) sum += a[j] * x[t * stride + j];
    out[t] = sum;
  }
}

SI_AVX2 void VecDotF32Multi(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                            float* out) {
  const float* a = static_cast<const float*>(w);
  const float* xf = static_cast<const float*>(x);
  const size_t stride = x_stride / sizeof(float);
  switch (count) {
    case 4:
      DotF32Rows<2>(n, a, xf, stride, out);
      return DotF32Rows<2>(n, a, xf + 2 * stride, stride, out + 2);
    case 3: return DotF32Rows<3>(n, a, xf, stride, out);
    case 2: return DotF32Rows<2>(n, a, xf, stride, out);
    default: out[0] = VecDotF32(n, w, x);
  }
}

SI_AVX2 float VecDotF16F32(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  const float* b = static_cast<const float*>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8)));
    acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b + i), acc0);
  }
  float sum = Hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += Fp16ToFp32(a[i]) * b[i];
  return sum;
}

SI_AVX2 float VecDotBF16F32(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  const float* b = static_cast<const float*>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    // bf16 -> f32: the 16 bits become the high half of each 32-bit lane.
    const __m256 w0 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(u)), 16));
    const __m256 w1 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(u, 1)), 16));
    acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(b + i + 8), acc1);
  }
  float sum = Hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += Bf16ToFp32(a[i]) * b[i];
  return sum;
}

// The block loops run two independent accumulators so consecutive blocks' FMAs overlap.

SI_AVX2 float VecDotQ4_0Q8_0(int64_t n, const void* w, const void* x) {
  return DotBlocks<BlockQ4_0, BlockQ8_0, StepQ4_0>(n, w, x);
}

SI_AVX2 float VecDotQ4_1Q8_1(int64_t n, const void* w, const void* x) {
  const BlockQ4_1* a = static_cast<const BlockQ4_1*>(w);
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
  const int64_t nb = n / kQK;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m128 ms0 = _mm_setzero_ps(), ms1 = _mm_setzero_ps();
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    StepQ4_1Pair(a + i, b + i, acc0, ms0);
    StepQ4_1Pair(a + i + 2, b + i + 2, acc1, ms1);
  }
  if (i + 2 <= nb) {
    StepQ4_1Pair(a + i, b + i, acc0, ms0);
    i += 2;
  }
  float summs = 0.0f;
  if (i < nb) StepQ4_1(a[i], b[i], acc1, summs);
  // Lanes 1 and 3 of ms hold the m * s sums of the even and odd block of each pair.
  __m128 ms = _mm_add_ps(ms0, ms1);
  ms = _mm_add_ps(ms, _mm_movehl_ps(ms, ms));
  return Hsum(_mm256_add_ps(acc0, acc1)) + (_mm_cvtss_f32(_mm_movehdup_ps(ms)) + summs);
}

// VecDotQ4_1Q8_1 for T activation rows: per pair of blocks the weight nibbles are split and the
// weight fp16 fields converted once, then every row runs exactly the single-row sequence of
// operations (same products, same accumulators, same order), so each result is bit-identical to
// VecDotQ4_1Q8_1's. (Converting the weight and activation fp16 fields separately instead of in
// one F16C instruction gives the same floats; the products are the same multiplications.)
// T is at most 2: the accumulators of more rows would no longer fit in the 16 registers.
template <int T>
SI_AVX2_INLINE void PairQ4_1Rows(const BlockQ4_1* a, const uint8_t* x, size_t stride, int64_t i,
                                 __m256 (&acc)[T], __m128 (&ms)[T]) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  uint32_t w0, w1;
  std::memcpy(&w0, &a[i].d, 4);
  std::memcpy(&w1, &a[i + 1].d, 4);
  const __m128 hw = _mm_cvtph_ps(_mm_set_epi32(0, 0, static_cast<int>(w1), static_cast<int>(w0)));
  const __m256i q = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(a[i + 1].qs),
                                        reinterpret_cast<const __m128i*>(a[i].qs));
  const __m256i lo = _mm256_and_si256(q, mask);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
#pragma GCC unroll 2
  for (int t = 0; t < T; ++t) {
    const BlockQ8_1* b = reinterpret_cast<const BlockQ8_1*>(x + t * stride) + i;
    uint32_t x0, x1;
    std::memcpy(&x0, &b[0].d, 4);
    std::memcpy(&x1, &b[1].d, 4);
    const __m128 hx = _mm_cvtph_ps(_mm_set_epi32(0, 0, static_cast<int>(x1), static_cast<int>(x0)));
    const __m128 p = _mm_mul_ps(hw, hx);
    ms[t] = _mm_add_ps(ms[t], p);
    const __m256 d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p),
                                              _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    const __m256i y0 = Load32(b[0].qs), y1 = Load32(b[1].qs);
    const __m256i ylo = _mm256_permute2x128_si256(y0, y1, 0x20);
    const __m256i yhi = _mm256_permute2x128_si256(y0, y1, 0x31);
    const __m256i p16 =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
    const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
    acc[t] = _mm256_fmadd_ps(d, f, acc[t]);
  }
}

// The Q4_1 block-pair skeleton and the packed-activation tile kernel, with this file's target.
#define SI_TILE_TARGET "avx2,fma,f16c"
#define SI_TILE_VNNI 0
#define SI_TILE_MAX 2
#include "backend/cpu/q4_1_tile.inc"
#undef SI_TILE_TARGET
#undef SI_TILE_VNNI
#undef SI_TILE_MAX

template <int T>
SI_AVX2_INLINE void DotQ4_1Rows(int64_t n, const BlockQ4_1* a, const uint8_t* x, size_t stride,
                                float* out) {
  DotQ4_1Skeleton<T>(
      n / kQK,
      [&](int64_t i, __m256 (&acc)[T], __m128 (&ms)[T]) SI_AVX2_LAMBDA {
        PairQ4_1Rows<T>(a, x, stride, i, acc, ms);
      },
      [&](int r, int64_t i) SI_AVX2_LAMBDA {
        return std::pair(a + i, reinterpret_cast<const BlockQ8_1*>(x + r * stride) + i);
      },
      out);
}

// VecDotQ4_1Q8_1 of R weight rows (w + r * w_stride bytes) with one activation row: the
// decode-step dual of DotQ4_1Rows. Per pair of blocks the activations are loaded and regrouped
// and their fp16 fields converted once for all R rows; each row then runs the single-row
// sequence of operations (same products, same accumulators, same order), so each result is
// bit-identical to VecDotQ4_1Q8_1's. R is at most 2 for the same register budget.
template <int R>
SI_AVX2_INLINE void PairQ4_1WeightRows(const uint8_t* w, size_t w_stride, const BlockQ8_1* b,
                                       int64_t i, __m256 (&acc)[R], __m128 (&ms)[R]) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  uint32_t x0, x1;
  std::memcpy(&x0, &b[i].d, 4);
  std::memcpy(&x1, &b[i + 1].d, 4);
  const __m128 hx = _mm_cvtph_ps(_mm_set_epi32(0, 0, static_cast<int>(x1), static_cast<int>(x0)));
  const __m256i y0 = Load32(b[i].qs), y1 = Load32(b[i + 1].qs);
  const __m256i ylo = _mm256_permute2x128_si256(y0, y1, 0x20);
  const __m256i yhi = _mm256_permute2x128_si256(y0, y1, 0x31);
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    const BlockQ4_1* a = reinterpret_cast<const BlockQ4_1*>(w + r * w_stride) + i;
    uint32_t w0, w1;
    std::memcpy(&w0, &a[0].d, 4);
    std::memcpy(&w1, &a[1].d, 4);
    const __m128 hw =
        _mm_cvtph_ps(_mm_set_epi32(0, 0, static_cast<int>(w1), static_cast<int>(w0)));
    const __m128 p = _mm_mul_ps(hw, hx);
    ms[r] = _mm_add_ps(ms[r], p);
    const __m256 d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p),
                                              _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    const __m256i q = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(a[1].qs),
                                          reinterpret_cast<const __m128i*>(a[0].qs));
    const __m256i lo = _mm256_and_si256(q, mask);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
    const __m256i p16 =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
    const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
    acc[r] = _mm256_fmadd_ps(d, f, acc[r]);
  }
}

template <int R>
SI_AVX2_INLINE void DotQ4_1WeightRows(int64_t n, const uint8_t* w, size_t w_stride,
                                      const BlockQ8_1* b, float* out) {
  DotQ4_1Skeleton<R>(
      n / kQK,
      [&](int64_t i, __m256 (&acc)[R], __m128 (&ms)[R]) SI_AVX2_LAMBDA {
        PairQ4_1WeightRows<R>(w, w_stride, b, i, acc, ms);
      },
      [&](int r, int64_t i) SI_AVX2_LAMBDA {
        return std::pair(reinterpret_cast<const BlockQ4_1*>(w + r * w_stride) + i, b + i);
      },
      out);
}

SI_AVX2 void VecDotQ4_1Q8_1Rows(int64_t n, const void* w, size_t w_stride, const void* x,
                                int count, float* out) {
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
  for (; count >= 2; count -= 2, wb += 2 * w_stride, out += 2)
    DotQ4_1WeightRows<2>(n, wb, w_stride, b, out);
  if (count == 1) out[0] = VecDotQ4_1Q8_1(n, wb, x);
}

SI_AVX2 void VecDotQ4_1Q8_1Multi(int64_t n, const void* w, const void* x, size_t x_stride,
                                 int count, float* out) {
  const BlockQ4_1* a = static_cast<const BlockQ4_1*>(w);
  const uint8_t* xb = static_cast<const uint8_t*>(x);
  for (; count >= 2; count -= 2, xb += 2 * x_stride, out += 2)
    DotQ4_1Rows<2>(n, a, xb, x_stride, out);
  if (count == 1) out[0] = VecDotQ4_1Q8_1(n, w, xb);
}

// ---- Q4_1 weights against packed Q8_1 activations (TypeOps::vec_dot_packed) ----
//
// A tree pass dots every weight row with several tokens; per (row, token, pair of blocks) the
// regrouping of the activation bytes and the F16C conversion of their fp16 fields in
// PairQ4_1Rows are the same for every row, so PackQ8_1 does them once per token and product
// (PackedPairQ8_1 in quants.h). What remains per output is the single-row kernel's arithmetic
// itself: the same products (p = weight fields x activation fields), the same integer sums,
// the same FMA into the same accumulator, in the same order, so each result is bit-identical
// to VecDotQ4_1Q8_1's.

SI_AVX2 size_t PackedQ8_1Bytes(int64_t n) {
  const int64_t nb = n / kQK;
  return static_cast<size_t>(nb / 2) * sizeof(PackedPairQ8_1) +
         static_cast<size_t>(nb % 2) * sizeof(BlockQ8_1);
}

SI_AVX2 void PackQ8_1(int64_t n, const void* x, void* dst) {
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
  PackedPairQ8_1* pp = static_cast<PackedPairQ8_1*>(dst);
  const int64_t nb = n / kQK;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2, ++pp) {
    uint32_t x0, x1;
    std::memcpy(&x0, &b[i].d, 4);
    std::memcpy(&x1, &b[i + 1].d, 4);
    // The very conversion PairQ4_1Rows makes per row.
    _mm_storeu_ps(pp->h, _mm_cvtph_ps(_mm_set_epi32(0, 0, static_cast<int>(x1),
                                                    static_cast<int>(x0))));
    const __m256i y0 = Load32(b[i].qs), y1 = Load32(b[i + 1].qs);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp->lo), _mm256_permute2x128_si256(y0, y1, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp->hi), _mm256_permute2x128_si256(y0, y1, 0x31));
  }
  if (i < nb) std::memcpy(pp, &b[i], sizeof(BlockQ8_1));
}

SI_AVX2 float VecDotQ5_0Q8_0(int64_t n, const void* w, const void* x) {
  return DotBlocks<BlockQ5_0, BlockQ8_0, StepQ5_0>(n, w, x);
}

SI_AVX2 float VecDotQ5_1Q8_1(int64_t n, const void* w, const void* x) {
  const BlockQ5_1* a = static_cast<const BlockQ5_1*>(w);
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
  const int64_t nb = n / kQK;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float summs0 = 0.0f, summs1 = 0.0f;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    StepQ5_1(a[i], b[i], acc0, summs0);
    StepQ5_1(a[i + 1], b[i + 1], acc1, summs1);
  }
  if (i < nb) StepQ5_1(a[i], b[i], acc0, summs0);
  return Hsum(_mm256_add_ps(acc0, acc1)) + (summs0 + summs1);
}

SI_AVX2 float VecDotQ8_0Q8_0(int64_t n, const void* w, const void* x) {
  return DotBlocks<BlockQ8_0, BlockQ8_0, StepQ8<BlockQ8_0, BlockQ8_0>>(n, w, x);
}

// VecDotQ8_0Q8_0 for T activation rows (TypeOps::vec_dot_multi; the output layer of models with
// tied Q8_0 embeddings runs every tree token through it): per block the weight quants are loaded,
// their absolute values formed and the weight scale converted once; every row then runs
// DotBlocks' sequence for StepQ8 (same scale product, same integer sums, same FMA into the same
// one of two accumulators, same reduction), so each result is bit-identical to VecDotQ8_0Q8_0's.
template <int T>
SI_AVX2_INLINE void StepQ8_0Rows(const BlockQ8_0& a, const uint8_t* x, size_t stride, int64_t i,
                                 __m256 (&acc)[T]) {
  const float dw = Half(a.d);
  const __m256i w = Load32(a.qs);
  const __m256i uw = _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(x + t * stride)[i];
    const __m256 d = _mm256_set1_ps(dw * Half(b.d));
    acc[t] = _mm256_fmadd_ps(d, MulSumU8I8(uw, _mm256_sign_epi8(Load32(b.qs), w)), acc[t]);
  }
}

template <int T>
SI_AVX2_INLINE void DotQ8_0Rows(int64_t n, const BlockQ8_0* a, const uint8_t* x, size_t stride,
                                float* out) {
  const int64_t nb = n / kQK;
  __m256 acc0[T], acc1[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    StepQ8_0Rows<T>(a[i], x, stride, i, acc0);
    StepQ8_0Rows<T>(a[i + 1], x, stride, i + 1, acc1);
  }
  if (i < nb) StepQ8_0Rows<T>(a[i], x, stride, i, acc0);
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) out[t] = Hsum(_mm256_add_ps(acc0[t], acc1[t]));
}

SI_AVX2 void VecDotQ8_0Q8_0Multi(int64_t n, const void* w, const void* x, size_t x_stride,
                                 int count, float* out) {
  const BlockQ8_0* a = static_cast<const BlockQ8_0*>(w);
  const uint8_t* xb = static_cast<const uint8_t*>(x);
  switch (count) {
    case 4: return DotQ8_0Rows<4>(n, a, xb, x_stride, out);
    case 3: return DotQ8_0Rows<3>(n, a, xb, x_stride, out);
    case 2: return DotQ8_0Rows<2>(n, a, xb, x_stride, out);
    default: return DotQ8_0Rows<1>(n, a, xb, x_stride, out);
  }
}

SI_AVX2 float VecDotQ8_1Q8_1(int64_t n, const void* w, const void* x) {
  return DotBlocks<BlockQ8_1, BlockQ8_1, StepQ8<BlockQ8_1, BlockQ8_1>>(n, w, x);
}

}  // namespace specinfer::cpu::avx2

// The packed Q4_1 tile kernel again for CPUs with AVX-512 VL + VNNI (type_ops.cc hands it out
// when GetCpuFeatures().use_avx512_kernels): still 256-bit vectors with the AVX2 kernel's lane
// layout, so every float operation is the same; vpdpbusd forms the integer sums, and the 32
// vector registers hold a tile of 4 tokens instead of 2.
namespace specinfer::cpu::avx512 {

using namespace avx2;  // NOLINT: the AVX2 helpers, inlined into the wider target

#define SI_TILE_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"
#define SI_TILE_VNNI 1
#define SI_TILE_MAX 4
#include "backend/cpu/q4_1_tile.inc"
#undef SI_TILE_TARGET
#undef SI_TILE_VNNI
#undef SI_TILE_MAX

}  // namespace specinfer::cpu::avx512

#endif  // SPECINFER_HAVE_X86_KERNELS
