// Batch-invariant matrix product on the GPU: y = beta * y + x W^T, reading W in its stored type.
//
// Computes y[t, r] = beta * y[t, r] + sum_c W[r, c] * x[t, c] for t < n, r < rows, with W of type
// F32, F16, BF16, Q8_0, Q4_0, Q4_1 or a K-quant (Q2_K..Q6_K) read directly (quantised blocks are
// never expanded in memory) and x, y float32. beta == 0 does not read y. cols must be a multiple
// of the type's block (32; 256 for the K-quants).
// Layout: W [rows, ElemRowBytes(type, cols)] bytes, row-major (256-byte aligned); x [n, cols];
// y [n, rows].
// Launch: 128 threads (4 warps) per block; a warp computes kRw consecutive output rows for
// tiles of up to kTok tokens in turn, so a block owns 4 * kRw rows, grid ceil(rows / (4 * kRw)).
// By n: n = 1 (decode), kRw = 1, kTok = 1, x read from global memory (L1), no shared memory:
// pure weight bandwidth. 2 <= n <= 8, and every n for the block types: kRw = 4, kTok = 8.
// n > 8, float types: kRw = 4, kTok = 16. In the last two the block stages each (token tile,
// column chunk) of x in shared memory (about 33 KiB dynamic; chunks of 1024 or 512 columns)
// and every warp reads it from there, so one activation load serves 4 weight rows and one
// 16-byte weight load serves up to kTok tokens; the block's weight rows are read from memory
// once per token tile (from L2 after the first tile).
// F16 and BF16 weights with cols a multiple of 32 (every real model's) run on tensor cores
// instead (mma.m16n8k16, sm_80+): the float32 activations split into two fp16 parts (with a
// per-token power-of-two scale against overflow) or three bf16 parts whose sum is x to float32
// precision (split by each block for up to 8 tokens, once by a first kernel for more), each
// multiplied exactly by the 16-bit weights, accumulated in float32 (17-64 tokens: blocks that
// each own one of the 8 column partitions of 256 rows, the partition sums added in order by a
// last kernel, so that a step's activations are read once per 256 rows); the order of
// every addition is again fixed by cols alone (see "Tensor-core path" in linear.cu), so this path
// is batch-invariant too. Tolerance as below; the tensor cores' own summation order within a
// 16-column product is the hardware's.
// Order of additions (CUDA-core path): lane l sums a fixed, strided subset of the columns (8-column groups l,
// l + 32, ...; for the block types, blocks l, l + 32, ...; for the K-quants, 32-element groups
// of super-blocks l, l + 32, ...; single columns l, l + 32, ... when cols is not a multiple of 8)
// in increasing column order with explicit fused multiply-adds,
// then a fixed butterfly of warp shuffles adds the 32 partial sums. Chunks are whole warp steps
// and every token has its own accumulators, so the order of every addition for y[t, r] depends
// only on `cols` and the type, never on n, kRw, kTok or the token's place in the batch: a
// token's outputs are bit-identical whatever batch it is in (what token-tree verification
// needs; cuBLAS promises no such thing).
// Q4_0/Q4_1/Q8_0 sum q * x per block and scale the sum; the K-quants' weights are first computed
// exactly as the CPU's to_float gives them (kquant.cuh), then multiply-added column by column.
// Tolerance against an fp64 reference on the same (dequantised) weights: 1e-5 * sum_c |W x|
// (float32 accumulation). Against the CPU backend, quantised types differ more, because the CPU
// quantises the activations to 8 bits first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "elem_type.cuh"

namespace specinfer::kernels {

// Device scratch, in floats, that a product of this type and shape needs for n tokens (the
// tensor-core path for more than 8 tokens: the activations split once into their 16-bit parts,
// and F16's scales; for 17-64 tokens also the 8 partition sums of every output); 0 when none.
// Enough for any product of at most these rows, columns and tokens.
int64_t LinearScratchFloats(ElemType type, int64_t rows, int64_t cols, int32_t n);

// Whether 17-64-token products of 16-bit weights run on the partition blocks (the default) or on
// the 32- and 64-token tiles of all partitions that ran them before (the same bits; benchmarks
// compare the two: bench_cuda_step --no-partition-blocks). Process-wide, for later launches.
void SetLinearPartitionBlocks(bool on);

// `scratch`: LinearScratchFloats(type, rows, cols, n) floats of device memory (may be null when
// that is 0; else null is cudaErrorInvalidValue).
cudaError_t LaunchLinear(ElemType type, const void* w, int64_t rows, int64_t cols, const float* x,
                         int32_t n, float* y, float beta, cudaStream_t stream,
                         float* scratch = nullptr);

}  // namespace specinfer::kernels
