// The per-DType routine tables, one per kernel set, and the run-time choice between them.
//
// Pairings (weight type -> activation type for vec_dot):
//   F32  -> F32   plain FMA dot.
//   F16  -> F32   and BF16 -> F32: the 16-bit weights are widened in registers (F16C / shift) and
//                 dotted with float activations. Converting the activations to 16 bits instead
//                 would save nothing (the kernel is bound by reading the weights, whose size is
//                 the same either way) and would lose activation precision.
//   Q8_0 -> Q8_0, Q4_0 -> Q8_0, Q5_0 -> Q8_0: symmetric weights, the activation scale is all
//                 that is needed.
//   Q4_1 -> Q8_1, Q5_1 -> Q8_1: weights with a per-block minimum m; Q8_1 carries s = d * sum(q)
//                 so that the m * sum(x) term costs one multiply per block.
//   Q8_1 -> Q8_1: Q8_1 as a weight type (ggml never stores it in files, but it is complete).
//   Q2_K..Q6_K -> Q8_K: the K-quants, in their own files (quants_k.h, quants_k.cc: tables, and
//                 quants_k_avx2.cc), bit-identical across kernel sets.
// Multi-token entry points (token-tree passes, prompts): Q4_1 activations packed once per product
// for vec_dot_packed (AVX2, or AVX-512 VL/VNNI where the CPU has it: the kAvx512 table is the AVX2
// one with those kernels replaced); Q8_0 and F32 through vec_dot_multi.
#include "backend/cpu/type_ops.h"

#include <array>

#include "backend/cpu/quants.h"
#include "backend/cpu/quants_k.h"
#include "backend/cpu/simd.h"

namespace specinfer::cpu {

namespace {

constexpr size_t kNumTypes = static_cast<size_t>(DType::kCount);

struct Table {
  std::array<TypeOps, kNumTypes> ops{};
  std::array<bool, kNumTypes> present{};

