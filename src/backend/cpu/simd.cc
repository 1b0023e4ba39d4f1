#include "backend/cpu/simd.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace specinfer::cpu {

namespace {

bool EnvSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // needed when called before static constructors have run
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  // CPUID leaf 1, ECX bit 29: clang before 16 has no "f16c" for __builtin_cpu_supports.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
#endif
  f.use_avx2_kernels = f.avx2 && f.fma && f.f16c && !EnvSet("SPECINFER_NO_AVX2");
  f.use_avx512_kernels = f.use_avx2_kernels && f.avx512f && f.avx512vl && f.avx512bw &&
                         f.avx512vnni && !EnvSet("SPECINFER_NO_AVX512");
  return f;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

}  // namespace specinfer::cpu
