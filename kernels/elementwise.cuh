// Element-wise kernels of the Llama layer on the GPU: SwiGLU, bias addition and type casts.
//
// SwiGlu: gate[i] = silu(gate[i]) * up[i] = gate[i] * (1 / (1 + exp(-gate[i]))) * up[i], i < n,
//   float32, the CPU's expression order without fused multiply-adds; differs from cpu::SwiGlu
//   only by expf's rounding (<= 2 ulp): tolerance 1e-6 relative.
// GeGluTanh: gate[i] = 0.5 gate[i] (1 + tanh(sqrt(2 / pi) (gate[i] + 0.044715 gate[i]^3))) up[i]
//   (Gemma's GELU, tanh approximation), cpu::GeGluTanh's expression, differing by tanhf's rounding.
// Scale: x[i] *= s (Gemma's embedding scale); exact as the CPU's.
// SoftCap: x[i] = cap tanh(x[i] / cap) (Gemma 2's final logits), cpu::SoftCap's expression.
// AddBias: y[t, i] += b[i] for t < rows, i < dim (y [rows, dim], b [dim]); exact.
// Cast: out[i] = T(in[i]) for i < n, float32 to float32/fp16/bf16, round to nearest even; exact.
// Launch: grid-stride loops, 256 threads per block, at most 4096 blocks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace specinfer::kernels {

cudaError_t LaunchSwiGlu(float* gate, const float* up, int64_t n, cudaStream_t stream);
cudaError_t LaunchGeGluTanh(float* gate, const float* up, int64_t n, cudaStream_t stream);
cudaError_t LaunchScale(float* x, float s, int64_t n, cudaStream_t stream);
cudaError_t LaunchSoftCap(float* x, float cap, int64_t n, cudaStream_t stream);
cudaError_t LaunchAddBias(float* y, const float* b, int64_t rows, int64_t dim, cudaStream_t stream);
cudaError_t LaunchCast(const float* in, __half* out, int64_t n, cudaStream_t stream);
cudaError_t LaunchCast(const float* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream);
cudaError_t LaunchCast(const float* in, float* out, int64_t n, cudaStream_t stream);

}  // namespace specinfer::kernels
