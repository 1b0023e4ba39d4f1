// Matrix products against weight matrices of any supported DType, on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "tensor/weight.h"

namespace specinfer::cpu {

// Rows of a batch up to which the product is computed by the per-row dot kernels. Those are
// batch-invariant: a token's output is bit-for-bit the same whether it is computed alone or in a
// batch of up to this many tokens, which is what makes tree verification reproduce incremental
// decoding exactly. Larger F32 batches (long prompts) go to BLAS sgemm for speed.
inline constexpr int64_t kBatchInvariantRows = 256;

// y[t, r] = sum_c w[r, c] * x[t, c] for t < n.
//   x: [n, w.cols] float32, y: [n, w.rows] float32.
// `scratch` holds the activations converted to the weight type's dot-product type; it is
// resized as needed and may be reused across calls.
void MatMul(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool,
            std::vector<uint8_t>& scratch);

// Writes row `r` of `w` as float32 into dst[0, w.cols).
void GetRow(const WeightMatrix& w, int64_t r, float* dst);

// Whether the CPU backend can use weights of this type.
bool SupportsType(DType t);

}  // namespace specinfer::cpu
