// Element types of weight rows as the kernels see them, and ggml's 32-element quantised block
// layouts (those of src/backend/cpu/quants.h, repeated because kernels/ depends on nothing in
// src/). No device code: host glue includes this header too.
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
enum class ElemType : int32_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1 };

inline constexpr int kQuantBlock = 32;

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);

// Bytes of a row of `n` elements of type t (n a multiple of 32 for the block types).
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
  }
  return 0;
}

}  // namespace specinfer::kernels
