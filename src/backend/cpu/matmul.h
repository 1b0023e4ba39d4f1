// Matrix products against weight matrices of any supported DType, on the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/tiled_matrix.h"
#include "common/thread_pool.h"
#include "tensor/weight.h"

namespace specinfer::cpu {

// A weight matrix as the products use it: the model's view and, where its type has a tile
// layout (TiledMatrix::Supports), its tiles, which every product then reads instead (one
// summation order for decode steps, tree passes and prompts alike: tiled_matrix.h).
struct CpuMatrix {
  WeightMatrix view;
  std::shared_ptr<const TiledMatrix> tiles;  // null: the per-row TypeOps kernels

  // `w` with its tiles made where the type has them (ResourceExhausted if they cannot be
  // allocated).
  static StatusOr<CpuMatrix> Prepare(const WeightMatrix& w);
};

// y[t, r] = sum_c w[r, c] * x[t, c] for t < n.
//   x: [n, w.cols] float32, y: [n, w.rows] float32.
// With `batch_invariant` every output is computed in an order that depends only on its row and
// its token's activations (the tile kernels, or per-(row, token) dot kernels), so a token's
// output is bit-for-bit the same whatever else is in the batch: this is what makes tree
// verification reproduce incremental decoding exactly. Without it, float32 weights without tiles
// and batches of at least kBlasMinRows rows go to BLAS sgemm, which is faster but blocks the sums
// by batch size.
// `scratch` holds the activations converted to the weight type's dot-product type; it is
// resized as needed and may be reused across calls.
inline constexpr int64_t kBlasMinRows = 16;
void MatMul(const CpuMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool,
            std::vector<uint8_t>& scratch, bool batch_invariant = true);

// Several products of the same input, y_i = x w_i^T (all w_i with the same cols and type), in one
// parallel pass with one conversion of x: fewer thread wake-ups per decode step than calling
// MatMul for each. Results are bit-identical to separate MatMul calls.
struct MatMulTarget {
  const CpuMatrix* w;
  float* y;  // [n, w->rows]
};
void MatMulShared(std::span<const MatMulTarget> targets, const float* x, int64_t n,
                  ThreadPool& pool, std::vector<uint8_t>& scratch, bool batch_invariant = true);

// Per-token work of a pass whose every token's values come from its own inputs alone (activation
// quantisation, norms, RoPE, SwiGLU, residual adds), so how the tokens are split changes
// nothing: fn(b, e) for the tokens [b, e) of [0, n), on the pool's threads from kParallelTokens
// tokens of at least 8192 elements in all (a tree pass or a large batch: serial, these steps
// were the part of a 32-token pass that a second thread did not share), on this thread below
// (a decode step's few tokens cost less than waking the workers).
inline constexpr int64_t kParallelTokens = 16;
void ForTokens(ThreadPool& pool, int64_t n, int64_t elements_per_token,
               const std::function<void(int64_t, int64_t)>& fn);

// Writes row `r` of `w` as float32 into dst[0, w.cols).
void GetRow(const WeightMatrix& w, int64_t r, float* dst);

// Whether the CPU backend can use weights of this type.
bool SupportsType(DType t);

}  // namespace specinfer::cpu
