// Portable scalar versions of the block routines: the reference for the AVX2 kernels and the
// fallback on CPUs without AVX2. Written from the ggml block formats (see quants.h).
#include "backend/cpu/quants.h"

#include <cmath>
#include <cstring>

#include "tensor/half.h"

namespace specinfer::cpu::scalar {

namespace {

// roundf (halves away from zero), clamped to the symmetric int8 range; NaN -> 0. Written with an
// integer truncation instead of calling roundf: the same result, several times faster.
inline int8_t RoundToQ8(float v) {
  if (!(std::fabs(v) < 127.5f)) {  // also NaN
    if (v >= 127.5f) return 127;
    if (v <= -127.5f) return -127;
    return 0;
  }
  const int t = static_cast<int>(v);             // toward zero; exact for |v| < 2^31
  const float frac = v - static_cast<float>(t);  // exact
  const int r = t + (frac >= 0.5f) - (frac <= -0.5f);
  return static_cast<int8_t>(r > 127 ? 127 : (r < -127 ? -127 : r));
}

inline uint32_t LoadQh(const uint8_t qh[4]) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

// Quantises one block of 32 floats to int8 with scale amax/127; returns (d, sum of qs).
inline float QuantizeBlock8(const float* x, int8_t* qs, int32_t* sum) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    const float v = std::fabs(x[j]);
    if (v > amax) amax = v;  // NaN never compares greater: ignored, as by fmax
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int32_t s = 0;
  for (int j = 0; j < kQK; ++j) {
    qs[j] = RoundToQ8(x[j] * id);
    s += qs[j];
  }
  *sum = s;
  return d;
}

}  // namespace

void ToFloatF32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void ToFloatF16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(h[i]);
}

void ToFloatBF16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(h[i]);
}

void ToFloatQ4_0(const void* src, float* dst, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = Fp16ToFp32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = d * static_cast<float>((b[i].qs[j] & 0x0F) - 8);
      dst[j + kQK / 2] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

void ToFloatQ4_1(const void* src, float* dst, int64_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = Fp16ToFp32(b[i].d);
    const float m = Fp16ToFp32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = d * static_cast<float>(b[i].qs[j] & 0x0F) + m;
      dst[j + kQK / 2] = d * static_cast<float>(b[i].qs[j] >> 4) + m;
    }
  }
}

void ToFloatQ5_0(const void* src, float* dst, int64_t n) {
  const BlockQ5_0* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = Fp16ToFp32(b[i].d);
    const uint32_t qh = LoadQh(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      dst[j] = d * static_cast<float>(lo - 16);
      dst[j + kQK / 2] = d * static_cast<float>(hi - 16);
    }
  }
}

void ToFloatQ5_1(const void* src, float* dst, int64_t n) {
  const BlockQ5_1* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = Fp16ToFp32(b[i].d);
    const float m = Fp16ToFp32(b[i].m);
    const uint32_t qh = LoadQh(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      dst[j] = d * static_cast<float>(lo) + m;
      dst[j + kQK / 2] = d * static_cast<float>(hi) + m;
    }
  }
}

void ToFloatQ8_0(const void* src, float* dst, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = Fp16ToFp32(b[i].d);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

void ToFloatQ8_1(const void* src, float* dst, int64_t n) {
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = Fp16ToFp32(b[i].d);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

void FromFloatQ8_0(const float* src, void* dst, int64_t n) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    int32_t sum;
    y[i].d = Fp32ToFp16(QuantizeBlock8(src, y[i].qs, &sum));
  }
}

void FromFloatQ8_1(const float* src, void* dst, int64_t n) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    int32_t sum;
    const float d = QuantizeBlock8(src, y[i].qs, &sum);
    y[i].d = Fp32ToFp16(d);
    y[i].s = Fp32ToFp16(d * static_cast<float>(sum));
  }
}

float VecDotF32(int64_t n, const void* w, const void* x) {
  const float* a = static_cast<const float*>(w);
  const float* b = static_cast<const float*>(x);
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

float VecDotF16F32(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  const float* b = static_cast<const float*>(x);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += Fp16ToFp32(a[i]) * b[i];
  return s;
}

float VecDotBF16F32(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  const float* b = static_cast<const float*>(x);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += Bf16ToFp32(a[i]) * b[i];
  return s;
}

float VecDotQ4_0Q8_0(int64_t n, const void* w, const void* x) {
  const BlockQ4_0* a = static_cast<const BlockQ4_0*>(w);
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t si = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      si += ((a[i].qs[j] & 0x0F) - 8) * b[i].qs[j];
      si += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + kQK / 2];
    }
    sum += Fp16ToFp32(a[i].d) * Fp16ToFp32(b[i].d) * static_cast<float>(si);
  }
  return sum;
}

float VecDotQ4_1Q8_1(int64_t n, const void* w, const void* x) {
  const BlockQ4_1* a = static_cast<const BlockQ4_1*>(w);
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t si = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      si += (a[i].qs[j] & 0x0F) * b[i].qs[j];
      si += (a[i].qs[j] >> 4) * b[i].qs[j + kQK / 2];
    }
    // sum_j (d_w q_j + m) d_x p_j = d_w d_x sum_j q_j p_j + m * (d_x sum_j p_j)
    sum += Fp16ToFp32(a[i].d) * Fp16ToFp32(b[i].d) * static_cast<float>(si) +
           Fp16ToFp32(a[i].m) * Fp16ToFp32(b[i].s);
  }
  return sum;
}

float VecDotQ5_0Q8_0(int64_t n, const void* w, const void* x) {
  const BlockQ5_0* a = static_cast<const BlockQ5_0*>(w);
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint32_t qh = LoadQh(a[i].qh);
    int32_t si = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (a[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (a[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      si += (lo - 16) * b[i].qs[j] + (hi - 16) * b[i].qs[j + kQK / 2];
    }
    sum += Fp16ToFp32(a[i].d) * Fp16ToFp32(b[i].d) * static_cast<float>(si);
  }
  return sum;
}

float VecDotQ5_1Q8_1(int64_t n, const void* w, const void* x) {
  const BlockQ5_1* a = static_cast<const BlockQ5_1*>(w);
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const uint32_t qh = LoadQh(a[i].qh);
    int32_t si = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (a[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (a[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      si += lo * b[i].qs[j] + hi * b[i].qs[j + kQK / 2];
    }
    sum += Fp16ToFp32(a[i].d) * Fp16ToFp32(b[i].d) * static_cast<float>(si) +
           Fp16ToFp32(a[i].m) * Fp16ToFp32(b[i].s);
  }
  return sum;
}

float VecDotQ8_0Q8_0(int64_t n, const void* w, const void* x) {
  const BlockQ8_0* a = static_cast<const BlockQ8_0*>(w);
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(x);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t si = 0;
    for (int j = 0; j < kQK; ++j) si += a[i].qs[j] * b[i].qs[j];
    sum += Fp16ToFp32(a[i].d) * Fp16ToFp32(b[i].d) * static_cast<float>(si);
  }
  return sum;
}

float VecDotQ8_1Q8_1(int64_t n, const void* w, const void* x) {
  const BlockQ8_1* a = static_cast<const BlockQ8_1*>(w);
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(x);
  float sum = 0;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t si = 0;
    for (int j = 0; j < kQK; ++j) si += a[i].qs[j] * b[i].qs[j];
    sum += Fp16ToFp32(a[i].d) * Fp16ToFp32(b[i].d) * static_cast<float>(si);
  }
  return sum;
}

}  // namespace specinfer::cpu::scalar
