// Kernel launches and dynamic shared memory, spelled so that the same kernel source also builds
// for the CPU emulator of tests/cuda_emu (which runs the kernels here when no GPU is present).
//
//   SPECINFER_LAUNCH(grid, block, shared_bytes, stream, Kernel<Args...>)(arguments...);
//     is Kernel<Args...><<<grid, block, shared_bytes, stream>>>(arguments...) under nvcc.
//   SPECINFER_DYNAMIC_SHARED(float, smem);
//     is `extern __shared__ float smem[];` under nvcc.
//   LaunchDependent(grid, block, shared_bytes, stream, Kernel<Args...>, arguments...)
//     launches with programmatic dependent launch on sm_90 devices: the kernel's blocks may start
//     while the previous kernel on the stream is still running (hiding the launch gap), and must
//     call GridDependencyWait() before they read or write any memory that kernel touches (weights
//     may be fetched before). Elsewhere (older devices, the emulator) an ordinary launch, where
//     GridDependencyWait() returns at once. Returns the launch's error.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#if defined(SPECINFER_CUDA_EMULATION)
#define SPECINFER_LAUNCH(grid, block, shared_bytes, stream, ...) \
  ::specinfer::emu::Launcher(grid, block, shared_bytes, stream, __VA_ARGS__)
#define SPECINFER_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::specinfer::emu::DynamicShared())
#else
#define SPECINFER_LAUNCH(grid, block, shared_bytes, stream, ...) \
  __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define SPECINFER_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace specinfer::kernels {

__device__ __forceinline__ void GridDependencyWait() {
#if !defined(SPECINFER_CUDA_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#if defined(SPECINFER_CUDA_EMULATION)
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                            void (*kernel)(Params...), Args... args) {
  SPECINFER_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...);
  return cudaGetLastError();
}
#else
// Whether the current device runs programmatic dependent launches (compute capability 9.0+),
// cached per device.
inline bool DeviceHasDependentLaunch() {
  static std::atomic<int> known[64];  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  int v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                major >= 9
            ? 2
            : 1;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

template <typename... Params, typename... Args>
cudaError_t LaunchDependent(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                            void (*kernel)(Params...), Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = DeviceHasDependentLaunch() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}
#endif

}  // namespace specinfer::kernels
