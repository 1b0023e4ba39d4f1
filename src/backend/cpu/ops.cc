#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/simd.h"

namespace specinfer::cpu {

void RmsNorm(const float* x, const float* w, float* out, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(n);
  ss += eps;
  const float scale = 1.0f / std::sqrt(ss);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (scale * x[i]);
}

RopeTable::RopeTable(std::vector<float> inv_freq, int32_t max_pos)
    : head_dim_(static_cast<int32_t>(2 * inv_freq.size())),
      inv_freq_(std::move(inv_freq)),
      max_pos_(std::max<int32_t>(max_pos, 0)) {
  const int32_t half = head_dim_ / 2;
  cos_.resize(static_cast<size_t>(max_pos_) * half);
  sin_.resize(cos_.size());
  for (int32_t p = 0; p < max_pos_; ++p) {
    for (int32_t i = 0; i < half; ++i) {
      float angle = static_cast<float>(p) * inv_freq_[i];
      cos_[static_cast<size_t>(p) * half + i] = std::cos(angle);
      sin_[static_cast<size_t>(p) * half + i] = std::sin(angle);
    }
  }
}

void RopeTable::Angle(int32_t pos, int32_t i, float* c, float* s) const {
  if (pos < max_pos_) {
    size_t k = static_cast<size_t>(pos) * (head_dim_ / 2) + i;
    *c = cos_[k];
    *s = sin_[k];
    return;
  }
  float angle = static_cast<float>(pos) * inv_freq_[i];
  *c = std::cos(angle);
  *s = std::sin(angle);
}

void RopeTable::Apply(float* vec, int32_t num_heads, int32_t pos, RopeStyle style) const {
  const int32_t half = head_dim_ / 2;
  for (int32_t h = 0; h < num_heads; ++h) {
    float* v = vec + static_cast<size_t>(h) * head_dim_;
    for (int32_t i = 0; i < half; ++i) {
      float c, s;
      Angle(pos, i, &c, &s);
      // Interleaved: pair (2i, 2i+1). Half: pair (i, i + half).
      float* a = style == RopeStyle::kInterleaved ? &v[2 * i] : &v[i];
      float* b = style == RopeStyle::kInterleaved ? &v[2 * i + 1] : &v[i + half];
      float v0 = *a, v1 = *b;
      *a = v0 * c - v1 * s;
      *b = v0 * s + v1 * c;
    }
  }
}

namespace {

void SoftmaxScalar(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void SwiGluScalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    gate[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
  }
}

}  // namespace

void GeGluTanh(float* gate, const float* up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void SoftCap(float* x, int64_t n, float cap) {
  if (cap == 0.0f) return;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

namespace {
float DotScalar(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void AxpyScalar(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Attention over rows of a KV cache: scores[k] = Dot(q, base + slots[k] * stride, n) * scale,
// and out[i] += scores[k] * (base + slots[k] * stride)[i] for k in order.
void DotRowsScalar(const float* q, const float* base, const int32_t* slots, int64_t rows,
                   int64_t stride, int64_t n, float scale, float* scores) {
  for (int64_t k = 0; k < rows; ++k) scores[k] = DotScalar(q, base + slots[k] * stride, n) * scale;
}

void AxpyRowsScalar(const float* scores, const float* base, const int32_t* slots, int64_t rows,
                    int64_t stride, int64_t n, float* out) {
  for (int64_t k = 0; k < rows; ++k) AxpyScalar(scores[k], base + slots[k] * stride, out, n);
}

// Attention of the `group` query heads that share a KV head, all at once: dot(q [group][n] ->
// scores [group][rows], scaled), axpy(scores -> out [group][n], accumulated into out).
using GroupDotFn = void (*)(const float*, const float*, const int32_t*, int64_t, int64_t, float,
                            float*);
using GroupAxpyFn = void (*)(const float*, const float*, const int32_t*, int64_t, int64_t,
                             float*);
struct GroupKernels {
  GroupDotFn dot;
  GroupAxpyFn axpy;
};

#if defined(__x86_64__)
__attribute__((target("avx2,fma"), always_inline)) inline float DotAvx2Inline(const float* a,
                                                                               const float* b,
                                                                               int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  const __m256 v = _mm256_add_ps(acc0, acc1);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  float s = _mm_cvtss_f32(r);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) float DotAvx2(const float* a, const float* b, int64_t n) {
  return DotAvx2Inline(a, b, n);
}

// The horizontal sums of eight keys' accumulators v[0..7], in key order: lanes l + l+4, then
// l + l+2, then l + l+1 (DotAvx2Inline's tree, per key), in 9 shuffles and 7 adds.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 HorizontalSums8(
    const __m256 (&v)[8]) {
  __m256 t[4];  // t[p]: keys 2p and 2p+1, lanes l + l+4 (4 lanes each)
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p)
    t[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
  // lanes l + l+2: [k0 k0 k2 k2 | k1 k1 k3 k3] and [k4 k4 k6 k6 | k5 k5 k7 k7]
  const __m256 x0 = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 x1 = _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2)));
  // lanes l + l+1: [k0 k2 k4 k6 | k1 k3 k5 k7]
  const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// DotAvx2 per row, inlined: no indirect call per key. Where n is a multiple of 16, eight keys
// at a time: each key's two accumulators exactly as in DotAvx2Inline, then the eight horizontal
// sums together (lanes l + l+4, then l + l+2, then l + l+1: DotAvx2Inline's tree, per key) in
// 9 shuffles and 7 adds instead of 8 separate reductions. Same results bit for bit.
__attribute__((target("avx2,fma"))) void DotRowsAvx2(const float* q, const float* base,
                                                     const int32_t* slots, int64_t rows,
                                                     int64_t stride, int64_t n, float scale,
                                                     float* scores) {
  int64_t k = 0;
  if (n % 16 == 0) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (; k + 8 <= rows; k += 8) {
      __m256 v[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const float* b = base + slots[k + j] * stride;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
          acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(b + i), acc0);
          acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
        }
        v[j] = _mm256_add_ps(acc0, acc1);
      }
      _mm256_storeu_ps(scores + k, _mm256_mul_ps(HorizontalSums8(v), vscale));
    }
  }
  for (; k < rows; ++k) scores[k] = DotAvx2Inline(q, base + slots[k] * stride, n) * scale;
}

