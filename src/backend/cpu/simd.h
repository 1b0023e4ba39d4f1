// What the CPU we run on can do, queried once at run time.
//
// The binary is built for baseline x86-64 (no -mavx2): vectorised kernels are compiled per
// function with __attribute__((target(...))) and chosen at run time from these flags, so the
// same binary runs, more slowly, on a CPU without AVX2.
//
// Setting the environment variable SPECINFER_NO_AVX2=1 before the first query forces the portable
// scalar kernels (for benchmarking and for checking a fallback path on a modern machine);
// SPECINFER_NO_AVX512=1 likewise keeps the AVX2 kernels on an AVX-512 machine.
//
// Thread safety: GetCpuFeatures() is safe to call from any thread; the result never changes.
#pragma once

namespace specinfer::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512vl = false;
  bool avx512bw = false;
  bool avx512vnni = false;
  // avx2 && fma && f16c and not disabled through SPECINFER_NO_AVX2: the AVX2 kernels may run.
  bool use_avx2_kernels = false;
  // use_avx2_kernels, AVX-512 F/VL/BW/VNNI, and not disabled through SPECINFER_NO_AVX512: the
  // AVX-512 variants of some kernels may replace their AVX2 versions.
  bool use_avx512_kernels = false;
};

const CpuFeatures& GetCpuFeatures();

}  // namespace specinfer::cpu
