// The per-type routine table: which types are supported, how they are paired with activation
// types, and that the run-time choice of kernel set follows the CPU.
#include "backend/cpu/type_ops.h"

#include <gtest/gtest.h>

#include "backend/cpu/quants.h"
#include "backend/cpu/simd.h"
#include "quant_random.h"

namespace specinfer {
namespace {

TEST(TypeOpsTest, SupportedTypes) {
  for (size_t i = 0; i < static_cast<size_t>(DType::kCount); ++i) {
    const DType t = static_cast<DType>(i);
    const bool k_quant = t == DType::kQ2_K || t == DType::kQ3_K || t == DType::kQ4_K ||
                         t == DType::kQ5_K || t == DType::kQ6_K || t == DType::kQ8_K;
    const bool want = k_quant || std::count(testing::SupportedWeightTypes().begin(),
                                            testing::SupportedWeightTypes().end(), t) > 0;
    EXPECT_EQ(cpu::GetTypeOps(t) != nullptr, want) << DTypeName(t);
    EXPECT_EQ(cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar) != nullptr, want) << DTypeName(t);
  }
}

TEST(TypeOpsTest, EntriesAreComplete) {
  for (DType t : testing::SupportedWeightTypes()) {
    for (cpu::KernelIsa isa : {cpu::KernelIsa::kScalar, cpu::KernelIsa::kAvx2}) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      if (ops == nullptr) continue;  // AVX2 unavailable
      SCOPED_TRACE(DTypeName(t));
      EXPECT_NE(ops->to_float, nullptr);
      EXPECT_NE(ops->vec_dot, nullptr);
      EXPECT_EQ(ops->from_float == nullptr, ops->vec_dot_type == DType::kF32);
      if (ops->vec_dot_type != DType::kF32) {
        // The activation type's own entry quantises the same way.
        const cpu::TypeOps* act = cpu::GetTypeOpsForIsa(ops->vec_dot_type, isa);
        ASSERT_NE(act, nullptr);
        EXPECT_EQ(act->from_float, ops->from_float);
        EXPECT_EQ(GetDTypeTraits(ops->vec_dot_type).block_size, GetDTypeTraits(t).block_size);
      }
    }
  }
  EXPECT_EQ(cpu::GetTypeOps(DType::kQ4_1)->vec_dot_type, DType::kQ8_1);
  EXPECT_EQ(cpu::GetTypeOps(DType::kQ5_1)->vec_dot_type, DType::kQ8_1);
  EXPECT_EQ(cpu::GetTypeOps(DType::kQ4_0)->vec_dot_type, DType::kQ8_0);
  EXPECT_EQ(cpu::GetTypeOps(DType::kQ5_0)->vec_dot_type, DType::kQ8_0);
  EXPECT_EQ(cpu::GetTypeOps(DType::kQ8_0)->vec_dot_type, DType::kQ8_0);
  EXPECT_EQ(cpu::GetTypeOps(DType::kF16)->vec_dot_type, DType::kF32);
  EXPECT_EQ(cpu::GetTypeOps(DType::kBF16)->vec_dot_type, DType::kF32);
}

TEST(TypeOpsTest, BlockStructsMatchDTypeTraits) {
  EXPECT_EQ(sizeof(cpu::BlockQ4_0), static_cast<size_t>(GetDTypeTraits(DType::kQ4_0).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ4_1), static_cast<size_t>(GetDTypeTraits(DType::kQ4_1).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ5_0), static_cast<size_t>(GetDTypeTraits(DType::kQ5_0).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ5_1), static_cast<size_t>(GetDTypeTraits(DType::kQ5_1).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ8_0), static_cast<size_t>(GetDTypeTraits(DType::kQ8_0).block_bytes));
  EXPECT_EQ(sizeof(cpu::BlockQ8_1), static_cast<size_t>(GetDTypeTraits(DType::kQ8_1).block_bytes));
  for (DType t : testing::SupportedWeightTypes()) {
    if (IsQuantized(t)) {
      EXPECT_EQ(GetDTypeTraits(t).block_size, cpu::kQK) << DTypeName(t);
    }
  }
}

TEST(TypeOpsTest, DispatchFollowsCpuFeatures) {
  const cpu::CpuFeatures& f = cpu::GetCpuFeatures();
  std::printf("cpu: avx2=%d fma=%d f16c=%d avx512 f=%d vl=%d bw=%d vnni=%d -> %s kernels\n",
              f.avx2, f.fma, f.f16c, f.avx512f, f.avx512vl, f.avx512bw, f.avx512vnni,
              f.use_avx512_kernels ? "AVX-512" : f.use_avx2_kernels ? "AVX2" : "scalar");
  if (f.use_avx2_kernels) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
  if (f.use_avx512_kernels) {
    EXPECT_TRUE(f.use_avx2_kernels && f.avx512f && f.avx512vl && f.avx512bw && f.avx512vnni);
  }
  const cpu::KernelIsa want = f.use_avx512_kernels ? cpu::KernelIsa::kAvx512
                              : f.use_avx2_kernels ? cpu::KernelIsa::kAvx2
                                                   : cpu::KernelIsa::kScalar;
  for (DType t : testing::SupportedWeightTypes()) {
    EXPECT_EQ(cpu::GetTypeOps(t), cpu::GetTypeOpsForIsa(t, want)) << DTypeName(t);
  }
  EXPECT_EQ(cpu::GetTypeOpsForIsa(DType::kF32, cpu::KernelIsa::kAvx2) != nullptr,
            f.use_avx2_kernels);
  EXPECT_EQ(cpu::GetTypeOpsForIsa(DType::kF32, cpu::KernelIsa::kAvx512) != nullptr,
            f.use_avx512_kernels);
}

}  // namespace
}  // namespace specinfer
