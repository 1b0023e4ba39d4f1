// vec_dot for every supported weight type and kernel set:
//  - AVX2 agrees with the scalar reference up to float summation order;
//  - both agree with the exact (double) dot product of the dequantised weights and the
//    dequantised activations they were given;
//  - against the original float activations, the error stays within what the activation
//    quantisation accounts for (sum_i |w_i| * |x_i - xq_i|).
// Over lengths from one block to 4096, including odd block counts and, for the float types,
// lengths that are not a multiple of the vector width.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/quants.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/type_ops.h"
#include "model/gguf.h"
#include "quant_random.h"
#include "quant_vectors.h"

namespace specinfer {
namespace {

using testing::AvailableIsas;
using testing::IsaName;

constexpr double kU = 1.0 / (1 << 24);  // float32 unit roundoff

std::vector<int64_t> Lengths(DType t) {
  std::vector<int64_t> n = {32, 64, 96, 160, 288, 576, 1536, 2080, 4064, 4096};
  if (!IsQuantized(t)) {
    for (int64_t m : {1, 3, 8, 15, 31, 33, 47, 577, 1000, 4095}) n.push_back(m);
  }
  return n;
}

struct Case {
  std::vector<uint8_t> w;   // weight row
  std::vector<float> x;     // original activations
  std::vector<uint8_t> xq;  // activations as vec_dot_type (bytes of x when that is F32)
  std::vector<float> wf;    // dequantised weights
  std::vector<float> xf;    // dequantised activations
};

Case MakeCase(DType t, int64_t n, std::mt19937& rng) {
  const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar);
  Case c;
  c.w = testing::RandomRow(t, n, rng);
  c.x = testing::RandomActivations(n, rng);
  c.wf.resize(n);
  ops->to_float(c.w.data(), c.wf.data(), n);
  if (ops->vec_dot_type == DType::kF32) {
    c.xq.resize(n * sizeof(float));
    std::memcpy(c.xq.data(), c.x.data(), c.xq.size());
    c.xf = c.x;
  } else {
    c.xq.resize(RowBytes(ops->vec_dot_type, n));
    ops->from_float(c.x.data(), c.xq.data(), n);
    c.xf.resize(n);
    cpu::GetTypeOpsForIsa(ops->vec_dot_type, cpu::KernelIsa::kScalar)
        ->to_float(c.xq.data(), c.xf.data(), n);
  }
  return c;
}

// For Q4_1/Q5_1 weights the kernel uses s = fp16(d_x * sum q_x) for the m term; returns
// sum_b |m_b| * |s_b - d_b * sum_b q|, the part of the result that dequantised values miss.
double MinTermSlack(DType t, const Case& c, int64_t n) {
  if (!testing::HasMinField(t)) return 0.0;
  const size_t wb = GetDTypeTraits(t).block_bytes;
  const auto* xb = reinterpret_cast<const cpu::BlockQ8_1*>(c.xq.data());
  double slack = 0.0;
  for (int64_t b = 0; b < n / 32; ++b) {
    const double m = testing::GetHalf(c.w.data() + b * wb + 2);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += xb[b].qs[j];
    const double exact_s = static_cast<double>(Fp16ToFp32(xb[b].d)) * sum;
    slack += std::fabs(m) * std::fabs(static_cast<double>(Fp16ToFp32(xb[b].s)) - exact_s);
  }
  return slack;
}

TEST(VecDotTest, KernelsAgreeWithExactDotAndEachOther) {
  std::mt19937 rng(1234);
  const std::vector<cpu::KernelIsa> isas = AvailableIsas();
  if (isas.size() < 2) std::printf("note: no AVX2 on this CPU; checking the scalar kernels only\n");
  for (DType t : testing::SupportedWeightTypes()) {
    for (int64_t n : Lengths(t)) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " n=" + std::to_string(n));
      const Case c = MakeCase(t, n, rng);
      double exact = 0, abs_terms = 0, vs_float = 0, quant_err = 0, quant_bound = 0, step_bound = 0;
      for (int64_t i = 0; i < n; ++i) {
        exact += static_cast<double>(c.wf[i]) * c.xf[i];
        abs_terms += std::fabs(static_cast<double>(c.wf[i]) * c.xf[i]);
        vs_float += static_cast<double>(c.wf[i]) * c.x[i];
        quant_err += std::fabs(static_cast<double>(c.wf[i])) * std::fabs(c.x[i] - c.xf[i]);
        if (i % 32 == 0) {  // half a quantisation step of this block, with fp16 slack on d
          float amax = 0;
          for (int64_t j = i; j < std::min(n, i + 32); ++j)
            amax = std::max(amax, std::fabs(c.x[j]));
          step_bound = amax / 127.0 * (0.5 + 127.0 / 2048);
        }
        quant_bound += std::fabs(static_cast<double>(c.wf[i])) * step_bound;
      }
      const double slack = MinTermSlack(t, c, n);
      // Rounding: dequantised Q4_1/Q5_1 weights are rounded (d*q + m), and the kernels sum in
      // float32: at most (terms + a few) unit roundoffs of the absolute sum.
      const double steps = static_cast<double>(IsQuantized(t) ? n / 32 : n) + 8;
      const double tol = slack + (steps + 8) * kU * 2 * abs_terms + 1e-30;
      float results[3] = {0, 0, 0};  // per kernel set (scalar, avx2, avx512)
      for (size_t k = 0; k < isas.size(); ++k) {
        const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isas[k]);
        // Offset the row so nothing relies on more than the type's natural alignment.
        const size_t shift = t == DType::kF32 ? 4 : 2;
        std::vector<uint8_t> wbuf(c.w.size() + shift), xbuf(c.xq.size() + 4);
        std::memcpy(wbuf.data() + shift, c.w.data(), c.w.size());
        std::memcpy(xbuf.data() + 4, c.xq.data(), c.xq.size());
        results[k] = ops->vec_dot(n, wbuf.data() + shift, xbuf.data() + 4);
        EXPECT_NEAR(results[k], exact, tol) << IsaName(isas[k]);
        // Against the unquantised activations: within the activation quantisation error.
        EXPECT_NEAR(results[k], vs_float, quant_err + tol) << IsaName(isas[k]);
      }
      for (size_t k = 1; k < isas.size(); ++k) {
        EXPECT_NEAR(results[0], results[k], 2 * tol) << IsaName(isas[k]);
      }
      if (cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar)->vec_dot_type != DType::kF32) {
        // The quantisation error itself is at most half a step (amax/254) per activation.
        EXPECT_LE(quant_err, quant_bound);
      }
    }
  }
}

