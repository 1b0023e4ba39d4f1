#include <cstdint>

#include "launch.cuh"
#include "rmsnorm.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kGenericThreads = 256;

// Sums the block's per-thread partials in a fixed order (lanes by shuffle, then warps in index
// order), so a row's result depends only on n, never on how many rows are in the launch.
__device__ __forceinline__ float BlockSum(float v, float* warp_sums, float* total) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warps = (blockDim.x + 31) / 32;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int i = 0; i < warps; ++i) s += warp_sums[i];
    *total = s;
  }
  __syncthreads();
  return *total;
}

__device__ __forceinline__ size_t SourceRow(const int32_t* row_ids) {
  return row_ids ? static_cast<size_t>(row_ids[blockIdx.x]) : blockIdx.x;
}

// n % 4 == 0, 16-byte aligned rows, n / 4 <= kVec * blockDim.x: each thread keeps its kVec
// float4s in registers, so the row is read from memory once (one 16-byte load per thread at the
// model widths decode uses; the old one-float-per-thread loop was latency-bound, 15 us a row).
template <int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    RmsNormVecKernel(const float* __restrict__ x, const int32_t* __restrict__ row_ids,
                     const float* __restrict__ w, float* out, int n, float eps) {
  __shared__ float warp_sums[kMaxThreads / 32];
  __shared__ float total;
  const int n4 = n / 4;
  const float4* row = reinterpret_cast<const float4*>(x + SourceRow(row_ids) * n);
  float4* orow = reinterpret_cast<float4*>(out + static_cast<size_t>(blockIdx.x) * n);
  float4 v[kVec];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    v[j] = i < n4 ? row[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  const float scale = rsqrtf(BlockSum(ss, warp_sums, &total) / static_cast<float>(n) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n4) {
      const float4 g = w4[i];
      orow[i] = make_float4(g.x * (scale * v[j].x), g.y * (scale * v[j].y), g.z * (scale * v[j].z),
                            g.w * (scale * v[j].w));
    }
  }
}

// Any n and alignment: strided floats, the row read twice.
__global__ void __launch_bounds__(kGenericThreads)
    RmsNormKernel(const float* __restrict__ x, const int32_t* __restrict__ row_ids,
                  const float* __restrict__ w, float* out, int n, float eps) {
  __shared__ float warp_sums[kGenericThreads / 32];
  __shared__ float total;
  const float* row = x + SourceRow(row_ids) * n;
  float* orow = out + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += row[i] * row[i];
  const float scale = rsqrtf(BlockSum(ss, warp_sums, &total) / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = w[i] * (scale * row[i]);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

cudaError_t Launch(const float* x, const int32_t* row_ids, const float* w, float* out, int rows,
                   int n, float eps, cudaStream_t stream) {
  const int n4 = n / 4;
  if (n % 4 == 0 && Aligned16(x) && Aligned16(w) && Aligned16(out) && n4 <= 4 * kMaxThreads) {
    // The fewest float4s per thread that fit, then as few threads (whole warps) as carry them.
    const int vec = n4 <= kMaxThreads ? 1 : n4 <= 2 * kMaxThreads ? 2 : 4;
    const int threads = ((n4 + vec - 1) / vec + 31) / 32 * 32;
    switch (vec) {
      case 1:
        SPECINFER_LAUNCH(rows, threads, 0, stream, RmsNormVecKernel<1>)(x, row_ids, w, out, n, eps);
        break;
      case 2:
        SPECINFER_LAUNCH(rows, threads, 0, stream, RmsNormVecKernel<2>)(x, row_ids, w, out, n, eps);
        break;
      default:
        SPECINFER_LAUNCH(rows, threads, 0, stream, RmsNormVecKernel<4>)(x, row_ids, w, out, n, eps);
        break;
    }
  } else {
    SPECINFER_LAUNCH(rows, kGenericThreads, 0, stream, RmsNormKernel)(x, row_ids, w, out, n, eps);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRmsNorm(const float* x, const float* w, float* out, int rows, int n, float eps,
                          cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaErrorInvalidValue;
  return Launch(x, nullptr, w, out, rows, n, eps, stream);
}

cudaError_t LaunchRmsNormRows(const float* x, const int32_t* row_ids, const float* w, float* out,
                              int rows, int n, float eps, cudaStream_t stream) {
  if (rows <= 0 || n <= 0 || row_ids == nullptr) return cudaErrorInvalidValue;
  return Launch(x, row_ids, w, out, rows, n, eps, stream);
}

}  // namespace specinfer::kernels