  void Set(DType t, TypeOps o) {
    ops[static_cast<size_t>(t)] = o;
    present[static_cast<size_t>(t)] = true;
  }
  const TypeOps* Get(DType t) const {
    const size_t i = static_cast<size_t>(t);
    return i < kNumTypes && present[i] ? &ops[i] : nullptr;
  }
};

// Both kernel sets expose the same names, so one macro fills a table from either namespace.
#define SPECINFER_FILL_TABLE(ns)                          \
  [] {                                                    \
    Table t;                                              \
    t.Set(DType::kF32, {.to_float = scalar::ToFloatF32,   \
                        .vec_dot_type = DType::kF32,      \
                        .from_float = nullptr,            \
                        .vec_dot = ns::VecDotF32});       \
    t.Set(DType::kF16, {.to_float = ns::ToFloatF16,       \
                        .vec_dot_type = DType::kF32,      \
                        .from_float = nullptr,            \
                        .vec_dot = ns::VecDotF16F32});    \
    t.Set(DType::kBF16, {.to_float = ns::ToFloatBF16,     \
                         .vec_dot_type = DType::kF32,     \
                         .from_float = nullptr,           \
                         .vec_dot = ns::VecDotBF16F32});  \
    t.Set(DType::kQ8_0, {.to_float = ns::ToFloatQ8_0,     \
                         .vec_dot_type = DType::kQ8_0,    \
                         .from_float = ns::FromFloatQ8_0, \
                         .vec_dot = ns::VecDotQ8_0Q8_0}); \
    t.Set(DType::kQ8_1, {.to_float = ns::ToFloatQ8_1,     \
                         .vec_dot_type = DType::kQ8_1,    \
                         .from_float = ns::FromFloatQ8_1, \
                         .vec_dot = ns::VecDotQ8_1Q8_1}); \
    t.Set(DType::kQ4_0, {.to_float = ns::ToFloatQ4_0,     \
                         .vec_dot_type = DType::kQ8_0,    \
                         .from_float = ns::FromFloatQ8_0, \
                         .vec_dot = ns::VecDotQ4_0Q8_0}); \
    t.Set(DType::kQ4_1, {.to_float = ns::ToFloatQ4_1,     \
                         .vec_dot_type = DType::kQ8_1,    \
                         .from_float = ns::FromFloatQ8_1, \
                         .vec_dot = ns::VecDotQ4_1Q8_1}); \
    t.Set(DType::kQ5_0, {.to_float = ns::ToFloatQ5_0,     \
                         .vec_dot_type = DType::kQ8_0,    \
                         .from_float = ns::FromFloatQ8_0, \
                         .vec_dot = ns::VecDotQ5_0Q8_0}); \
    t.Set(DType::kQ5_1, {.to_float = ns::ToFloatQ5_1,     \
                         .vec_dot_type = DType::kQ8_1,    \
                         .from_float = ns::FromFloatQ8_1, \
                         .vec_dot = ns::VecDotQ5_1Q8_1}); \
    return t;                                             \
  }()

const Table& ScalarTable() {
  static const Table table = SPECINFER_FILL_TABLE(scalar);
  return table;
}

#if defined(SPECINFER_HAVE_X86_KERNELS)
const Table& Avx2Table() {
  static const Table table = [] {
    Table t = SPECINFER_FILL_TABLE(avx2);
    t.ops[static_cast<size_t>(DType::kQ4_1)].vec_dot_multi = avx2::VecDotQ4_1Q8_1Multi;
    t.ops[static_cast<size_t>(DType::kQ4_1)].vec_dot_rows = avx2::VecDotQ4_1Q8_1Rows;
    t.ops[static_cast<size_t>(DType::kQ4_1)].packed_bytes = avx2::PackedQ8_1Bytes;
    t.ops[static_cast<size_t>(DType::kQ4_1)].pack = avx2::PackQ8_1;
    t.ops[static_cast<size_t>(DType::kQ4_1)].vec_dot_packed = avx2::VecDotQ4_1Packed;
    t.ops[static_cast<size_t>(DType::kF32)].vec_dot_multi = avx2::VecDotF32Multi;
    t.ops[static_cast<size_t>(DType::kQ8_0)].vec_dot_multi = avx2::VecDotQ8_0Q8_0Multi;
    return t;
  }();
  return table;
}

const Table& Avx512Table() {
  static const Table table = [] {
    Table t = Avx2Table();
    t.ops[static_cast<size_t>(DType::kQ4_1)].vec_dot_packed = avx512::VecDotQ4_1Packed;
    return t;
  }();
  return table;
}
#endif

#undef SPECINFER_FILL_TABLE

}  // namespace

const TypeOps* GetTypeOpsForIsa(DType t, KernelIsa isa) {
  if (const TypeOps* k = GetKQuantTypeOps(t, isa)) return k;
  switch (isa) {
    case KernelIsa::kScalar:
      return ScalarTable().Get(t);
    case KernelIsa::kAvx2:
#if defined(SPECINFER_HAVE_X86_KERNELS)
      if (GetCpuFeatures().use_avx2_kernels) return Avx2Table().Get(t);
#endif
      return nullptr;
    case KernelIsa::kAvx512:
#if defined(SPECINFER_HAVE_X86_KERNELS)
      if (GetCpuFeatures().use_avx512_kernels) return Avx512Table().Get(t);
#endif
      return nullptr;
  }
  return nullptr;
}

const TypeOps* GetTypeOps(DType t) {
  static const KernelIsa isa = GetCpuFeatures().use_avx512_kernels ? KernelIsa::kAvx512
                               : GetCpuFeatures().use_avx2_kernels  ? KernelIsa::kAvx2
                                                                    : KernelIsa::kScalar;
  return GetTypeOpsForIsa(t, isa);
}

}  // namespace specinfer::cpu