__attribute__((target("avx2,fma"))) void AxpyAvx2(float alpha, const float* x, float* y,
                                                  int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// AxpyAvx2 for every row in turn, with up to 64 columns of `out` held in registers across the
// rows instead of loaded and stored per row: per element the same FMAs in the same order.
__attribute__((target("avx2,fma"))) void AxpyRowsAvx2(const float* scores, const float* base,
                                                      const int32_t* slots, int64_t rows,
                                                      int64_t stride, int64_t n, float* out) {
  if (n % 8 != 0) {  // the scalar tail stays AxpyAvx2's own
    for (int64_t k = 0; k < rows; ++k) AxpyAvx2(scores[k], base + slots[k] * stride, out, n);
    return;
  }
  for (int64_t c = 0; c < n; c += 64) {
    const int lanes = static_cast<int>(std::min<int64_t>(64, n - c) / 8);
    __m256 y[8];
    for (int j = 0; j < 8; ++j) y[j] = j < lanes ? _mm256_loadu_ps(out + c + 8 * j) : __m256{};
    for (int64_t k = 0; k < rows; ++k) {
      const __m256 va = _mm256_set1_ps(scores[k]);
      const float* x = base + slots[k] * stride + c;
      if (lanes == 8) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) y[j] = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + 8 * j), y[j]);
      } else {
        for (int j = 0; j < lanes; ++j)
          y[j] = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + 8 * j), y[j]);
      }
    }
    for (int j = 0; j < lanes; ++j) _mm256_storeu_ps(out + c + 8 * j, y[j]);
  }
}

