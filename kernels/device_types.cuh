// Element types shared by the kernels: conversions between float and the 16-bit float types, and
// ggml's 32-element quantised blocks (the layouts of src/backend/cpu/quants.h, repeated here
// because kernels/ depends on nothing in src/).
//
//   Q4_0 (18 B): fp16 d; qs[16]           x = d * (q - 8)
//   Q4_1 (20 B): fp16 d, m; qs[16]        x = d * q + m
//   Q5_0 (22 B): fp16 d; qh[4]; qs[16]    x = d * (q + 16 h - 16)
//   Q5_1 (24 B): fp16 d, m; qh[4]; qs[16] x = d * (q + 16 h) + m
//   Q8_0 (34 B): fp16 d; int8 qs[32]      x = d * q
// For j < 16 the nibble of element j is qs[j] & 15 and that of element j + 16 is qs[j] >> 4;
// Q5's fifth bit h of element i is bit i of the little-endian 32-bit qh.
// Blocks are 2-byte aligned only, so they are read with 16-bit loads.
// K-quants (Q2_K..Q6_K, 256-element super-blocks): element formulas of src/backend/cpu/quants_k.h,
// computed here with the same float32 steps (products rounded separately, no fused
// multiply-add), so each element equals the CPU's to_float bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "elem_type.cuh"

