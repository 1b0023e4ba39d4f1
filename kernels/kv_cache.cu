#include <algorithm>

#include "device_types.cuh"
#include "kv_cache.cuh"
#include "launch.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int32_t kMaxBlocksPerToken = 32;

template <typename T>
__global__ void KvAppendKernel(const float* __restrict__ k, const float* __restrict__ v,
                               const int64_t* __restrict__ slots, int32_t kv_dim, T* k_cache,
                               T* v_cache) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  for (int32_t i = blockIdx.y * blockDim.x + threadIdx.x; i < kv_dim;
       i += blockDim.x * gridDim.y) {
    k_cache[slot * kv_dim + i] = FromFloat<T>(k[t * kv_dim + i]);
    v_cache[slot * kv_dim + i] = FromFloat<T>(v[t * kv_dim + i]);
  }
}

// Copies in 2-byte units (every cache row is a whole number of them).
__global__ void KvMoveKernel(uint16_t* k_cache, uint16_t* v_cache, int64_t layer_units,
                             int64_t row_units, const int64_t* __restrict__ src,
                             const int64_t* __restrict__ dst) {
  const int64_t m = blockIdx.x, layer = blockIdx.y;
  const int64_t from = layer * layer_units + src[m] * row_units;
  const int64_t to = layer * layer_units + dst[m] * row_units;
  if (from == to) return;
  for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) {
    k_cache[to + i] = k_cache[from + i];
    v_cache[to + i] = v_cache[from + i];
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchKvAppend(const float* k, const float* v, const int64_t* slots, int32_t n,
                           int32_t kv_dim, T* k_cache, T* v_cache, cudaStream_t stream) {
  if (n <= 0 || kv_dim <= 0) return cudaErrorInvalidValue;
  // A token's row spread over several blocks (element-wise copies: no bit changes), so a decode
  // step's single token does not run on one SM.
  const dim3 grid(n, std::min<int32_t>(kMaxBlocksPerToken, (kv_dim + kThreads - 1) / kThreads));
  SPECINFER_LAUNCH(grid, kThreads, 0, stream, KvAppendKernel<T>)
  (k, v, slots, kv_dim, k_cache, v_cache);
  return cudaGetLastError();
}

template cudaError_t LaunchKvAppend<float>(const float*, const float*, const int64_t*, int32_t,
                                           int32_t, float*, float*, cudaStream_t);
template cudaError_t LaunchKvAppend<__half>(const float*, const float*, const int64_t*, int32_t,
                                            int32_t, __half*, __half*, cudaStream_t);
template cudaError_t LaunchKvAppend<__nv_bfloat16>(const float*, const float*, const int64_t*,
                                                   int32_t, int32_t, __nv_bfloat16*, __nv_bfloat16*,
                                                   cudaStream_t);

cudaError_t LaunchKvMove(void* k_cache, void* v_cache, int32_t elem_bytes, int32_t layers,
                         int64_t layer_stride, int32_t kv_dim, const int64_t* src,
                         const int64_t* dst, int32_t count, cudaStream_t stream) {
  if (count <= 0 || layers <= 0 || layers > 65535 || (elem_bytes != 2 && elem_bytes != 4))
    return cudaErrorInvalidValue;
  const int64_t units = elem_bytes / 2;
  SPECINFER_LAUNCH(dim3(count, layers), kThreads, 0, stream, KvMoveKernel)
  (static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), layer_stride * units,
   static_cast<int64_t>(kv_dim) * units, src, dst);
  return cudaGetLastError();
}

}  // namespace specinfer::kernels
