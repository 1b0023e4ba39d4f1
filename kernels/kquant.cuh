// K-quant weights (Q2_K..Q6_K) as the matrix-product kernel reads them: one 32-element group of a
// 256-element super-block at a time, its quants unpacked to bytes and its scales to float.
//
// Group g (< 8) of super-block b holds elements [32 g, 32 g + 32) of the block. Its quants are
// 32 consecutive bytes of each of the block's bit planes (qs; plus hmask, qh), unpacked here
// with shifts and masks into wd[8]: byte e of wd[j] is u, element 4 j + e's quant plus an offset
// (q = u - kKOffset: 0 for Q2_K/Q4_K/Q5_K, 4 for Q3_K, 32 for Q6_K). Scales: half h (< 2) of the
// group, elements [16 h, 16 h + 16), has dl[h] = d * sc and (Q2_K, Q4_K, Q5_K) ml[h] = dmin * m
// (Q4_K/Q5_K scale per 32 elements, so both halves are equal). The weight is then
// KWeight(dl, ml, u) = dl * q - ml with both steps rounded to float32: exactly the CPU's
// to_float (src/backend/cpu/quants_k.h) and DequantQ*_K of device_types.cuh.
// Alignment: blocks are 2-byte aligned (row starts are 256-byte aligned, block sizes even), and
// every 32-byte plane starts at an even offset, so the quants are read with 16-bit loads.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device_types.cuh"
#include "elem_type.cuh"

namespace specinfer::kernels {

template <ElemType W>
inline constexpr int kKOffset = W == ElemType::kQ3_K   ? 4
                                : W == ElemType::kQ6_K ? 32
                                                       : 0;
template <ElemType W>
inline constexpr bool kKHasMin =
    W == ElemType::kQ2_K || W == ElemType::kQ4_K || W == ElemType::kQ5_K;

// 32 bytes at p (2-byte aligned), 4 to a word.
__device__ __forceinline__ void Load32Bytes(const uint8_t* p, uint32_t (&w)[8]) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
  for (int k = 0; k < 8; ++k)
    w[k] = static_cast<uint32_t>(h[2 * k]) | static_cast<uint32_t>(h[2 * k + 1]) << 16;
}

// Group g of super-block b of a row of type W: unpacked quants wd, scales dl and minima ml (0
// for the types without one).
template <ElemType W>
__device__ __forceinline__ void LoadKGroup(const uint8_t* wrow, int64_t b, int g, uint32_t (&wd)[8],
                                           float (&dl)[2], float (&ml)[2]) {
  uint32_t lo[8], hi[8];
  if constexpr (W == ElemType::kQ2_K) {
    const BlockQ2_K* blk = reinterpret_cast<const BlockQ2_K*>(wrow) + b;
    Load32Bytes(blk->qs + 32 * (g / 4), lo);
#pragma unroll
    for (int k = 0; k < 8; ++k) wd[k] = (lo[k] >> (2 * (g % 4))) & 0x03030303u;
    const float d = HalfBitsToFloat(blk->d), dmin = HalfBitsToFloat(blk->dmin);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int sc = blk->scales[2 * g + h];
      dl[h] = __fmul_rn(d, static_cast<float>(sc & 15));
      ml[h] = __fmul_rn(dmin, static_cast<float>(sc >> 4));
    }
  } else if constexpr (W == ElemType::kQ3_K) {
    const BlockQ3_K* blk = reinterpret_cast<const BlockQ3_K*>(wrow) + b;
    Load32Bytes(blk->qs + 32 * (g / 4), lo);
    Load32Bytes(blk->hmask, hi);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      wd[k] = ((lo[k] >> (2 * (g % 4))) & 0x03030303u) | ((hi[k] >> g) & 0x01010101u) << 2;
    const float d = HalfBitsToFloat(blk->d);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      dl[h] = __fmul_rn(d, static_cast<float>(ScaleQ3_K(blk->scales, 2 * g + h)));
      ml[h] = 0.0f;
    }
  } else if constexpr (W == ElemType::kQ4_K || W == ElemType::kQ5_K) {
    using Block = std::conditional_t<W == ElemType::kQ4_K, BlockQ4_K, BlockQ5_K>;
    const Block* blk = reinterpret_cast<const Block*>(wrow) + b;
    Load32Bytes(blk->qs + 32 * (g / 2), lo);
#pragma unroll
    for (int k = 0; k < 8; ++k) wd[k] = (lo[k] >> (4 * (g % 2))) & 0x0f0f0f0fu;
    if constexpr (W == ElemType::kQ5_K) {
      Load32Bytes(blk->qh, hi);
#pragma unroll
      for (int k = 0; k < 8; ++k) wd[k] |= ((hi[k] >> g) & 0x01010101u) << 4;
    }
    int sc, m;
    ScaleMinK4(g, blk->scales, sc, m);
    dl[0] = dl[1] = __fmul_rn(HalfBitsToFloat(blk->d), static_cast<float>(sc));
    ml[0] = ml[1] = __fmul_rn(HalfBitsToFloat(blk->dmin), static_cast<float>(m));
  } else {
    static_assert(W == ElemType::kQ6_K);
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(wrow) + b;
    // Element 32 g + k: h = g / 4 (which 128), k' = 32 (g % 4) + k; its low nibble is in
    // ql[64 h + 32 (g % 2) + k] (low half for g % 4 < 2), its 2 high bits in qh[32 h + k].
    Load32Bytes(blk->ql + 64 * (g / 4) + 32 * (g % 2), lo);
    Load32Bytes(blk->qh + 32 * (g / 4), hi);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      wd[k] = ((lo[k] >> (4 * (g % 4 / 2))) & 0x0f0f0f0fu) |
              ((hi[k] >> (2 * (g % 4))) & 0x03030303u) << 4;
    const float d = HalfBitsToFloat(blk->d);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      dl[h] = __fmul_rn(d, static_cast<float>(blk->scales[2 * g + h]));
      ml[h] = 0.0f;
    }
  }
}

// Weight of element 4 j + e of the group (u = byte e of wd[j]; dl, ml those of half j / 4).
template <ElemType W>
__device__ __forceinline__ float KWeight(float dl, float ml, uint32_t word, int e) {
  const int q = static_cast<int>((word >> (8 * e)) & 0xff) - kKOffset<W>;
  const float v = __fmul_rn(dl, static_cast<float>(q));
  if constexpr (kKHasMin<W>) return __fsub_rn(v, ml);
  return v;
}

}  // namespace specinfer::kernels
