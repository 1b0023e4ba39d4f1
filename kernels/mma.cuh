// One warp-wide tensor-core product, spelled so that the same kernel source builds for the CPU
// emulator of tests/cuda_emu:
//   Mma16816<kBf16>(d, a, b):  d[16 x 8] += a[16 x 16] b[16 x 8], float32 accumulators, inputs
//   fp16 (kBf16 = false) or bf16, in the fragment layout of PTX's mma.m16n8k16.row.col (lane
//   L = 4 g + q holds a rows g and g + 8, columns 2q, 2q + 1 (a[0], a[1]) and 2q + 8, 2q + 9
//   (a[2], a[3]); b rows 2q, 2q + 1 (b[0]) and 2q + 8, 2q + 9 (b[1]) of column g; d rows g (d[0],
//   d[1]) and g + 8 (d[2], d[3]) of columns 2q and 2q + 1). The low 16 bits of a register hold
//   the lower column (a) or row (b).
//   PrefetchL2(p): a prefetch hint (a no-op on the emulator).
// On sm_80 and newer Mma16816 is one mma.sync instruction; an output's value depends only on its own
// row of a, column of b and its accumulator (the hardware sums each output on its own), which is
// what keeps a batch-invariant product batch-invariant on tensor cores.
#pragma once

#include <cstdint>

namespace specinfer::kernels {

template <bool kBf16>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
#if defined(SPECINFER_CUDA_EMULATION)
  ::specinfer::emu::WarpMma16816(kBf16, d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBf16) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  // nvcc's host pass (never executed), or a device below sm_80, which this project does not build
  // for (SPECINFER_CUDA_ARCHITECTURES).
  __trap();
#endif
}

// Asks for the 16 bytes at p to be fetched into L2 (a hint: no register waits for it).
__device__ __forceinline__ void PrefetchL2(const void* p) {
#if defined(SPECINFER_CUDA_EMULATION)
  (void)p;
#elif defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

}  // namespace specinfer::kernels