// The attention of G query heads that share a KV head (GQA), head size 64, with AVX2: the keys
// eight at a time, every head over the same eight rows before the next eight (so a key row comes
// from L2 once and from L1 for the other heads), and the value rows once for all G heads per
// column chunk (G x 4 accumulators of 8 columns; 64 / chunk passes over the rows). Per head and
// key the arithmetic is DotRowsAvx2's and AxpyRowsAvx2's exactly (the same FMAs, the same
// horizontal-sum tree, row-order updates per element). scores: [G][rows], q and out: [G][64].
template <int G>
__attribute__((target("avx2,fma"))) void DotRowsGroup64Avx2(const float* q, const float* base,
                                                            const int32_t* slots, int64_t rows,
                                                            int64_t stride, float scale,
                                                            float* scores) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t k = 0;
  for (; k + 8 <= rows; k += 8) {
    const float* b[8];
    for (int j = 0; j < 8; ++j) b[j] = base + slots[k + j] * stride;
    for (int g = 0; g < G; ++g) {
      const float* qh = q + 64 * g;
      __m256 v[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int i = 0; i < 64; i += 16) {
          acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), _mm256_loadu_ps(b[j] + i), acc0);
          acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i + 8), _mm256_loadu_ps(b[j] + i + 8), acc1);
        }
        v[j] = _mm256_add_ps(acc0, acc1);
      }
      _mm256_storeu_ps(scores + g * rows + k, _mm256_mul_ps(HorizontalSums8(v), vscale));
    }
  }
  for (; k < rows; ++k)
    for (int g = 0; g < G; ++g)
      scores[g * rows + k] = DotAvx2Inline(q + 64 * g, base + slots[k] * stride, 64) * scale;
}

template <int G>
__attribute__((target("avx2,fma"))) void AxpyRowsGroup64Avx2(const float* scores,
                                                             const float* base,
                                                             const int32_t* slots, int64_t rows,
                                                             int64_t stride, float* out) {
  constexpr int kVecs = G == 1 ? 8 : G == 4 ? 2 : 4;  // 8-column vectors per head and chunk
  for (int c = 0; c < 64; c += 8 * kVecs) {
    __m256 y[G][kVecs];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
      for (int i = 0; i < kVecs; ++i) y[g][i] = _mm256_loadu_ps(out + 64 * g + c + 8 * i);
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = base + slots[r] * stride + c;
#pragma GCC unroll 8
      for (int i = 0; i < kVecs; ++i) {
        const __m256 v = _mm256_loadu_ps(x + 8 * i);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
          y[g][i] = _mm256_fmadd_ps(_mm256_set1_ps(scores[g * rows + r]), v, y[g][i]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
      for (int i = 0; i < kVecs; ++i) _mm256_storeu_ps(out + 64 * g + c + 8 * i, y[g][i]);
  }
}

const GroupKernels kGroup64Avx2[5] = {{nullptr, nullptr},
                                      {DotRowsGroup64Avx2<1>, AxpyRowsGroup64Avx2<1>},
                                      {DotRowsGroup64Avx2<2>, AxpyRowsGroup64Avx2<2>},
                                      {DotRowsGroup64Avx2<3>, AxpyRowsGroup64Avx2<3>},
                                      {DotRowsGroup64Avx2<4>, AxpyRowsGroup64Avx2<4>}};

#define SI_ATT512 __attribute__((target("avx2,fma,avx512f,avx512vl")))
// The sum of v's two 256-bit halves. GCC 12's _mm512_castps512_ps256 and _mm512_extractf64x4_pd
// wrap a masked extract with an undefined pass-through, which -Wmaybe-uninitialized reports once
// inlined in DotRowsGroup64; with a full zero mask it is the same vextractf64x4.
SI_ATT512 inline __m256 AddHalves(__m512 v) {
  const __m512d d = _mm512_castps_pd(v);
  return _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, d, 0)),
                       _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, d, 1)));
}

