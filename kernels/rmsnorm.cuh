// RMSNorm on the GPU.
//
// Computes out[r, i] = w[i] * x[r, i] / sqrt(mean_i(x[r, :]^2) + eps) for r < rows, i < n.
// Layout: x, out [rows, n] row-major float32 (out may alias x); w [n].
// LaunchRmsNormRows normalises the gathered rows x[row_ids[r], :] into out[r, :] (the final norm
// of the rows whose logits are wanted); out must not alias x there.
// Launch: one block of 256 threads per row; the sum of squares is reduced in fp32 by warp
// shuffles then shared memory. Tolerance against the CPU reference (cpu::RmsNorm): 1e-5 relative
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
