#include <algorithm>

#include "launch.cuh"
#include "rope.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int32_t kMaxBlocksPerToken = 32;

__global__ void RopeKernel(float* q, int32_t q_heads, float* k, int32_t k_heads, int32_t head_dim,
                           const int32_t* __restrict__ positions,
                           const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                           int32_t max_pos, const float* __restrict__ inv_freq, RopeMode mode) {
  const int64_t t = blockIdx.x;
  const int32_t half = head_dim / 2;
  const int32_t pos = positions[t];
  const int32_t heads = q_heads + (k ? k_heads : 0);
  for (int32_t idx = blockIdx.y * blockDim.x + threadIdx.x; idx < heads * half;
       idx += blockDim.x * gridDim.y) {
    const int32_t h = idx / half, i = idx % half;
    float* v = h < q_heads ? q + (t * q_heads + h) * head_dim
                           : k + (t * k_heads + (h - q_heads)) * head_dim;
    float c, s;
    if (pos < max_pos) {
      c = cos_table[static_cast<int64_t>(pos) * half + i];
      s = sin_table[static_cast<int64_t>(pos) * half + i];
    } else {
      const float angle = __fmul_rn(static_cast<float>(pos), inv_freq[i]);
      c = cosf(angle);
      s = sinf(angle);
    }
    float* a = mode == RopeMode::kInterleaved ? v + 2 * i : v + i;
    float* b = mode == RopeMode::kInterleaved ? v + 2 * i + 1 : v + i + half;
    const float v0 = *a, v1 = *b;
    // No fused multiply-add, as on the CPU: bit-identical results.
    *a = __fsub_rn(__fmul_rn(v0, c), __fmul_rn(v1, s));
    *b = __fadd_rn(__fmul_rn(v0, s), __fmul_rn(v1, c));
  }
}

}  // namespace

cudaError_t LaunchRope(float* q, int32_t q_heads, float* k, int32_t k_heads, int32_t head_dim,
                       const int32_t* positions, int32_t n, const float* cos_table,
                       const float* sin_table, int32_t max_pos, const float* inv_freq,
                       RopeMode mode, cudaStream_t stream) {
  if (n <= 0 || head_dim <= 0 || head_dim % 2 != 0 || q_heads <= 0) return cudaErrorInvalidValue;
  // Each element is computed on its own, so spreading a token over several blocks changes no bit;
  // a decode step's single token no longer runs on one SM.
  const int32_t work = (q_heads + (k ? k_heads : 0)) * (head_dim / 2);
  const dim3 grid(n, std::min<int32_t>(kMaxBlocksPerToken, (work + kThreads - 1) / kThreads));
  SPECINFER_LAUNCH(grid, kThreads, 0, stream, RopeKernel)
  (q, q_heads, k, k_heads, head_dim, positions, cos_table, sin_table, max_pos, inv_freq, mode);
  return cudaGetLastError();
}

}  // namespace specinfer::kernels