// Largest magnitudes everywhere: int8 products must not saturate in the 16-bit pair sums.
TEST(VecDotTest, ExtremeQuantsDoNotOverflow) {
  const std::vector<cpu::KernelIsa> isas = AvailableIsas();
  for (DType t : testing::SupportedWeightTypes()) {
    if (!IsQuantized(t)) continue;
    for (int pattern = 0; pattern < 4; ++pattern) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " pattern " + std::to_string(pattern));
      const int64_t n = 256;
      std::vector<uint8_t> w(RowBytes(t, n));
      const size_t bb = GetDTypeTraits(t).block_bytes;
      // Quant bytes all 0x00 / 0xFF / 0x80 / 0x7F, scales 1 (and m = 0.5).
      const uint8_t fill[4] = {0x00, 0xFF, 0x80, 0x7F};
      std::fill(w.begin(), w.end(), fill[pattern]);
      for (size_t off = 0; off < w.size(); off += bb) {
        testing::PutHalf(w.data() + off, 1.0f);
        if (testing::HasMinField(t)) testing::PutHalf(w.data() + off + 2, 0.5f);
        if (t == DType::kQ8_1) testing::PutHalf(w.data() + off + 2, 0.0f);
      }
      // Activations at the extremes: +-amax everywhere, signs alternating by pattern.
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = ((i + pattern) % 3 == 0) ? -3.0f : 3.0f;
      const cpu::TypeOps* s_ops = cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar);
      std::vector<uint8_t> xq(RowBytes(s_ops->vec_dot_type, n));
      s_ops->from_float(x.data(), xq.data(), n);
      std::vector<float> wf(n), xf(n);
      s_ops->to_float(w.data(), wf.data(), n);
      cpu::GetTypeOpsForIsa(s_ops->vec_dot_type, cpu::KernelIsa::kScalar)
          ->to_float(xq.data(), xf.data(), n);
      double exact = 0, abs_terms = 0;
      for (int64_t i = 0; i < n; ++i) {
        exact += static_cast<double>(wf[i]) * xf[i];
        abs_terms += std::fabs(static_cast<double>(wf[i]) * xf[i]);
      }
      for (cpu::KernelIsa isa : isas) {
        const float got = cpu::GetTypeOpsForIsa(t, isa)->vec_dot(n, w.data(), xq.data());
        // Q4_1/Q5_1 use s = fp16(d * sum q): relative error 2^-11 on the m term.
        const double tol = 1e-6 * abs_terms + (testing::HasMinField(t) ? 1e-3 * abs_terms : 0);
        EXPECT_NEAR(got, exact, tol) << IsaName(isa);
      }
    }
  }
}

// Batch invariance: a row's dot product does not depend on where the row sits in memory or on
// what precedes it (the kernels keep no state).
TEST(VecDotTest, Deterministic) {
  std::mt19937 rng(99);
  for (cpu::KernelIsa isa : AvailableIsas()) {
    for (DType t : testing::SupportedWeightTypes()) {
      const Case c = MakeCase(t, 576, rng);
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      const float a = ops->vec_dot(576, c.w.data(), c.xq.data());
      const float b = ops->vec_dot(576, c.w.data(), c.xq.data());
      EXPECT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b)) << DTypeName(t);
    }
  }
}

