// Portable scalar K-quant routines (the reference for the AVX2 kernels and the fallback on CPUs
// without AVX2), and the K-quant routine tables. Formats and the exact order of the float steps:
// quants_k.h. Each block's quants are first unpacked to int8 (q_e, element order), then used.
#include "backend/cpu/quants_k.h"

#include <array>
#include <cmath>
#include <cstring>

#include "backend/cpu/simd.h"
#include "tensor/half.h"

namespace specinfer::cpu {

namespace {

// q_e of one block, element order, as in quants_k.h (Q3_K and Q6_K signed; the others >= 0).
void UnpackQ2_K(const BlockQ2_K& b, int8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    q[e] = static_cast<int8_t>((b.qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3);
  }
}

void UnpackQ3_K(const BlockQ3_K& b, int8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const int lo = (b.qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
    const int hi = (b.hmask[e % 32] >> (e / 32)) & 1;
    q[e] = static_cast<int8_t>(lo - (hi ? 0 : 4));
  }
}

void UnpackQ4_K(const BlockQ4_K& b, int8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    q[e] = static_cast<int8_t>(e % 64 < 32 ? (byte & 0xF) : (byte >> 4));
  }
}

void UnpackQ5_K(const BlockQ5_K& b, int8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    const int lo = e % 64 < 32 ? (byte & 0xF) : (byte >> 4);
    const int hi = (b.qh[e % 32] >> (e / 32)) & 1;
    q[e] = static_cast<int8_t>(lo | (hi << 4));
  }
}

void UnpackQ6_K(const BlockQ6_K& b, int8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, k = e % 128;
    const uint8_t l = b.ql[64 * h + k % 64];
    const int lo = k < 64 ? (l & 0xF) : (l >> 4);
    const int hi = (b.qh[32 * h + k % 32] >> (2 * (k / 32))) & 3;
    q[e] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

// sum_{e in [begin, begin + len)} q_e * p_e
inline int32_t DotI8(const int8_t* q, const int8_t* p, int len) {
  int32_t s = 0;
  for (int e = 0; e < len; ++e) s += q[e] * p[e];
  return s;
}

// Sums of p over 32-element sub-block j, from the 16-element bsums.
inline int32_t Bsum32(const BlockQ8_K& x, int j) { return x.bsums[2 * j] + x.bsums[2 * j + 1]; }

// The float steps of quants_k.h for one block.
inline float BlockWithMin(uint16_t d, uint16_t dmin, float xd, int32_t isum, int32_t msum) {
  const float dd = Fp16ToFp32(d) * xd;
  const float dm = Fp16ToFp32(dmin) * xd;
  return dd * static_cast<float>(isum) - dm * static_cast<float>(msum);
}
inline float BlockNoMin(uint16_t d, float xd, int32_t isum) {
  return Fp16ToFp32(d) * xd * static_cast<float>(isum);
}

// llama.cpp's nearest_int: round half to even for |v| < 2^22 (the magic-number trick).
inline int NearestInt(float v) {
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007FFFFF) - 0x00400000;
}

}  // namespace

namespace scalar {

void ToFloatQ2_K(const void* src, float* dst, int64_t n) {
  const BlockQ2_K* b = static_cast<const BlockQ2_K*>(src);
  int8_t q[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    UnpackQ2_K(b[i], q);
    const float d = Fp16ToFp32(b[i].d), dmin = Fp16ToFp32(b[i].dmin);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * static_cast<float>(b[i].scales[s] & 0xF);
      const float ml = dmin * static_cast<float>(b[i].scales[s] >> 4);
      for (int e = 16 * s; e < 16 * s + 16; ++e) dst[e] = dl * static_cast<float>(q[e]) - ml;
    }
  }
}

void ToFloatQ3_K(const void* src, float* dst, int64_t n) {
  const BlockQ3_K* b = static_cast<const BlockQ3_K*>(src);
  int8_t q[kQK_K], sc[16];
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    UnpackQ3_K(b[i], q);
    GetScalesQ3_K(b[i].scales, sc);
    const float d = Fp16ToFp32(b[i].d);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * static_cast<float>(sc[s]);
      for (int e = 16 * s; e < 16 * s + 16; ++e) dst[e] = dl * static_cast<float>(q[e]);
    }
  }
}

void ToFloatQ4_K(const void* src, float* dst, int64_t n) {
  const BlockQ4_K* b = static_cast<const BlockQ4_K*>(src);
  int8_t q[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    UnpackQ4_K(b[i], q);
    const float d = Fp16ToFp32(b[i].d), dmin = Fp16ToFp32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      GetScaleMinK4(s, b[i].scales, &sc, &m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      for (int e = 32 * s; e < 32 * s + 32; ++e) dst[e] = dl * static_cast<float>(q[e]) - ml;
    }
  }
}

