// RMSNorm on the GPU.
//
// Computes out[r, i] = w[i] * x[r, i] / sqrt(mean_i(x[r, :]^2) + eps) for r < rows, i < n.
// Layout: x, out [rows, n] row-major float32 (out may alias x); w [n].
// LaunchRmsNormRows normalises the gathered rows x[row_ids[r], :] into out[r, :] (the final norm
// of the rows whose logits are wanted); out must not alias x there.
// Launch: one block per row. Where n % 4 == 0, the pointers are 16-byte aligned and n <= 16384,
// each thread holds up to four float4s of the row in registers (one read of the row); otherwise
// 256 threads stride over it. The sum of squares is reduced in fp32 by warp shuffles then shared
// memory in a fixed order that depends only on n, so a row's bits do not depend on the batch. Tolerance against the CPU reference (cpu::RmsNorm): 1e-5 relative
// (only the summation order differs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specinfer::kernels {

cudaError_t LaunchRmsNorm(const float* x, const float* w, float* out, int rows, int n, float eps,
                          cudaStream_t stream);
cudaError_t LaunchRmsNormRows(const float* x, const int32_t* row_ids, const float* w, float* out,
                              int rows, int n, float eps, cudaStream_t stream);

}  // namespace specinfer::kernels
