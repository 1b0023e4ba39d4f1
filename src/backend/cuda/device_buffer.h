// Device and pinned host memory that free themselves, and the mapping of CUDA errors onto
// Status. Internal to the CUDA backend (has CUDA types).
//
// Thread safety: plain values; not shared between threads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "specinfer/status.h"

namespace specinfer::cuda {

// cudaErrorMemoryAllocation -> ResourceExhausted, anything else -> Internal, naming `what`.
inline Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  const StatusCode code =
      err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, what + ": " + cudaGetErrorString(err));
}

inline std::string MiB(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() { Free(); }

  // Frees what it held and allocates `bytes` (ResourceExhausted naming `what` on failure).
  Status Allocate(int64_t bytes, const std::string& what) {
    Free();
    if (bytes <= 0) return Status::Ok();
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear it: allocation failures are not sticky
      return ResourceExhaustedError("cannot allocate " + MiB(bytes) + " of GPU memory for " + what +
                                    ": " + cudaGetErrorString(err));
    }
    ptr_ = p;
    bytes_ = bytes;
    return Status::Ok();
  }
  // Grows to at least `bytes` (contents are lost when it grows).
  Status Reserve(int64_t bytes, const std::string& what) {
    return bytes <= bytes_ ? Status::Ok() : Allocate(bytes, what);
  }
  void Free() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Free(); }
  Status Reserve(int64_t bytes, const std::string& what) {
    if (bytes <= bytes_) return Status::Ok();
    Free();
    void* p = nullptr;
    const cudaError_t err = cudaMallocHost(&p, static_cast<size_t>(bytes));
    if (err != cudaSuccess) {
      cudaGetLastError();
      return ResourceExhaustedError("cannot allocate " + MiB(bytes) + " of pinned memory for " +
                                    what);
    }
    ptr_ = p;
    bytes_ = bytes;
    return Status::Ok();
  }
  void Free() {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace specinfer::cuda