void ToFloatQ5_K(const void* src, float* dst, int64_t n) {
  const BlockQ5_K* b = static_cast<const BlockQ5_K*>(src);
  int8_t q[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    UnpackQ5_K(b[i], q);
    const float d = Fp16ToFp32(b[i].d), dmin = Fp16ToFp32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      GetScaleMinK4(s, b[i].scales, &sc, &m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      for (int e = 32 * s; e < 32 * s + 32; ++e) dst[e] = dl * static_cast<float>(q[e]) - ml;
    }
  }
}

void ToFloatQ6_K(const void* src, float* dst, int64_t n) {
  const BlockQ6_K* b = static_cast<const BlockQ6_K*>(src);
  int8_t q[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    UnpackQ6_K(b[i], q);
    const float d = Fp16ToFp32(b[i].d);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * static_cast<float>(b[i].scales[s]);
      for (int e = 16 * s; e < 16 * s + 16; ++e) dst[e] = dl * static_cast<float>(q[e]);
    }
  }
}

void ToFloatQ8_K(const void* src, float* dst, int64_t n) {
  const BlockQ8_K* b = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    for (int e = 0; e < kQK_K; ++e) dst[e] = b[i].d * static_cast<float>(b[i].qs[e]);
  }
}

void FromFloatQ8_K(const float* src, void* dst, int64_t n) {
  BlockQ8_K* y = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
    float max = 0.0f, amax = 0.0f;
    for (int e = 0; e < kQK_K; ++e) {
      const float ax = std::fabs(src[e]);
      if (ax > amax) {  // NaN never compares greater: ignored
        amax = ax;
        max = src[e];
      }
    }
    if (amax == 0.0f) {
      y[i].d = 0.0f;
      std::memset(y[i].qs, 0, sizeof(y[i].qs));
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int e = 0; e < kQK_K; ++e) {
      const float v = iscale * src[e];
      // |v| <= 127 up to rounding, except for NaN inputs (any value then; keep it in range).
      const int r = std::fabs(v) < 128.0f ? NearestInt(v) : 0;
      y[i].qs[e] = static_cast<int8_t>(r > 127 ? 127 : (r < -128 ? -128 : r));
    }
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) sum += y[i].qs[e];
      y[i].bsums[s] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

float VecDotQ2_KQ8_K(int64_t n, const void* w, const void* x) {
  const BlockQ2_K* a = static_cast<const BlockQ2_K*>(w);
  const BlockQ8_K* b = static_cast<const BlockQ8_K*>(x);
  int8_t q[kQK_K];
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    UnpackQ2_K(a[i], q);
    int32_t isum = 0, msum = 0;
    for (int s = 0; s < 16; ++s) {
      isum += (a[i].scales[s] & 0xF) * DotI8(q + 16 * s, b[i].qs + 16 * s, 16);
      msum += (a[i].scales[s] >> 4) * b[i].bsums[s];
    }
    acc += BlockWithMin(a[i].d, a[i].dmin, b[i].d, isum, msum);
  }
  return acc;
}

float VecDotQ3_KQ8_K(int64_t n, const void* w, const void* x) {
  const BlockQ3_K* a = static_cast<const BlockQ3_K*>(w);
  const BlockQ8_K* b = static_cast<const BlockQ8_K*>(x);
  int8_t q[kQK_K], sc[16];
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    UnpackQ3_K(a[i], q);
    GetScalesQ3_K(a[i].scales, sc);
    int32_t isum = 0;
    for (int s = 0; s < 16; ++s) isum += sc[s] * DotI8(q + 16 * s, b[i].qs + 16 * s, 16);
    acc += BlockNoMin(a[i].d, b[i].d, isum);
  }
  return acc;
}

// Q4_K and Q5_K: eight 32-element sub-blocks, each with a 6-bit scale and minimum.
template <typename Block, void (*Unpack)(const Block&, int8_t*)>
float VecDotWithMinK(int64_t n, const void* w, const void* x) {
  const Block* a = static_cast<const Block*>(w);
  const BlockQ8_K* b = static_cast<const BlockQ8_K*>(x);
  int8_t q[kQK_K];
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    Unpack(a[i], q);
    int32_t isum = 0, msum = 0;
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      GetScaleMinK4(s, a[i].scales, &sc, &m);
      isum += sc * DotI8(q + 32 * s, b[i].qs + 32 * s, 32);
      msum += m * Bsum32(b[i], s);
    }
    acc += BlockWithMin(a[i].d, a[i].dmin, b[i].d, isum, msum);
  }
  return acc;
}

float VecDotQ4_KQ8_K(int64_t n, const void* w, const void* x) {
  return VecDotWithMinK<BlockQ4_K, UnpackQ4_K>(n, w, x);
}

