// ggml's K-quant block formats (256-element "super-blocks") and the CPU routines on them:
// dequantisation (to_float), quantisation of activation rows to Q8_K (from_float) and the dot
// product between a K-quant weight row and a Q8_K activation row (vec_dot, vec_dot_multi).
//
// Block layouts (little-endian, packed, as stored in GGUF files; d, dmin fp16). Element e of a
// block, 0 <= e < 256; "sub-block" s groups 16 (Q2/Q3/Q6) or 32 (Q4/Q5) consecutive elements.
//   Q2_K (84 B):  scales[16] (lo nibble sc, hi nibble m), qs[64], d, dmin
//                 q = (qs[32 * (e / 128) + e % 32] >> 2 * (e % 128 / 32)) & 3
//                 x = (d * sc[e / 16]) * q - (dmin * m[e / 16])
//   Q3_K (110 B): hmask[32], qs[64], scales[12] (16 x 6 bits, minus 32), d
//                 q = (qs bits as Q2_K) - (bit e / 32 of hmask[e % 32] ? 0 : 4)
//                 x = (d * sc[e / 16]) * q
//   Q4_K (144 B): d, dmin, scales[12] (8 x 6-bit sc, 8 x 6-bit m), qs[128]
//                 q = nibble (e % 64 < 32 ? low : high) of qs[32 * (e / 64) + e % 32]
//                 x = (d * sc[e / 32]) * q - (dmin * m[e / 32])
//   Q5_K (176 B): d, dmin, scales[12], qh[32], qs[128]
//                 q = Q4_K's nibble + 16 * (bit e / 32 of qh[e % 32])
//                 x = (d * sc[e / 32]) * q - (dmin * m[e / 32])
//   Q6_K (210 B): ql[128], qh[64], scales[16] int8, d
//                 h = e / 128, k = e % 128: q = (nibble (k < 64 ? low : high) of ql[64h + k % 64])
//                 | ((qh[32h + k % 32] >> 2 * (k / 32)) & 3) << 4, minus 32
//                 x = (d * sc[e / 16]) * q
//   Q8_K (292 B): d float32, qs[256] int8, bsums[16] int16 (sums of 16 consecutive qs)
//                 x = d * q
// to_float computes exactly these float32 expressions (the products in brackets first), which is
// what gguf-py's dequantize does, so the results are bit-identical to it.
//
// Q8_K activation quantisation is llama.cpp's quantize_row_q8_K_ref: max = the element of
// largest magnitude (first one on ties), iscale = -127 / max, q = round-half-even(iscale * x)
// capped at 127, d = 1 / iscale; an all-zero block gives d = 0 and q = 0.
//
// Dot products: per block, the integer sums are exact (int32): isum = sum_s sc[s] * sum_{e in s}
// q_e * p_e (p: the Q8_K quants; Q6_K's and Q3_K's q signed), and for the types with a minimum
// msum = sum_s m[s] * (sum of p over s, from bsums). Then, in float32 and in this order, with no
// fused multiply-add (this file's sources are compiled with -ffp-contract=off):
//   dd = fp16(d) * x.d;  [dm = fp16(dmin) * x.d;]
//   acc = acc + (dd * float(isum) [- dm * float(msum)])
// over the blocks in order, from acc = 0. Every kernel set (scalar, AVX2) follows this order, so
// all of them and the multi-token kernels give the same result bit for bit, and a numpy program
// doing the same float32 steps reproduces it (tests/reference/make_kquant_vectors.py).
//
// n (the element count) must be a multiple of 256. Pointers need no alignment beyond that of
// their block (2 bytes; 4 for Q8_K and float32).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/quants.h"

namespace specinfer::cpu {

inline constexpr int kQK_K = 256;  // elements per K-quant block

struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

// The 6-bit scale and minimum of sub-block j (0..7) of Q4_K/Q5_K's packed scales[12].
inline void GetScaleMinK4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The 16 signed 6-bit scales (-32..31) of Q3_K's packed scales[12].
inline void GetScalesQ3_K(const uint8_t* s, int8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

#define SPECINFER_KQUANT_DOTS                                     \
  float VecDotQ2_KQ8_K(int64_t n, const void* w, const void* x); \
  float VecDotQ3_KQ8_K(int64_t n, const void* w, const void* x); \
  float VecDotQ4_KQ8_K(int64_t n, const void* w, const void* x); \
  float VecDotQ5_KQ8_K(int64_t n, const void* w, const void* x); \
  float VecDotQ6_KQ8_K(int64_t n, const void* w, const void* x);

namespace scalar {
void ToFloatQ2_K(const void* src, float* dst, int64_t n);
void ToFloatQ3_K(const void* src, float* dst, int64_t n);
void ToFloatQ4_K(const void* src, float* dst, int64_t n);
void ToFloatQ5_K(const void* src, float* dst, int64_t n);
void ToFloatQ6_K(const void* src, float* dst, int64_t n);
void ToFloatQ8_K(const void* src, float* dst, int64_t n);
void FromFloatQ8_K(const float* src, void* dst, int64_t n);
SPECINFER_KQUANT_DOTS
float VecDotQ8_KQ8_K(int64_t n, const void* w, const void* x);
}  // namespace scalar

#if defined(SPECINFER_HAVE_X86_KERNELS)
namespace avx2 {
SPECINFER_KQUANT_DOTS
// The same dots of one weight row with `count` (1..kMaxMultiDot) activation rows
// x + t * x_stride bytes (TypeOps::vec_dot_multi), each bit-identical to the single-row kernel.
void VecDotQ2_KQ8_KMulti(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                         float* out);
void VecDotQ3_KQ8_KMulti(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                         float* out);
void VecDotQ4_KQ8_KMulti(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                         float* out);
void VecDotQ5_KQ8_KMulti(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                         float* out);
void VecDotQ6_KQ8_KMulti(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                         float* out);
}  // namespace avx2
#endif

#undef SPECINFER_KQUANT_DOTS

// The K-quant routines (weights Q2_K..Q6_K and Q8_K, all paired with Q8_K activations) of kernel
// set `isa`, for GetTypeOpsForIsa; nullptr if `t` is not one of them or the CPU cannot run the
// set. kAvx512 hands out the AVX2 kernels (no AVX-512 variants yet).
const TypeOps* GetKQuantTypeOps(DType t, KernelIsa isa);

}  // namespace specinfer::cpu
