#include "device_types.cuh"
#include "elementwise.cuh"
#include "launch.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? b : 4096);
}

__global__ void SwiGluKernel(float* gate, const float* __restrict__ up, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    gate[i] = __fmul_rn(__fmul_rn(g, sig), up[i]);
  }
}

__global__ void GeGluTanhKernel(float* gate, const float* __restrict__ up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float t = tanhf(__fmul_rn(kSqrt2OverPi, __fadd_rn(g, cube)));
    gate[i] = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, t)), up[i]);
  }
}

__global__ void ScaleKernel(float* x, float s, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(x[i], s);
}

__global__ void SoftCapKernel(float* x, float cap, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(cap, tanhf(__fdiv_rn(x[i], cap)));
}

__global__ void AddBiasKernel(float* y, const float* __restrict__ b, int64_t total, int64_t dim) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __fadd_rn(y[i], b[i % dim]);
}

template <typename T>
__global__ void CastKernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = FromFloat<T>(in[i]);
}

template <typename T>
cudaError_t Cast(const float* in, T* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(Blocks(n), kThreads, 0, stream, CastKernel<T>)(in, out, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSwiGlu(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(Blocks(n), kThreads, 0, stream, SwiGluKernel)(gate, up, n);
  return cudaGetLastError();
}

cudaError_t LaunchGeGluTanh(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(Blocks(n), kThreads, 0, stream, GeGluTanhKernel)(gate, up, n);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(Blocks(n), kThreads, 0, stream, ScaleKernel)(x, s, n);
  return cudaGetLastError();
}

cudaError_t LaunchSoftCap(float* x, float cap, int64_t n, cudaStream_t stream) {
  if (n <= 0 || !(cap > 0.0f)) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(Blocks(n), kThreads, 0, stream, SoftCapKernel)(x, cap, n);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* y, const float* b, int64_t rows, int64_t dim,
                          cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(Blocks(rows * dim), kThreads, 0, stream, AddBiasKernel)(y, b, rows * dim, dim);
  return cudaGetLastError();
}

cudaError_t LaunchCast(const float* in, __half* out, int64_t n, cudaStream_t stream) {
  return Cast(in, out, n, stream);
}
cudaError_t LaunchCast(const float* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
  return Cast(in, out, n, stream);
}
cudaError_t LaunchCast(const float* in, float* out, int64_t n, cudaStream_t stream) {
  return Cast(in, out, n, stream);
}

}  // namespace specinfer::kernels
