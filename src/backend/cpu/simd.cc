#include "backend/cpu/simd.h"

#include <cstdlib>
#include <cstring>

namespace specinfer::cpu {

namespace {

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // needed when called before static constructors have run
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
#endif
  const char* off = std::getenv("SPECINFER_NO_AVX2");
  const bool disabled = off != nullptr && off[0] != '\0' && std::strcmp(off, "0") != 0;
  f.use_avx2_kernels = f.avx2 && f.fma && f.f16c && !disabled;
  return f;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

}  // namespace specinfer::cpu
