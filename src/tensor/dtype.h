// Element types of weights and activations, and how each is laid out in blocks.
//
// Quantized types store a row as a sequence of fixed-size blocks (ggml's layouts, so GGUF
// tensors are used in place). A row of `cols` elements of type t takes
// cols / BlockSize(t) * BlockBytes(t) bytes; cols must be a multiple of BlockSize(t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace specinfer {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,  // 32 values: fp16 scale + 32 x int8
  kQ4_0,  // 32 values: fp16 scale + 16 bytes of 4-bit values (offset 8)
  kQ4_1,  // 32 values: fp16 scale, fp16 min + 16 bytes of 4-bit values
  kQ5_0,
  kQ5_1,
  kQ8_1,  // activation-side companion of Q4_1/Q5_1: fp16 d, fp16 d*sum + 32 x int8
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ8_K,  // activation-side companion of the K-quants
  kCount,
};

struct DTypeTraits {
  std::string_view name;
  int32_t block_size;   // elements per block (1 for plain floats)
  int32_t block_bytes;  // bytes per block
};

const DTypeTraits& GetDTypeTraits(DType t);
inline std::string_view DTypeName(DType t) { return GetDTypeTraits(t).name; }
inline bool IsQuantized(DType t) { return GetDTypeTraits(t).block_size > 1; }

// Bytes taken by `n` elements of type t (n must be a multiple of the block size).
inline size_t RowBytes(DType t, int64_t n) {
  const DTypeTraits& tr = GetDTypeTraits(t);
  return static_cast<size_t>(n / tr.block_size) * static_cast<size_t>(tr.block_bytes);
}

}  // namespace specinfer
