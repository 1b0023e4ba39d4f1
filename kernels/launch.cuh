// Kernel launches and dynamic shared memory, spelled so that the same kernel source also builds
// for the CPU emulator of tests/cuda_emu (which runs the kernels here when no GPU is present).
//
//   SPECINFER_LAUNCH(grid, block, shared_bytes, stream, Kernel<Args...>)(arguments...);
//     is Kernel<Args...><<<grid, block, shared_bytes, stream>>>(arguments...) under nvcc.
//   SPECINFER_DYNAMIC_SHARED(float, smem);
//     is `extern __shared__ float smem[];` under nvcc.
#pragma once

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
