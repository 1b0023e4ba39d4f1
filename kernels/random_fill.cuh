// Seeded pseudo-random fill on the GPU, for benchmark models whose weights are generated on the
// device (a 7B-shaped model never has to exist in host memory).
//
// Computes out[i] = T(offset + scale * u_i), u_i uniform in [-1, 1) from a 64-bit hash of
// (seed, i): the same seed gives the same values on every GPU and launch shape.
// Layout: out [n] of T (float32 or fp16). Launch: grid-stride, 256 threads, at most 4096 blocks.
// No tolerance applies (no reference; only the distribution matters).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace specinfer::kernels {

cudaError_t LaunchRandomFill(float* out, int64_t n, uint64_t seed, float offset, float scale,
                             cudaStream_t stream);
cudaError_t LaunchRandomFill(__half* out, int64_t n, uint64_t seed, float offset, float scale,
                             cudaStream_t stream);

}  // namespace specinfer::kernels
