#include "launch.cuh"
#include "rmsnorm.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void RmsNormKernel(const float* __restrict__ x, const int32_t* __restrict__ row_ids,
                              const float* __restrict__ w, float* out, int n, float eps) {
  const size_t src_row = row_ids ? static_cast<size_t>(row_ids[blockIdx.x]) : blockIdx.x;
  const float* row = x + src_row * n;
  float* orow = out + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += row[i] * row[i];
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float scale;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
    scale = rsqrtf(total / static_cast<float>(n) + eps);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = w[i] * (scale * row[i]);
}

}  // namespace

cudaError_t LaunchRmsNorm(const float* x, const float* w, float* out, int rows, int n, float eps,
                          cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(rows, kThreads, 0, stream, RmsNormKernel)(x, nullptr, w, out, n, eps);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormRows(const float* x, const int32_t* row_ids, const float* w, float* out,
                              int rows, int n, float eps, cudaStream_t stream) {
  if (rows <= 0 || n <= 0 || row_ids == nullptr) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(rows, kThreads, 0, stream, RmsNormKernel)(x, row_ids, w, out, n, eps);
  return cudaGetLastError();
}

}  // namespace specinfer::kernels
