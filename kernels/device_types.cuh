// Element types shared by the kernels: conversions between float and the 16-bit float types, and
// ggml's 32-element quantised blocks (the layouts of src/backend/cpu/quants.h, repeated here
// because kernels/ depends on nothing in src/).
//
//   Q4_0 (18 B): fp16 d; qs[16]           x = d * (q - 8)
//   Q4_1 (20 B): fp16 d, m; qs[16]        x = d * q + m
//   Q8_0 (34 B): fp16 d; int8 qs[32]      x = d * q
// For j < 16 the nibble of element j is qs[j] & 15 and that of element j + 16 is qs[j] >> 4.
// Blocks are 2-byte aligned only, so they are read with 16-bit loads.
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