namespace specinfer::kernels {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float HalfBitsToFloat(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

// Element i (< 32) of a quantised block, as float (same arithmetic as the CPU's to_float).
__device__ __forceinline__ float DequantQ8_0(const BlockQ8_0* b, int i) {
  return HalfBitsToFloat(b->d) * static_cast<float>(b->qs[i]);
}
__device__ __forceinline__ float DequantQ4_0(const BlockQ4_0* b, int i) {
  const int q = i < 16 ? (b->qs[i] & 15) : (b->qs[i - 16] >> 4);
  return HalfBitsToFloat(b->d) * static_cast<float>(q - 8);
}
__device__ __forceinline__ float DequantQ4_1(const BlockQ4_1* b, int i) {
  const int q = i < 16 ? (b->qs[i] & 15) : (b->qs[i - 16] >> 4);
  return __fadd_rn(__fmul_rn(HalfBitsToFloat(b->d), static_cast<float>(q)), HalfBitsToFloat(b->m));
}
// The 5-bit quant of element i of a Q5 block: its nibble and its bit of qh.
__device__ __forceinline__ int Quant5(const uint8_t* qh, const uint8_t* qs, int i) {
  const int lo = i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
  return lo | (((qh[i / 8] >> (i % 8)) & 1) << 4);
}
__device__ __forceinline__ float DequantQ5_0(const BlockQ5_0* b, int i) {
  return HalfBitsToFloat(b->d) * static_cast<float>(Quant5(b->qh, b->qs, i) - 16);
}
__device__ __forceinline__ float DequantQ5_1(const BlockQ5_1* b, int i) {
  return __fadd_rn(__fmul_rn(HalfBitsToFloat(b->d), static_cast<float>(Quant5(b->qh, b->qs, i))),
                   HalfBitsToFloat(b->m));
}

// Element e (< 256) of a K-quant super-block, as float: (d * sc) * q [- dmin * m], each product
// rounded to float32, as the CPU's to_float.
__device__ __forceinline__ float DequantQ2_K(const BlockQ2_K* b, int e) {
  const int q = (b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
  const int sc = b->scales[e / 16];
  const float dl = __fmul_rn(HalfBitsToFloat(b->d), static_cast<float>(sc & 15));
  const float ml = __fmul_rn(HalfBitsToFloat(b->dmin), static_cast<float>(sc >> 4));
  return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
}
// The signed 6-bit scale j (< 16) of Q3_K's packed scales[12].
__device__ __forceinline__ int ScaleQ3_K(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}
__device__ __forceinline__ float DequantQ3_K(const BlockQ3_K* b, int e) {
  const int lo = (b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
  const int q = lo - (((b->hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4);
  const float dl =
      __fmul_rn(HalfBitsToFloat(b->d), static_cast<float>(ScaleQ3_K(b->scales, e / 16)));
  return __fmul_rn(dl, static_cast<float>(q));
}
// The 6-bit scale and minimum of sub-block j (< 8) of Q4_K/Q5_K's packed scales[12].
__device__ __forceinline__ void ScaleMinK4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
__device__ __forceinline__ float DequantK4(uint16_t d, uint16_t dmin, const uint8_t* scales, int e,
                                           int q) {
  int sc, m;
  ScaleMinK4(e / 32, scales, sc, m);
  const float dl = __fmul_rn(HalfBitsToFloat(d), static_cast<float>(sc));
  const float ml = __fmul_rn(HalfBitsToFloat(dmin), static_cast<float>(m));
  return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
}
__device__ __forceinline__ float DequantQ4_K(const BlockQ4_K* b, int e) {
  const int byte = b->qs[32 * (e / 64) + e % 32];
  return DequantK4(b->d, b->dmin, b->scales, e, e % 64 < 32 ? (byte & 15) : (byte >> 4));
}
__device__ __forceinline__ float DequantQ5_K(const BlockQ5_K* b, int e) {
  const int byte = b->qs[32 * (e / 64) + e % 32];
  const int q =
      (e % 64 < 32 ? (byte & 15) : (byte >> 4)) | (((b->qh[e % 32] >> (e / 32)) & 1) << 4);
  return DequantK4(b->d, b->dmin, b->scales, e, q);
}
__device__ __forceinline__ float DequantQ6_K(const BlockQ6_K* b, int e) {
  const int h = e / 128, k = e % 128;
  const int l = b->ql[64 * h + k % 64];
  const int lo = k < 64 ? (l & 15) : (l >> 4);
  const int hi = (b->qh[32 * h + k % 32] >> (2 * (k / 32))) & 3;
  const float dl = __fmul_rn(HalfBitsToFloat(b->d), static_cast<float>(b->scales[e / 16]));
  return __fmul_rn(dl, static_cast<float>((lo | (hi << 4)) - 32));
}

// Element `col` of a row of type t that starts at `row` (bytes).
__device__ __forceinline__ float LoadElement(ElemType t, const uint8_t* row, int64_t col) {
  switch (t) {
    case ElemType::kF32:
      return reinterpret_cast<const float*>(row)[col];
    case ElemType::kF16:
      return ToFloat(reinterpret_cast<const __half*>(row)[col]);
    case ElemType::kBF16:
      return ToFloat(reinterpret_cast<const __nv_bfloat16*>(row)[col]);
    case ElemType::kQ8_0:
      return DequantQ8_0(reinterpret_cast<const BlockQ8_0*>(row) + col / 32,
                         static_cast<int>(col % 32));
    case ElemType::kQ4_0:
      return DequantQ4_0(reinterpret_cast<const BlockQ4_0*>(row) + col / 32,
                         static_cast<int>(col % 32));
    case ElemType::kQ4_1:
      return DequantQ4_1(reinterpret_cast<const BlockQ4_1*>(row) + col / 32,
                         static_cast<int>(col % 32));
    case ElemType::kQ5_0:
      return DequantQ5_0(reinterpret_cast<const BlockQ5_0*>(row) + col / 32,
                         static_cast<int>(col % 32));
    case ElemType::kQ5_1:
      return DequantQ5_1(reinterpret_cast<const BlockQ5_1*>(row) + col / 32,
                         static_cast<int>(col % 32));
    case ElemType::kQ2_K:
      return DequantQ2_K(reinterpret_cast<const BlockQ2_K*>(row) + col / 256,
                         static_cast<int>(col % 256));
    case ElemType::kQ3_K:
      return DequantQ3_K(reinterpret_cast<const BlockQ3_K*>(row) + col / 256,
                         static_cast<int>(col % 256));
    case ElemType::kQ4_K:
      return DequantQ4_K(reinterpret_cast<const BlockQ4_K*>(row) + col / 256,
                         static_cast<int>(col % 256));
    case ElemType::kQ5_K:
      return DequantQ5_K(reinterpret_cast<const BlockQ5_K*>(row) + col / 256,
                         static_cast<int>(col % 256));
    case ElemType::kQ6_K:
      return DequantQ6_K(reinterpret_cast<const BlockQ6_K*>(row) + col / 256,
                         static_cast<int>(col % 256));
  }
  return 0.0f;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

}  // namespace specinfer::kernels