// DotRowsAvx2 and AxpyRowsAvx2 with AVX-512 (F, VL) for head sizes that are multiples of 16:
// one zmm holds what DotAvx2Inline keeps in acc0 and acc1 (lanes 0-7: columns i..i+7, lanes
// 8-15: i+8..i+15, per step of 16), so each lane sees the same FMAs in the same order, and the
// horizontal sums follow the same tree; the row updates are element-wise FMAs in row order as
// before. Same results bit for bit, with half the instructions.
SI_ATT512 void DotRowsAvx512(const float* q, const float* base, const int32_t* slots,
                             int64_t rows, int64_t stride, int64_t n, float scale,
                             float* scores) {
  if (n % 16 != 0 || n > 128) return DotRowsAvx2(q, base, slots, rows, stride, n, scale, scores);
  __m512 qv[8];
  for (int64_t i = 0; i < n; i += 16) qv[i / 16] = _mm512_loadu_ps(q + i);
  const int steps = static_cast<int>(n / 16);
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t k = 0;
  auto row_sum = [&](const float* b) SI_ATT512 {
    // An FMA into zero, as DotAvx2Inline (a product -0 sums to +0 here too).
    __m512 acc = _mm512_fmadd_ps(qv[0], _mm512_loadu_ps(b), _mm512_setzero_ps());
    for (int i = 1; i < steps; ++i) acc = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(b + 16 * i), acc);
    return AddHalves(acc);
  };
  for (; k + 8 <= rows; k += 8) {
    __m256 v[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) v[j] = row_sum(base + slots[k + j] * stride);
    _mm256_storeu_ps(scores + k, _mm256_mul_ps(HorizontalSums8(v), vscale));
  }
  for (; k < rows; ++k) {
    const __m256 v = row_sum(base + slots[k] * stride);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    scores[k] = _mm_cvtss_f32(r) * scale;
  }
}

SI_ATT512 void AxpyRowsAvx512(const float* scores, const float* base, const int32_t* slots,
                              int64_t rows, int64_t stride, int64_t n, float* out) {
  if (n % 16 != 0 || n > 128) return AxpyRowsAvx2(scores, base, slots, rows, stride, n, out);
  const int steps = static_cast<int>(n / 16);
  __m512 y[8];
  for (int i = 0; i < steps; ++i) y[i] = _mm512_loadu_ps(out + 16 * i);
  if (steps == 4) {
    for (int64_t k = 0; k < rows; ++k) {
      const __m512 va = _mm512_set1_ps(scores[k]);
      const float* x = base + slots[k] * stride;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) y[i] = _mm512_fmadd_ps(va, _mm512_loadu_ps(x + 16 * i), y[i]);
    }
  } else {
    for (int64_t k = 0; k < rows; ++k) {
      const __m512 va = _mm512_set1_ps(scores[k]);
      const float* x = base + slots[k] * stride;
      for (int i = 0; i < steps; ++i) y[i] = _mm512_fmadd_ps(va, _mm512_loadu_ps(x + 16 * i), y[i]);
    }
  }
  for (int i = 0; i < steps; ++i) _mm512_storeu_ps(out + 16 * i, y[i]);
}

// The same grouping with AVX-512 (DotRowsGroup64Avx2 above): each key row and each value row is
// read once for the G heads instead of G times (the rows come from L2; this halves and more the
// time attention spends waiting for them). Per head and key the arithmetic is DotRowsAvx512's
// and AxpyRowsAvx512's exactly. scores: [G][rows], q and out: [G][64].
template <int G>
SI_ATT512 void DotRowsGroup64(const float* q, const float* base, const int32_t* slots,
                              int64_t rows, int64_t stride, float scale, float* scores) {
  const __m256 vscale = _mm256_set1_ps(scale);
  auto row_sum = [&](const float* qh, const float* b) SI_ATT512 {
    __m512 acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh), _mm512_loadu_ps(b), _mm512_setzero_ps());
#pragma GCC unroll 3
    for (int i = 1; i < 4; ++i)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), _mm512_loadu_ps(b + 16 * i), acc);
    return AddHalves(acc);
  };
  int64_t k = 0;
  for (; k + 8 <= rows; k += 8) {
    const float* b[8];
    for (int j = 0; j < 8; ++j) b[j] = base + slots[k + j] * stride;
    for (int g = 0; g < G; ++g) {
      const float* qh = q + 64 * g;
      __m256 v[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) v[j] = row_sum(qh, b[j]);
      _mm256_storeu_ps(scores + g * rows + k, _mm256_mul_ps(HorizontalSums8(v), vscale));
    }
  }
  for (; k < rows; ++k) {
    for (int g = 0; g < G; ++g) {
      const __m256 v = row_sum(q + 64 * g, base + slots[k] * stride);
      __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
      r = _mm_add_ps(r, _mm_movehl_ps(r, r));
      r = _mm_add_ss(r, _mm_movehdup_ps(r));
      scores[g * rows + k] = _mm_cvtss_f32(r) * scale;
    }
  }
}

