// Element types of weight rows as the kernels see them, ggml's 32-element quantised block layouts
// (those of src/backend/cpu/quants.h) and its 256-element K-quant super-blocks (those of
// src/backend/cpu/quants_k.h, where the element formulas are), repeated because kernels/ depends
// on nothing in src/. No device code: host glue includes this header too.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECINFER_HOST_DEVICE __host__ __device__
#else
#define SPECINFER_HOST_DEVICE
#endif

namespace specinfer::kernels {

// Weight/element types a kernel can read. Values match nothing outside kernels/; the host glue
// maps specinfer::DType onto them.
enum class ElemType : int32_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K
};

inline constexpr int kQuantBlock = 32;    // elements of a Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 block
inline constexpr int kQuantBlockK = 256;  // elements of a K-quant super-block

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit i: the fifth bit of element i
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);

// K-quant super-blocks (d, dmin fp16 bits). Sizes are even, so in a row that starts 2-byte
// aligned every field is 2-byte aligned; none is 4-byte aligned in general.
struct BlockQ2_K {
  uint8_t scales[16];  // lo nibble scale, hi nibble minimum, per 16 elements
  uint8_t qs[64];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];  // 16 x 6 bits, minus 32
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 x 6-bit scale, 8 x 6-bit minimum (per 32 elements)
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

SPECINFER_HOST_DEVICE inline constexpr bool IsKQuant(ElemType t) {
  return t == ElemType::kQ2_K || t == ElemType::kQ3_K || t == ElemType::kQ4_K ||
         t == ElemType::kQ5_K || t == ElemType::kQ6_K;
}

// Elements per block of type t: a row's length must be a multiple of it (1 for the float types).
SPECINFER_HOST_DEVICE inline constexpr int ElemBlockElems(ElemType t) {
  return IsKQuant(t) ? kQuantBlockK
         : (t == ElemType::kQ8_0 || t == ElemType::kQ4_0 || t == ElemType::kQ4_1 ||
            t == ElemType::kQ5_0 || t == ElemType::kQ5_1)
             ? kQuantBlock
             : 1;
}

// Bytes of a row of `n` elements of type t (n a multiple of ElemBlockElems(t)).
SPECINFER_HOST_DEVICE inline int64_t ElemRowBytes(ElemType t, int64_t n) {
  switch (t) {
    case ElemType::kF32:
      return n * 4;
    case ElemType::kF16:
    case ElemType::kBF16:
      return n * 2;
    case ElemType::kQ8_0:
      return n / 32 * 34;
    case ElemType::kQ4_0:
      return n / 32 * 18;
    case ElemType::kQ4_1:
      return n / 32 * 20;
    case ElemType::kQ5_0:
      return n / 32 * 22;
    case ElemType::kQ5_1:
      return n / 32 * 24;
    case ElemType::kQ2_K:
      return n / 256 * 84;
    case ElemType::kQ3_K:
      return n / 256 * 110;
    case ElemType::kQ4_K:
      return n / 256 * 144;
    case ElemType::kQ5_K:
      return n / 256 * 176;
    case ElemType::kQ6_K:
      return n / 256 * 210;
  }
  return 0;
}

}  // namespace specinfer::kernels
