// Dequantisation of weight rows on the GPU: whole matrices (quantised weights turned into fp16
// for cuBLAS, on the fly into a workspace) and selected rows (the embedding gather).
//
// Computes out[r, c] = element c of source row ids[r] (ids == nullptr: row r), as float or fp16,
// for types F32, F16, BF16, Q8_0, Q4_0, Q4_1 and the K-quants Q2_K..Q6_K (ggml block layouts,
// see device_types.cuh); cols a multiple of the type's block (32, or 256 for the K-quants).
// Layout: src [src_rows, ElemRowBytes(type, cols)] bytes, row-major; out [rows, cols].
// Launch: grid (ceil(cols / 256), rows), 256 threads, one element per thread.
// Tolerance against the CPU reference (cpu::GetTypeOps(t)->to_float): exact for float output
// (same arithmetic, no fused multiply-add); for fp16 output, the CPU value rounded to fp16.
// Token ids outside [0, src_rows) produce zero rows (the host checks ids before launching).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "elem_type.cuh"

namespace specinfer::kernels {

cudaError_t LaunchDequantizeRows(ElemType type, const void* src, int64_t src_rows, int64_t cols,
                                 const int32_t* ids, int64_t rows, float* out, cudaStream_t stream);
cudaError_t LaunchDequantizeRows(ElemType type, const void* src, int64_t src_rows, int64_t cols,
                                 const int32_t* ids, int64_t rows, __half* out,
                                 cudaStream_t stream);

}  // namespace specinfer::kernels
