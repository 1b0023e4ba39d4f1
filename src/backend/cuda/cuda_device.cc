#include "backend/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include "rmsnorm.cuh"

namespace specinfer::cuda {

namespace {

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  StatusCode code = err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted
                                                     : StatusCode::kInternal;
  return Status(code, std::string(what) + ": " + cudaGetErrorString(err));
}

// Device memory that frees itself.
struct DeviceBuffer {
  float* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  Status Allocate(size_t count) {
    return CudaStatus(cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(float)),
                      "cudaMalloc");
  }
};

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

StatusOr<std::string> DeviceDescription(int device) {
  cudaDeviceProp prop;
  SI_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device), "device properties"));
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ")";
}

Status RmsNormOnDevice(std::span<const float> x, std::span<const float> w, std::span<float> out,
                       int rows, float eps) {
  const size_t n = w.size();
  if (x.size() != rows * n || out.size() != rows * n)
    return InvalidArgumentError("RmsNormOnDevice: sizes do not match");
  DeviceBuffer dx, dw;
  SI_RETURN_IF_ERROR(dx.Allocate(x.size()));
  SI_RETURN_IF_ERROR(dw.Allocate(n));
  SI_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(dx.ptr, x.data(), x.size_bytes(), cudaMemcpyHostToDevice), "copy x"));
  SI_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(dw.ptr, w.data(), w.size_bytes(), cudaMemcpyHostToDevice), "copy w"));
  SI_RETURN_IF_ERROR(CudaStatus(
      kernels::LaunchRmsNorm(dx.ptr, dw.ptr, dx.ptr, rows, static_cast<int>(n), eps, nullptr),
      "rmsnorm launch"));
  return CudaStatus(cudaMemcpy(out.data(), dx.ptr, out.size_bytes(), cudaMemcpyDeviceToHost),
                    "copy out");
}

}  // namespace specinfer::cuda
