// Matrix products against weight matrices of any supported DType, on the CPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "tensor/weight.h"

namespace specinfer::cpu {

// y[t, r] = sum_c w[r, c] * x[t, c] for t < n.
//   x: [n, w.cols] float32, y: [n, w.rows] float32.
// With `batch_invariant` the product is computed by per-(row, token) dot kernels, so a token's
// output is bit-for-bit the same whatever else is in the batch: this is what makes tree
// verification reproduce incremental decoding exactly. Without it, float32 weights and batches of
// at least kBlasMinRows rows go to BLAS sgemm, which is faster but blocks the sums by batch size.
// `scratch` holds the activations converted to the weight type's dot-product type; it is
// resized as needed and may be reused across calls.
inline constexpr int64_t kBlasMinRows = 16;
void MatMul(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool,
            std::vector<uint8_t>& scratch, bool batch_invariant = true);

// Several products of the same input, y_i = x w_i^T (all w_i with the same cols and type), in one
// parallel pass with one conversion of x: fewer thread wake-ups per decode step than calling
// MatMul for each. Results are bit-identical to separate MatMul calls.
struct MatMulTarget {
  const WeightMatrix* w;
  float* y;  // [n, w->rows]
};
void MatMulShared(std::span<const MatMulTarget> targets, const float* x, int64_t n,
                  ThreadPool& pool, std::vector<uint8_t>& scratch, bool batch_invariant = true);

// Writes row `r` of `w` as float32 into dst[0, w.cols).
void GetRow(const WeightMatrix& w, int64_t r, float* dst);

// Whether the CPU backend can use weights of this type.
bool SupportsType(DType t);

}  // namespace specinfer::cpu
