// One warp-wide tensor-core product, spelled so that the same kernel source builds for the CPU
// emulator of tests/cuda_emu:
//   Mma16816<kBf16>(d, a, b):  d[16 x 8] += a[16 x 16] b[16 x 8], float32 accumulators, inputs
//   fp16 (kBf16 = false) or bf16, in the fragment layout of PTX's mma.m16n8k16.row.col (lane
//   L = 4 g + q holds a rows g and g + 8, columns 2q, 2q + 1 (a[0], a[1]) and 2q + 8, 2q + 9
//   (a[2], a[3]); b rows 2q, 2q + 1 (b[0]) and 2q + 8, 2q + 9 (b[1]) of column g; d rows g (d[0],
//   d[1]) and g + 8 (d[2], d[3]) of columns 2q and 2q + 1). The low 16 bits of a register hold
//   the lower column (a) or row (b).
//   PrefetchL2(p): a prefetch hint (a no-op on the emulator).
//   LdMatrixX4<kTrans>(r, row): ldmatrix.m8n8.x4: four 8 x 8 matrices of 16-bit elements from
//   shared memory, lane L giving the address of row L % 8 of matrix L / 8 (16 contiguous,
//   16-byte aligned bytes); r[j] of lane t = 4 g + q holds matrix j's row g, columns 2q and
//   2q + 1 (kTrans: rows 2q and 2q + 1 of column g), the lower in the low half: the A and B
//   fragments of Mma16816 (B from a row-major [n][k] tile untransposed, from [k][n] transposed).
//   Pack2, Round16, SplitParts: float32 values as 16-bit mma operands (and in exact parts).
//   CpAsync16(dst, src, valid), CpAsyncCommit(), CpAsyncWait<N>(): sm_80's asynchronous copies
//   of 16 bytes from global to shared memory (zeros where !valid), committed in groups, waiting
//   until at most N groups are in flight; on the emulator the copy happens at once.
// On sm_80 and newer Mma16816 is one mma.sync instruction; an output's value depends only on its
// own row of a, column of b and its accumulator (the hardware sums each output on its own), which
// is what keeps a batch-invariant product batch-invariant on tensor cores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace specinfer::kernels {

template <bool kBf16>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
#if defined(SPECINFER_CUDA_EMULATION)
  ::specinfer::emu::WarpMma16816(kBf16, d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
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

// 16 bytes from global memory to shared memory, asynchronously (both 16-byte aligned); zeros where
// !valid (src is then not read, but must be a valid address).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
#if defined(SPECINFER_CUDA_EMULATION)
  if (valid) {
    std::memcpy(dst, src, 16);
  } else {
    std::memset(dst, 0, 16);
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void CpAsyncCommit() {
#if !defined(SPECINFER_CUDA_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int kN>
__device__ __forceinline__ void CpAsyncWait() {
#if !defined(SPECINFER_CUDA_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN) : "memory");
#endif
}

template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
#if defined(SPECINFER_CUDA_EMULATION)
  // Each lane reads its elements through the row addresses of the lanes that hold them.
  const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, q = lane % 4;
  const uintptr_t mine = reinterpret_cast<uintptr_t>(row);
  for (int j = 0; j < 4; ++j) {
    if constexpr (kTrans) {
      const auto* r0 = reinterpret_cast<const uint16_t*>(__shfl_sync(~0u, mine, 8 * j + 2 * q));
      const auto* r1 = reinterpret_cast<const uint16_t*>(__shfl_sync(~0u, mine, 8 * j + 2 * q + 1));
      r[j] = static_cast<uint32_t>(r0[g]) | static_cast<uint32_t>(r1[g]) << 16;
    } else {
      const auto* rg = reinterpret_cast<const uint16_t*>(__shfl_sync(~0u, mine, 8 * j + g));
      r[j] = static_cast<uint32_t>(rg[2 * q]) | static_cast<uint32_t>(rg[2 * q + 1]) << 16;
    }
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  }
#else
  (void)row;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

// Two 16-bit values as one register, the first in the low half.
template <bool kBf16>
__device__ __forceinline__ uint32_t Pack2(float a, float b) {
  uint16_t lo, hi;
  if constexpr (kBf16) {
    lo = __bfloat16_as_ushort(__float2bfloat16_rn(a));
    hi = __bfloat16_as_ushort(__float2bfloat16_rn(b));
  } else {
    lo = __half_as_ushort(__float2half_rn(a));
    hi = __half_as_ushort(__float2half_rn(b));
  }
  return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
}

template <bool kBf16>
__device__ __forceinline__ float Round16(float v) {
  if constexpr (kBf16) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else {
    return __half2float(__float2half_rn(v));
  }
}

// Eight float32 values as 16-bit parts whose sum is each value to about float32 precision (fp16:
// two parts, for values whose low parts stay normal; bf16: three), packed in pairs: parts[p][i]
// holds part p of v[2i] (low half) and v[2i + 1]. v is consumed. (The products of linear.cu split
// activations so; tree attention its probabilities.)
__host__ __device__ constexpr int SplitPartCount(bool bf16) { return bf16 ? 3 : 2; }
template <bool kBf16>
__device__ __forceinline__ void SplitParts(float (&v)[8], uint32_t (&parts)[kBf16 ? 3 : 2][4]) {
  constexpr int kParts = kBf16 ? 3 : 2;
#pragma unroll
  for (int p = 0; p < kParts; ++p) {
    float r[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      r[i] = p + 1 < kParts ? Round16<kBf16>(v[i]) : v[i];
      v[i] = __fsub_rn(v[i], r[i]);  // exact: what the next part must carry
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) parts[p][i] = Pack2<kBf16>(r[2 * i], r[2 * i + 1]);
  }
}

}  // namespace specinfer::kernels
