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

void Softmax(float* x, int64_t n) {
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

void SwiGlu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    gate[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
  }
}

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

// DotAvx2 per row, inlined: no indirect call per key.
__attribute__((target("avx2,fma"))) void DotRowsAvx2(const float* q, const float* base,
                                                     const int32_t* slots, int64_t rows,
                                                     int64_t stride, int64_t n, float scale,
                                                     float* scores) {
  for (int64_t k = 0; k < rows; ++k)
    scores[k] = DotAvx2Inline(q, base + slots[k] * stride, n) * scale;
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
#endif

struct AttentionKernels {
  float (*dot)(const float*, const float*, int64_t) = DotScalar;
  void (*axpy)(float, const float*, float*, int64_t) = AxpyScalar;
  void (*dot_rows)(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t, float,
                   float*) = DotRowsScalar;
  void (*axpy_rows)(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                    float*) = AxpyRowsScalar;
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
    }
#endif
    return r;
  }();
  return k;
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) { return Kernels().dot(a, b, n); }
void Axpy(float alpha, const float* x, float* y, int64_t n) { Kernels().axpy(alpha, x, y, n); }

void AttendKvHead(const BatchSequence& s, int32_t i, std::span<const int32_t> table,
                  int32_t block_size, const float* keys, const float* values, int64_t slot_stride,
                  const float* q, int32_t group, int32_t head_dim, float scale,
                  std::vector<int32_t>& visible, std::vector<float>& scores, float* out,
                  int32_t qpos, int32_t sliding_window, float softcap) {
  const int32_t bs = block_size;
  visible.clear();
  // Sliding window: key position p is seen when qpos - p < sliding_window. Committed entry p sits
  // at position p; the k-th entry this token sees after the prefix is its ancestor at depth k
  // (a chain or a tree laid out with positions by depth), at position kv_prefix + k.
  const int32_t first = sliding_window > 0 ? std::max(0, qpos - sliding_window + 1) : 0;
  for (int32_t p = std::min(first, s.kv_prefix); p < s.kv_prefix; ++p) visible.push_back(p);
  const int32_t window = s.masked_kv + s.token_count;
  int32_t k = 0;
  for (int32_t j = 0; j < window; ++j) {
    const bool sees = s.mask ? s.mask->Get(i, j) : j <= i;
    if (!sees) continue;
    if (s.kv_prefix + k++ >= first) visible.push_back(s.kv_prefix + j);
  }
  const int64_t nv = static_cast<int64_t>(visible.size());
  if (scores.size() < static_cast<size_t>(nv)) scores.resize(nv);
  // Positions -> cache slots, once for all heads of the group.
  for (int32_t& p : visible) p = static_cast<int32_t>(int64_t{table[p / bs]} * bs + p % bs);
  const AttentionKernels& kern = Kernels();
  for (int32_t g = 0; g < group; ++g) {
    const float* qh = q + static_cast<int64_t>(g) * head_dim;
    kern.dot_rows(qh, keys, visible.data(), nv, slot_stride, head_dim, scale, scores.data());
    SoftCap(scores.data(), nv, softcap);
    Softmax(scores.data(), nv);
    float* oh = out + static_cast<int64_t>(g) * head_dim;
    std::fill_n(oh, head_dim, 0.0f);
    kern.axpy_rows(scores.data(), values, visible.data(), nv, slot_stride, head_dim, oh);
  }
}

}  // namespace specinfer::cpu
