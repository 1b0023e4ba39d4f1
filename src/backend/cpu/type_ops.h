// Per-DType CPU routines used by the matrix products: how to turn stored blocks into floats, and
// the dot product between a weight row and an activation row.
//
// As in ggml, a quantized weight type is paired with an activation type (`vec_dot_type`): the
// activations of a matrix product are converted once per call (e.g. to Q8_0 blocks), then every
// weight row is dotted with them directly in quantized form, so no weight matrix is ever
// dequantised as a whole.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace specinfer::cpu {

struct TypeOps {
  // Converts n elements (a multiple of the block size) to float32. src: RowBytes(t, n) bytes.
  void (*to_float)(const void* src, float* dst, int64_t n) = nullptr;
  // Type the activations are converted to before vec_dot.
  DType vec_dot_type = DType::kF32;
  // Converts n float32 activations to vec_dot_type. dst: RowBytes(vec_dot_type, n) bytes.
  // nullptr when vec_dot_type is F32 (the activations are used as they are).
  void (*from_float)(const float* src, void* dst, int64_t n) = nullptr;
  // Returns sum_i w[i] * x[i] over n elements; w in this type, x in vec_dot_type.
  float (*vec_dot)(int64_t n, const void* w, const void* x) = nullptr;
  // Optional: the same dot of one weight row with `count` (1..kMaxMultiDot) activation rows
  // x + t * x_stride bytes, into out[t]; each result bit-identical to vec_dot's. Reading the
  // weights once for several tokens is what makes a token-tree pass cheaper per token than
  // decoding; nullptr where only vec_dot exists.
  void (*vec_dot_multi)(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                        float* out) = nullptr;
  // Optional: the dual, for decode steps: `count` (1..kMaxMultiDot) consecutive weight rows
  // w + r * w_stride bytes dotted with one activation row x, into out[r]; each result
  // bit-identical to vec_dot's. Loading and regrouping the activations once for several rows
  // saves work when a single token streams through the weights; nullptr where absent.
  void (*vec_dot_rows)(int64_t n, const void* w, size_t w_stride, const void* x, int count,
                       float* out) = nullptr;
  // Optional, together: vec_dot_multi for 1..kMaxPackedDot rows rearranged once per product
  // (`pack` turns one vec_dot_type row of n elements into packed_bytes(n) bytes), so that the
  // per-token regrouping work is not repeated for every weight row. Each result bit-identical
  // to vec_dot's on the unpacked row; nullptr where absent.
  size_t (*packed_bytes)(int64_t n) = nullptr;
  void (*pack)(int64_t n, const void* x, void* dst) = nullptr;
  void (*vec_dot_packed)(int64_t n, const void* w, const void* xp, size_t xp_stride, int count,
                         float* out) = nullptr;
};

inline constexpr int kMaxMultiDot = 4;
inline constexpr int kMaxPackedDot = 8;

// The routines for `t`, or nullptr if the CPU backend cannot use weights of that type.
const TypeOps* GetTypeOps(DType t);

}  // namespace specinfer::cpu
