// Batch-invariant matrix product on the GPU: y = beta * y + x W^T, reading W in its stored type.
//
// Computes y[t, r] = beta * y[t, r] + sum_c W[r, c] * x[t, c] for t < n, r < rows, with W of type
// F32, F16, BF16, Q8_0, Q4_0 or Q4_1 read directly (quantised blocks are never expanded in
// memory) and x, y float32. beta == 0 does not read y.
// Layout: W [rows, ElemRowBytes(type, cols)] bytes, row-major (256-byte aligned); x [n, cols];
// y [n, rows].
// Launch: 128 threads (4 warps) per block, grid ceil(rows / 4); a warp computes one output row r
// for tiles of up to 8 tokens in turn (its weight row stays in cache across tiles). Each lane
// sums a fixed, strided subset of the columns with explicit fused multiply-adds, then a fixed
// butterfly of warp shuffles adds the 32 partial sums. The order of every addition depends only on `cols` and the type: a token's
// outputs are bit-identical whatever n is and whichever tile it falls in (what token-tree
// verification needs; cuBLAS promises no such thing).
// Tolerance against an fp64 reference on the same (dequantised) weights: 1e-5 * sum_c |W x|
// (float32 accumulation). Against the CPU backend, quantised types differ more, because the CPU
// quantises the activations to 8 bits first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "elem_type.cuh"

namespace specinfer::kernels {

cudaError_t LaunchLinear(ElemType type, const void* w, int64_t rows, int64_t cols, const float* x,
                         int32_t n, float* y, float beta, cudaStream_t stream);

}  // namespace specinfer::kernels