template <int G>
SI_ATT512 void AxpyRowsGroup64(const float* scores, const float* base, const int32_t* slots,
                               int64_t rows, int64_t stride, float* out) {
  __m512 y[G][4];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) y[g][i] = _mm512_loadu_ps(out + 64 * g + 16 * i);
  for (int64_t k = 0; k < rows; ++k) {
    const float* x = base + slots[k] * stride;
    __m512 v[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) v[i] = _mm512_loadu_ps(x + 16 * i);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 va = _mm512_set1_ps(scores[g * rows + k]);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) y[g][i] = _mm512_fmadd_ps(va, v[i], y[g][i]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) _mm512_storeu_ps(out + 64 * g + 16 * i, y[g][i]);
}
#undef SI_ATT512

const GroupKernels kGroup64[5] = {{nullptr, nullptr},
                                  {DotRowsGroup64<1>, AxpyRowsGroup64<1>},
                                  {DotRowsGroup64<2>, AxpyRowsGroup64<2>},
                                  {DotRowsGroup64<3>, AxpyRowsGroup64<3>},
                                  {DotRowsGroup64<4>, AxpyRowsGroup64<4>}};

// exp of 8 floats: Cephes' expf (range reduction by ln 2 in two parts, degree-6 polynomial,
// 2^n from the exponent bits), within 2 ulp of expf for |x| <= 87; inputs clamped to
// [-87.3, 88.3] (results 2^-126 .. 2^127.4). A pure function of each lane: the same input gives
// the same output in every lane and every call.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 ExpAvx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Lanes [0, count) set (count <= 8): the masked loads and stores of a tail, so that the last
// elements go through exactly the same arithmetic as the others.
__attribute__((target("avx2"), always_inline)) inline __m256i TailMask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Softmax with ExpAvx2; the sum in 8 lanes (element i in lane i % 8), reduced as Hsum does.
__attribute__((target("avx2,fma"))) void SoftmaxAvx2(float* x, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  const __m256i tail = TailMask(n - i);
  if (i < n)
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(vmax, _mm256_maskload_ps(x + i, tail),
                                                 _mm256_castsi256_ps(tail)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const __m256 max = _mm256_broadcastss_ps(m4);
  __m256 sum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = ExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), max));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    const __m256 e = _mm256_and_ps(ExpAvx2(_mm256_sub_ps(_mm256_maskload_ps(x + i, tail), max)),
                                   _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(x + i, tail, e);
    sum = _mm256_add_ps(sum, e);
  }
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  const __m256 inv = _mm256_set1_ps(1.0f / _mm_cvtss_f32(r));
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  if (i < n) _mm256_maskstore_ps(x + i, tail, _mm256_mul_ps(_mm256_maskload_ps(x + i, tail), inv));
}

