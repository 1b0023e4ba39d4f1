#include "device_types.cuh"
#include "launch.cuh"
#include "random_fill.cuh"

namespace specinfer::kernels {
namespace {

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void RandomFillKernel(T* out, int64_t n, uint64_t seed, float offset, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = SplitMix64(seed * 0x100000001b3ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
    out[i] = FromFloat<T>(offset + scale * u);
  }
}

template <typename T>
cudaError_t Fill(T* out, int64_t n, uint64_t seed, float offset, float scale, cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = (n + 255) / 256;
  SPECINFER_LAUNCH(static_cast<unsigned>(blocks < 4096 ? blocks : 4096), 256, 0, stream,
                   RandomFillKernel<T>)
  (out, n, seed, offset, scale);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRandomFill(float* out, int64_t n, uint64_t seed, float offset, float scale,
                             cudaStream_t stream) {
  return Fill(out, n, seed, offset, scale, stream);
}
cudaError_t LaunchRandomFill(__half* out, int64_t n, uint64_t seed, float offset, float scale,
                             cudaStream_t stream) {
  return Fill(out, n, seed, offset, scale, stream);
}

}  // namespace specinfer::kernels
