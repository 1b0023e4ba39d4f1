// ggml's 32-element block formats, and the CPU routines on them: dequantisation (to_float),
// quantisation of activation rows (from_float) and the dot product between a weight row and an
// activation row (vec_dot).
//
// Block layouts (little-endian, packed, as stored in GGUF files). d, m, s are IEEE fp16; for
// j < 16, the nibble q of element j is qs[j] & 15 and that of element j + 16 is qs[j] >> 4; the
// fifth bit h of element i (Q5) is bit i of the u32 qh.
//   Q4_0 (18 B): d; qs[16]            x = d * (q - 8)
//   Q4_1 (20 B): d, m; qs[16]         x = d * q + m
//   Q5_0 (22 B): d; qh[4]; qs[16]     x = d * (q + 16 * h - 16)
//   Q5_1 (24 B): d, m; qh[4]; qs[16]  x = d * (q + 16 * h) + m
//   Q8_0 (34 B): d; qs[32] int8       x = d * q
//   Q8_1 (36 B): d, s; qs[32] int8    x = d * q; s = d * sum(q) (folds Q4_1/Q5_1's m into one
//                                     multiply per block)
//
// Two implementations of every routine: `scalar` (portable C++, the reference, no ISA
// extension) and `avx2` (AVX2 + FMA + F16C, compiled per function so the translation unit needs
// no -mavx2; callers must check GetCpuFeatures().use_avx2_kernels first). Activation quantisation
// is bit-identical between the two (roundf semantics: halves away from zero, scale = amax/127,
// as ggml's reference and the Python gguf package). Dot products agree up to float summation
// order. to_float agrees exactly.
//
// Every routine takes n, the number of elements; for block types n must be a multiple of 32.
// Pointers need no alignment beyond that of the block (2 bytes; 4 for float32).
#pragma once

#include <cstdint>

#include "backend/cpu/type_ops.h"
#include "tensor/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#define SPECINFER_HAVE_X86_KERNELS 1
#endif

namespace specinfer::cpu {

inline constexpr int kQK = 32;  // elements per block of every type in this file

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;  // d * sum(qs)
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);

// Two consecutive Q8_1 activation blocks rearranged for the Q4_1 tile kernel (PackQ8_1): their
// fp16 fields as floats {d0, s0, d1, s1}, then the first halves of both blocks' quants (lo =
// q0[0..15], q1[0..15]) and the second halves (hi = q0[16..31], q1[16..31]), the order in which
// the kernel pairs them with the low and high weight nibbles of both blocks.
struct PackedPairQ8_1 {
  float h[4];
  int8_t lo[kQK];
  int8_t hi[kQK];
};
static_assert(sizeof(PackedPairQ8_1) == 80);

// The routine families. Names: ToFloat<T>(src, dst, n), FromFloat<T>(src, dst, n),
// VecDot<W><X>(n, w, x) returning sum_i w[i] * x[i].
#define SPECINFER_QUANT_ROUTINES                                 \
  void ToFloatF16(const void* src, float* dst, int64_t n);       \
  void ToFloatBF16(const void* src, float* dst, int64_t n);      \
  void ToFloatQ4_0(const void* src, float* dst, int64_t n);      \
  void ToFloatQ4_1(const void* src, float* dst, int64_t n);      \
  void ToFloatQ5_0(const void* src, float* dst, int64_t n);      \
  void ToFloatQ5_1(const void* src, float* dst, int64_t n);      \
  void ToFloatQ8_0(const void* src, float* dst, int64_t n);      \
  void ToFloatQ8_1(const void* src, float* dst, int64_t n);      \
  void FromFloatQ8_0(const float* src, void* dst, int64_t n);    \
  void FromFloatQ8_1(const float* src, void* dst, int64_t n);    \
  float VecDotF32(int64_t n, const void* w, const void* x);      \
  float VecDotF16F32(int64_t n, const void* w, const void* x);   \
  float VecDotBF16F32(int64_t n, const void* w, const void* x);  \
  float VecDotQ4_0Q8_0(int64_t n, const void* w, const void* x); \
  float VecDotQ4_1Q8_1(int64_t n, const void* w, const void* x); \
  float VecDotQ5_0Q8_0(int64_t n, const void* w, const void* x); \
  float VecDotQ5_1Q8_1(int64_t n, const void* w, const void* x); \
  float VecDotQ8_0Q8_0(int64_t n, const void* w, const void* x); \
  float VecDotQ8_1Q8_1(int64_t n, const void* w, const void* x);

namespace scalar {
SPECINFER_QUANT_ROUTINES
// Plain float32 copy (the F32 "to_float").
void ToFloatF32(const void* src, float* dst, int64_t n);
}  // namespace scalar

#if defined(SPECINFER_HAVE_X86_KERNELS)
namespace avx2 {
SPECINFER_QUANT_ROUTINES
// VecDotQ4_1Q8_1 for `count` (1..4) activation rows at once (TypeOps::vec_dot_multi).
void VecDotQ4_1Q8_1Multi(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                         float* out);
// VecDotQ4_1Q8_1 of `count` consecutive weight rows (w + r * w_stride bytes) with one activation
// row (TypeOps::vec_dot_rows).
void VecDotQ4_1Q8_1Rows(int64_t n, const void* w, size_t w_stride, const void* x, int count,
                        float* out);
// Packed activation rows for VecDotQ4_1Packed (TypeOps::pack): n / 64 PackedPairQ8_1, then an
// odd last BlockQ8_1 as it is. PackedQ8_1Bytes(n) bytes per row.
size_t PackedQ8_1Bytes(int64_t n);
void PackQ8_1(int64_t n, const void* x, void* dst);
// VecDotQ4_1Q8_1 of one weight row with `count` (1..kMaxPackedDot) packed activation rows
// (TypeOps::vec_dot_packed), each result bit-identical to VecDotQ4_1Q8_1's.
void VecDotQ4_1Packed(int64_t n, const void* w, const void* xp, size_t xp_stride, int count,
                      float* out);
// VecDotQ8_0Q8_0 for `count` (1..4) activation rows at once (TypeOps::vec_dot_multi).
void VecDotQ8_0Q8_0Multi(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                         float* out);
// VecDotF32 likewise.
void VecDotF32Multi(int64_t n, const void* w, const void* x, size_t x_stride, int count,
                    float* out);
}  // namespace avx2

namespace avx512 {
// avx2::VecDotQ4_1Packed with AVX-512 VL + VNNI integer sums and a tile of 4 tokens; the same
// results bit for bit (only for CPUs with GetCpuFeatures().use_avx512_kernels).
void VecDotQ4_1Packed(int64_t n, const void* w, const void* xp, size_t xp_stride, int count,
                      float* out);
}  // namespace avx512
#endif

#undef SPECINFER_QUANT_ROUTINES

// Which kernel set GetTypeOps hands out. GetTypeOps (type_ops.h) picks kAvx2 when the CPU
// allows it; tests and benchmarks ask for a set by name.
// kAvx512 is the AVX2 set with the kernels that have an AVX-512 (VL, BW, VNNI) variant replaced.
enum class KernelIsa { kScalar, kAvx2, kAvx512 };

// The routines for `t` from kernel set `isa`; nullptr if the type is not supported, or if isa is
// kAvx2 (kAvx512) and this CPU (or build) cannot run AVX2 (AVX-512) kernels.
const TypeOps* GetTypeOpsForIsa(DType t, KernelIsa isa);

}  // namespace specinfer::cpu