// gate = g / (1 + exp(-g)) * up, element-wise with ExpAvx2 (the tail masked, not scalar, so an
// element's value does not depend on where the array ends).
__attribute__((target("avx2,fma"))) void SwiGluAvx2(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto f = [&](__m256 g, __m256 u) __attribute__((target("avx2,fma"), always_inline)) {
    const __m256 e = ExpAvx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_mul_ps(g, _mm256_div_ps(one, _mm256_add_ps(one, e))), u);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(gate + i, f(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i tail = TailMask(n - i);
    _mm256_maskstore_ps(gate + i, tail,
                        f(_mm256_maskload_ps(gate + i, tail), _mm256_maskload_ps(up + i, tail)));
  }
}
#endif

struct AttentionKernels {
  float (*dot)(const float*, const float*, int64_t) = DotScalar;
  void (*axpy)(float, const float*, float*, int64_t) = AxpyScalar;
  void (*dot_rows)(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t, float,
                   float*) = DotRowsScalar;
  void (*axpy_rows)(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                    float*) = AxpyRowsScalar;
  // Head size 64: the grouped kernels above (AVX2 or AVX-512) for groups of 1..4 heads
  // (nullptr: none).
  const GroupKernels* group64 = nullptr;
  void (*softmax)(float*, int64_t) = SoftmaxScalar;
  void (*swiglu)(float*, const float*, int64_t) = SwiGluScalar;
};

const AttentionKernels& Kernels() {
  static const AttentionKernels k = [] {
    AttentionKernels r;
#if defined(__x86_64__)
    if (GetCpuFeatures().use_avx2_kernels) {
      r.dot = DotAvx2;
      r.axpy = AxpyAvx2;
      r.dot_rows = DotRowsAvx2;
      r.axpy_rows = AxpyRowsAvx2;
      r.softmax = SoftmaxAvx2;
      r.swiglu = SwiGluAvx2;
      r.group64 = kGroup64Avx2;
    }
    if (GetCpuFeatures().use_avx512_kernels) {
      r.dot_rows = DotRowsAvx512;
      r.axpy_rows = AxpyRowsAvx512;
      r.group64 = kGroup64;
    }
#endif
    return r;
  }();
  return k;
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) { return Kernels().dot(a, b, n); }
void Softmax(float* x, int64_t n) { Kernels().softmax(x, n); }
void SwiGlu(float* gate, const float* up, int64_t n) { Kernels().swiglu(gate, up, n); }
void Axpy(float alpha, const float* x, float* y, int64_t n) { Kernels().axpy(alpha, x, y, n); }

void AttendKvHead(const BatchSequence& s, int32_t i, const int32_t* slots, const float* keys,
                  const float* values, int64_t slot_stride, const float* q, int32_t group,
                  int32_t head_dim, float scale, std::vector<int32_t>& visible,
                  std::vector<float>& scores, float* out, int32_t qpos, int32_t sliding_window,
                  float softcap) {
  // Sliding window: key position p is seen when qpos - p < sliding_window. Committed entry p sits
  // at position p; the k-th entry this token sees after the prefix is its ancestor at depth k
  // (a chain or a tree laid out with positions by depth), at position kv_prefix + k.
  const int32_t first = sliding_window > 0 ? std::max(0, qpos - sliding_window + 1) : 0;
  const int32_t from = std::min(first, s.kv_prefix);
  visible.assign(slots + from, slots + s.kv_prefix);
  const int32_t window = s.masked_kv + s.token_count;
  int32_t k = 0;
  for (int32_t j = 0; j < window; ++j) {
    const bool sees = s.mask ? s.mask->Get(i, j) : j <= i;
    if (!sees) continue;
    if (s.kv_prefix + k++ >= first) visible.push_back(slots[s.kv_prefix + j]);
  }
  const int64_t nv = static_cast<int64_t>(visible.size());
  if (scores.size() < static_cast<size_t>(nv)) scores.resize(nv);
  const AttentionKernels& kern = Kernels();
  if (kern.group64 != nullptr && head_dim == 64 && group >= 1 && group <= 4) {
    if (scores.size() < static_cast<size_t>(nv * group)) scores.resize(nv * group);
    const GroupKernels& gk = kern.group64[group];
    gk.dot(q, keys, visible.data(), nv, slot_stride, scale, scores.data());
    for (int32_t g = 0; g < group; ++g) {
      SoftCap(scores.data() + g * nv, nv, softcap);
      kern.softmax(scores.data() + g * nv, nv);
    }
    std::fill_n(out, static_cast<int64_t>(group) * head_dim, 0.0f);
    gk.axpy(scores.data(), values, visible.data(), nv, slot_stride, out);
    return;
  }
  for (int32_t g = 0; g < group; ++g) {
    const float* qh = q + static_cast<int64_t>(g) * head_dim;
    kern.dot_rows(qh, keys, visible.data(), nv, slot_stride, head_dim, scale, scores.data());
    SoftCap(scores.data(), nv, softcap);
    kern.softmax(scores.data(), nv);
    float* oh = out + static_cast<int64_t>(g) * head_dim;
    std::fill_n(oh, head_dim, 0.0f);
    kern.axpy_rows(scores.data(), values, visible.data(), nv, slot_stride, head_dim, oh);
  }
}

}  // namespace specinfer::cpu