float VecDotQ5_KQ8_K(int64_t n, const void* w, const void* x) {
  return VecDotWithMinK<BlockQ5_K, UnpackQ5_K>(n, w, x);
}

float VecDotQ6_KQ8_K(int64_t n, const void* w, const void* x) {
  const BlockQ6_K* a = static_cast<const BlockQ6_K*>(w);
  const BlockQ8_K* b = static_cast<const BlockQ8_K*>(x);
  int8_t q[kQK_K];
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    UnpackQ6_K(a[i], q);
    int32_t isum = 0;
    for (int s = 0; s < 16; ++s) isum += a[i].scales[s] * DotI8(q + 16 * s, b[i].qs + 16 * s, 16);
    acc += BlockNoMin(a[i].d, b[i].d, isum);
  }
  return acc;
}

// Q8_K as a weight type (ggml never stores it in files; complete for symmetry with Q8_1).
float VecDotQ8_KQ8_K(int64_t n, const void* w, const void* x) {
  const BlockQ8_K* a = static_cast<const BlockQ8_K*>(w);
  const BlockQ8_K* b = static_cast<const BlockQ8_K*>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const int32_t isum = DotI8(a[i].qs, b[i].qs, kQK_K);
    acc += a[i].d * b[i].d * static_cast<float>(isum);
  }
  return acc;
}

}  // namespace scalar

namespace {

constexpr DType kKTypes[] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                             DType::kQ5_K, DType::kQ6_K, DType::kQ8_K};

struct KTable {
  std::array<TypeOps, 6> ops{};
  const TypeOps* Get(DType t) const {
    for (size_t i = 0; i < ops.size(); ++i)
      if (kKTypes[i] == t) return &ops[i];
    return nullptr;
  }
};

TypeOps Op(void (*to_float)(const void*, float*, int64_t),
           float (*vec_dot)(int64_t, const void*, const void*)) {
  // to_float and the Q8_K quantiser are the scalar ones in every kernel set: both are exact, and
  // neither is on a hot path (embedding rows, --dequantize; one activation row per product).
  return TypeOps{.to_float = to_float,
                 .vec_dot_type = DType::kQ8_K,
                 .from_float = scalar::FromFloatQ8_K,
                 .vec_dot = vec_dot};
}

const KTable& ScalarKTable() {
  static const KTable t{{Op(scalar::ToFloatQ2_K, scalar::VecDotQ2_KQ8_K),
                         Op(scalar::ToFloatQ3_K, scalar::VecDotQ3_KQ8_K),
                         Op(scalar::ToFloatQ4_K, scalar::VecDotQ4_KQ8_K),
                         Op(scalar::ToFloatQ5_K, scalar::VecDotQ5_KQ8_K),
                         Op(scalar::ToFloatQ6_K, scalar::VecDotQ6_KQ8_K),
                         Op(scalar::ToFloatQ8_K, scalar::VecDotQ8_KQ8_K)}};
  return t;
}

#if defined(SPECINFER_HAVE_X86_KERNELS)
const KTable& Avx2KTable() {
  static const KTable t = [] {
    KTable k{{Op(scalar::ToFloatQ2_K, avx2::VecDotQ2_KQ8_K),
              Op(scalar::ToFloatQ3_K, avx2::VecDotQ3_KQ8_K),
              Op(scalar::ToFloatQ4_K, avx2::VecDotQ4_KQ8_K),
              Op(scalar::ToFloatQ5_K, avx2::VecDotQ5_KQ8_K),
              Op(scalar::ToFloatQ6_K, avx2::VecDotQ6_KQ8_K),
              Op(scalar::ToFloatQ8_K, scalar::VecDotQ8_KQ8_K)}};
    k.ops[0].vec_dot_multi = avx2::VecDotQ2_KQ8_KMulti;
    k.ops[1].vec_dot_multi = avx2::VecDotQ3_KQ8_KMulti;
    k.ops[2].vec_dot_multi = avx2::VecDotQ4_KQ8_KMulti;
    k.ops[3].vec_dot_multi = avx2::VecDotQ5_KQ8_KMulti;
    k.ops[4].vec_dot_multi = avx2::VecDotQ6_KQ8_KMulti;
    return k;
  }();
  return t;
}
#endif

}  // namespace

const TypeOps* GetKQuantTypeOps(DType t, KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar:
      return ScalarKTable().Get(t);
    case KernelIsa::kAvx2:
    case KernelIsa::kAvx512:
#if defined(SPECINFER_HAVE_X86_KERNELS)
      if (isa == KernelIsa::kAvx2 ? GetCpuFeatures().use_avx2_kernels
                                  : GetCpuFeatures().use_avx512_kernels) {
        return Avx2KTable().Get(t);
      }
#endif
      return nullptr;
  }
  return nullptr;
}

}  // namespace specinfer::cpu