// Real weights: rows of the SmolLM2 file's Q8_0 embedding and Q4_1 projections, dotted with random
// activations, against the exact dot product of the dequantised rows.
TEST(VecDotTest, RealModelRows) {
  const std::string path = testing::SourcePath("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not present: " << path;
  StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::mt19937 rng(17);
  for (const char* name : {"token_embd.weight", "blk.0.attn_q.weight", "blk.7.attn_k.weight",
                           "blk.15.ffn_down.weight", "blk.29.ffn_up.weight"}) {
    StatusOr<WeightMatrix> m = (*f)->GetWeightMatrix(name);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const int64_t n = m->cols;
    const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(m->type, cpu::KernelIsa::kScalar);
    ASSERT_NE(ops, nullptr) << name;
    const std::vector<float> x = testing::RandomActivations(n, rng);
    std::vector<uint8_t> xq(RowBytes(ops->vec_dot_type, n));
    ops->from_float(x.data(), xq.data(), n);
    std::vector<float> xf(n), wf(n);
    cpu::GetTypeOpsForIsa(ops->vec_dot_type, cpu::KernelIsa::kScalar)
        ->to_float(xq.data(), xf.data(), n);
    for (int64_t r = 0; r < std::min<int64_t>(m->rows, 64); ++r) {
      ops->to_float(m->row(r), wf.data(), n);
      double exact = 0, abs_terms = 0;
      for (int64_t i = 0; i < n; ++i) {
        exact += static_cast<double>(wf[i]) * xf[i];
        abs_terms += std::fabs(static_cast<double>(wf[i]) * xf[i]);
      }
      // 2^-11 relative slack for Q8_1's fp16 s in the m term; float summation over n/32 blocks.
      const double tol =
          (m->type == DType::kQ4_1 ? 2e-3 : 0.0) * abs_terms + (n / 32 + 16) * kU * 2 * abs_terms;
      for (cpu::KernelIsa isa : AvailableIsas()) {
        const float got = cpu::GetTypeOpsForIsa(m->type, isa)->vec_dot(n, m->row(r), xq.data());
        ASSERT_NEAR(got, exact, tol) << name << " row " << r << " " << IsaName(isa);
      }
    }
  }
}

}  // namespace
}  // namespace specinfer

namespace specinfer {
namespace {

// out[r] for r < count must be bit for bit vec_dot of `w` with activation row r of `xq` (rows of
// `row_bytes`): what every multi-token kernel promises.
void ExpectEachRowIsVecDot(const cpu::TypeOps& ops, int64_t n, const std::vector<uint8_t>& w,
                           const std::vector<uint8_t>& xq, size_t row_bytes, int count,
                           const float* out) {
  for (int r = 0; r < count; ++r) {
    const float want = ops.vec_dot(n, w.data(), xq.data() + r * row_bytes);
    EXPECT_EQ(std::memcmp(&want, &out[r], sizeof(float)), 0)
        << "n=" << n << " count=" << count << " row " << r << ": " << out[r] << " vs " << want;
  }
}

// vec_dot_multi (several activation rows per weight row read) must give each row exactly what
// vec_dot gives it: token-tree passes rely on it to reproduce incremental decoding bit for bit.
TEST(VecDotMulti, EachRowIsBitIdenticalToVecDot) {
  std::mt19937 rng(11);
  int checked = 0;
  for (DType t : testing::SupportedWeightTypes()) {
    for (cpu::KernelIsa isa : testing::AvailableIsas()) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      if (ops == nullptr || ops->vec_dot_multi == nullptr) continue;
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + testing::IsaName(isa));
      for (int64_t n : Lengths(t)) {
        const std::vector<uint8_t> w = testing::RandomRow(t, n, rng);
        const size_t row_bytes = RowBytes(ops->vec_dot_type, n);
        std::vector<uint8_t> xq(row_bytes * cpu::kMaxMultiDot);
        for (int r = 0; r < cpu::kMaxMultiDot; ++r) {
          const std::vector<float> x = testing::RandomActivations(n, rng);
          if (ops->from_float == nullptr)
            std::memcpy(xq.data() + r * row_bytes, x.data(), row_bytes);
          else
            ops->from_float(x.data(), xq.data() + r * row_bytes, n);
        }
        for (int count = 1; count <= cpu::kMaxMultiDot; ++count) {
          float out[cpu::kMaxMultiDot];
          ops->vec_dot_multi(n, w.data(), xq.data(), row_bytes, count, out);
          ExpectEachRowIsVecDot(*ops, n, w, xq, row_bytes, count, out);
        }
      }
      ++checked;
    }
  }
  if (cpu::GetCpuFeatures().use_avx2_kernels) {
    EXPECT_GT(checked, 0) << "no type has a multi-row kernel";
  }
}

