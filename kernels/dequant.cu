#include "dequant.cuh"
#include "device_types.cuh"
#include "launch.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kThreads = 256;

template <typename OutT>
__global__ void DequantizeRowsKernel(ElemType type, const uint8_t* __restrict__ src,
                                     int64_t src_rows, int64_t cols,
                                     const int32_t* __restrict__ ids, OutT* __restrict__ out) {
  const int64_t r = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  const int64_t sr = ids ? ids[r] : r;
  float v = 0.0f;
  if (sr >= 0 && sr < src_rows) v = LoadElement(type, src + sr * ElemRowBytes(type, cols), c);
  out[r * cols + c] = FromFloat<OutT>(v);
}

template <typename OutT>
cudaError_t Launch(ElemType type, const void* src, int64_t src_rows, int64_t cols,
                   const int32_t* ids, int64_t rows, OutT* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || rows > 65535 * 1024) return cudaErrorInvalidValue;
  if (cols % ElemBlockElems(type) != 0) return cudaErrorInvalidValue;
  // gridDim.y is limited to 65535: launch in slices of rows.
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
    const int64_t nr = rows - r0 < 65535 ? rows - r0 : 65535;
    dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads), static_cast<unsigned>(nr));
    const uint8_t* s = static_cast<const uint8_t*>(src);
    const int32_t* id = ids ? ids + r0 : nullptr;
    // Without ids, row r of the slice is source row r0 + r: shift the source instead.
    const uint8_t* base = ids ? s : s + r0 * ElemRowBytes(type, cols);
    const int64_t limit = ids ? src_rows : src_rows - r0;
    SPECINFER_LAUNCH(grid, kThreads, 0, stream, DequantizeRowsKernel<OutT>)
    (type, base, limit, cols, id, out + r0 * cols);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchDequantizeRows(ElemType type, const void* src, int64_t src_rows, int64_t cols,
                                 const int32_t* ids, int64_t rows, float* out,
                                 cudaStream_t stream) {
  return Launch(type, src, src_rows, cols, ids, rows, out, stream);
}
cudaError_t LaunchDequantizeRows(ElemType type, const void* src, int64_t src_rows, int64_t cols,
                                 const int32_t* ids, int64_t rows, __half* out,
                                 cudaStream_t stream) {
  return Launch(type, src, src_rows, cols, ids, rows, out, stream);
}

}  // namespace specinfer::kernels