// vec_dot_packed (several packed activation rows per weight row read, for tree passes) must give
// each row exactly what vec_dot gives the unpacked row, odd block counts included.
TEST(VecDotPacked, EachRowIsBitIdenticalToVecDot) {
  std::mt19937 rng(13);
  int checked = 0;
  for (DType t : testing::SupportedWeightTypes()) {
    for (cpu::KernelIsa isa : testing::AvailableIsas()) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      if (ops == nullptr || ops->vec_dot_packed == nullptr) continue;
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + testing::IsaName(isa));
      ASSERT_NE(ops->pack, nullptr);
      ASSERT_NE(ops->packed_bytes, nullptr);
      for (int64_t n : Lengths(t)) {
        const std::vector<uint8_t> w = testing::RandomRow(t, n, rng);
        const size_t row_bytes = RowBytes(ops->vec_dot_type, n);
        const size_t packed_bytes = ops->packed_bytes(n);
        std::vector<uint8_t> xq(row_bytes * cpu::kMaxPackedDot);
        std::vector<uint8_t> xp(packed_bytes * cpu::kMaxPackedDot);
        for (int r = 0; r < cpu::kMaxPackedDot; ++r) {
          const std::vector<float> x = testing::RandomActivations(n, rng);
          ops->from_float(x.data(), xq.data() + r * row_bytes, n);
          ops->pack(n, xq.data() + r * row_bytes, xp.data() + r * packed_bytes);
        }
        for (int count = 1; count <= cpu::kMaxPackedDot; ++count) {
          float out[cpu::kMaxPackedDot];
          ops->vec_dot_packed(n, w.data(), xp.data(), packed_bytes, count, out);
          ExpectEachRowIsVecDot(*ops, n, w, xq, row_bytes, count, out);
        }
      }
      ++checked;
    }
  }
  if (cpu::GetCpuFeatures().use_avx2_kernels) {
    EXPECT_GT(checked, 0) << "no type has a packed multi-token kernel";
  }
}

// The AVX-512 kernels are checked above only where the CPU runs them; say so where it does not.
TEST(VecDotPacked, Avx512KernelsRunHere) {
  if (!cpu::GetCpuFeatures().use_avx512_kernels)
    GTEST_SKIP() << "this CPU lacks AVX-512 F/VL/BW/VNNI (or SPECINFER_NO_AVX512 is set): the "
                    "AVX-512 kernels were not checked";
  EXPECT_NE(cpu::GetTypeOpsForIsa(DType::kQ4_1, cpu::KernelIsa::kAvx512), nullptr);
}

// vec_dot_rows (several weight rows per activation read, for decode steps) must give each row
// exactly what vec_dot gives it, or incremental decoding and tree passes would disagree.
TEST(VecDotRows, EachRowIsBitIdenticalToVecDot) {
  std::mt19937 rng(12);
  int checked = 0;
  for (DType t : testing::SupportedWeightTypes()) {
    for (cpu::KernelIsa isa : testing::AvailableIsas()) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      if (ops == nullptr || ops->vec_dot_rows == nullptr) continue;
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + testing::IsaName(isa));
      for (int64_t n : Lengths(t)) {
        const size_t w_row_bytes = RowBytes(t, n);
        std::vector<uint8_t> w;
        for (int r = 0; r < cpu::kMaxMultiDot; ++r) {
          const std::vector<uint8_t> row = testing::RandomRow(t, n, rng);
          w.insert(w.end(), row.begin(), row.end());
        }
        const std::vector<float> x = testing::RandomActivations(n, rng);
        std::vector<uint8_t> xq(RowBytes(ops->vec_dot_type, n));
        if (ops->from_float == nullptr)
          std::memcpy(xq.data(), x.data(), xq.size());
        else
          ops->from_float(x.data(), xq.data(), n);
        for (int count = 1; count <= cpu::kMaxMultiDot; ++count) {
          float out[cpu::kMaxMultiDot];
          ops->vec_dot_rows(n, w.data(), w_row_bytes, xq.data(), count, out);
          for (int r = 0; r < count; ++r) {
            const float want = ops->vec_dot(n, w.data() + r * w_row_bytes, xq.data());
            EXPECT_EQ(std::memcmp(&want, &out[r], sizeof(float)), 0)
                << "n=" << n << " count=" << count << " row " << r << ": " << out[r]
                << " vs " << want;
          }
        }
      }
      ++checked;
    }
  }
  if (cpu::GetCpuFeatures().use_avx2_kernels) {
    EXPECT_GT(checked, 0) << "no type has a multi-weight-row kernel";
  }
}

}  // namespace
}  // namespace specinfer
