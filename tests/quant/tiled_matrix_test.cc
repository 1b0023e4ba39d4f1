// The tile kernels (backend/cpu/tiled_matrix.h) of every kernel set against ReferenceDot, BIT FOR
// BIT: every (row, token) output, for row counts that do not fill the last tile, token counts
// 1..kMaxTileTokens, strided activations and outputs, and lengths from one block to 48. This is
// what lets a token's logits be the same in a decode step and in a tree pass of any size, and on
// AVX-512, AVX2 and scalar machines alike. ReferenceDot itself is checked against the exact
// (double) dot product of the dequantised values. Float tiles (F32, F16, BF16) read float32
// activations as they are; the columns need not fill a block of 32 for them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/simd.h"
#include "backend/cpu/tiled_matrix.h"
#include "backend/cpu/type_ops.h"
#include "quant_random.h"
#include "quant_vectors.h"

namespace specinfer {
namespace {

using testing::AvailableIsas;
using testing::IsaName;

const std::vector<DType>& TiledTypes() {
  static const std::vector<DType> kTypes = {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0,
                                            DType::kQ5_1, DType::kQ5_0, DType::kF32,
                                            DType::kF16,  DType::kBF16};
  return kTypes;
}

struct Problem {
  WeightMatrix w;
  std::vector<uint8_t> w_bytes;
  int64_t tokens = 0;
  std::vector<float> x;             // [tokens, cols]
  std::vector<uint8_t> xq;          // [tokens] rows of vec_dot_type (the reference's input)
  size_t xq_row_bytes = 0;
};

Problem MakeProblem(DType t, int64_t rows, int64_t cols, int64_t tokens, std::mt19937& rng) {
  Problem p;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t> row = testing::RandomRow(t, cols, rng);
    p.w_bytes.insert(p.w_bytes.end(), row.begin(), row.end());
  }
  p.w = WeightMatrix{t, rows, cols, p.w_bytes.data()};
  p.tokens = tokens;
  const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar);
  p.xq_row_bytes = RowBytes(ops->vec_dot_type, cols);
  p.xq.resize(p.xq_row_bytes * tokens);
  for (int64_t i = 0; i < tokens; ++i) {
    const std::vector<float> x = testing::RandomActivations(cols, rng);
    p.x.insert(p.x.end(), x.begin(), x.end());
    if (ops->vec_dot_type == DType::kF32)
      std::memcpy(p.xq.data() + i * p.xq_row_bytes, x.data(), p.xq_row_bytes);
    else
      ops->from_float(x.data(), p.xq.data() + i * p.xq_row_bytes, cols);
  }
  return p;
}

// Runs the kernels of `isa` over every tile group and token slice, with outputs `y_stride`
// floats apart (>= the padded row count) and activations `x_gap` elements (TileAct, or floats
// for float tiles) apart beyond a row.
std::vector<float> RunTiles(const cpu::TileOps& ops, const cpu::TiledMatrix& m, const Problem& p,
                            int slice, int64_t x_gap) {
  const bool quantized = ops.prep != nullptr;
  const int64_t nb = quantized ? p.w.cols / 32 : p.w.cols, xs = nb + x_gap;
  std::vector<cpu::TileAct> act(quantized ? static_cast<size_t>(xs * p.tokens) : 0);
  std::vector<float> xf(quantized ? 0 : static_cast<size_t>(xs * p.tokens), std::nanf(""));
  for (int64_t i = 0; i < p.tokens; ++i) {
    if (quantized)
      ops.prep(&p.x[i * p.w.cols], p.w.cols, &act[i * xs]);
    else
      std::copy_n(&p.x[i * p.w.cols], p.w.cols, &xf[i * xs]);
  }
  const int64_t y_stride = m.groups() * cpu::kTileRows + 3;
  std::vector<float> y(static_cast<size_t>(y_stride * p.tokens), std::nanf(""));
  for (int64_t g = 0; g < m.groups(); ++g) {
    for (int64_t t0 = 0; t0 < p.tokens; t0 += slice) {
      const int count = static_cast<int>(std::min<int64_t>(slice, p.tokens - t0));
      const void* x = quantized ? static_cast<const void*>(&act[t0 * xs]) : &xf[t0 * xs];
      ops.dot(p.w.cols, m.group(g), x, xs, count, &y[t0 * y_stride + g * cpu::kTileRows],
              y_stride);
    }
  }
  // Back to [tokens, rows].
  std::vector<float> out(static_cast<size_t>(p.tokens * p.w.rows));
  for (int64_t i = 0; i < p.tokens; ++i)
    for (int64_t r = 0; r < p.w.rows; ++r) out[i * p.w.rows + r] = y[i * y_stride + r];
  return out;
}

TEST(TiledMatrix, EveryKernelSetIsBitIdenticalToReferenceDot) {
  std::mt19937 rng(5);
  int sets = 0;
  for (DType t : TiledTypes()) {
    for (int64_t cols : {32, 96, 576, 1536, 7}) {
      if (IsQuantized(t) && cols % 32 != 0) continue;
      for (int64_t rows : {16, 37}) {
        const Problem p = MakeProblem(t, rows, cols, 11, rng);
        StatusOr<cpu::TiledMatrix> m = cpu::TiledMatrix::Tile(p.w);
        ASSERT_TRUE(m.ok()) << m.status().ToString();
        std::vector<float> want(static_cast<size_t>(p.tokens * rows));
        for (int64_t i = 0; i < p.tokens; ++i)
          for (int64_t r = 0; r < rows; ++r)
            want[i * rows + r] =
                cpu::ReferenceDot(t, cols, p.w.row(r), p.xq.data() + i * p.xq_row_bytes);
        for (cpu::KernelIsa isa : AvailableIsas()) {
          const cpu::TileOps* ops = cpu::TileOpsForIsa(t, isa);
          ASSERT_NE(ops, nullptr) << DTypeName(t) << " " << IsaName(isa);
          for (int slice : {1, 2, 3, 5, cpu::kMaxTileTokens}) {
            const std::vector<float> got = RunTiles(*ops, *m, p, slice, slice % 2);
            for (size_t i = 0; i < want.size(); ++i) {
              ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
                  << DTypeName(t) << " " << IsaName(isa) << " cols=" << cols << " rows=" << rows
                  << " slice=" << slice << " token " << i / rows << " row " << i % rows << ": "
                  << got[i] << " vs " << want[i];
            }
          }
          ++sets;
        }
      }
    }
  }
  EXPECT_GE(sets, static_cast<int>(TiledTypes().size()) * 8);
}

// TileOps::prep of every kernel set writes the scalar set's bytes (d, s, bias and the quants)
// for activations the random ones above rarely hold: NaN and infinities (ignored by the scale,
// quantised to 0 and +-127), zeros, subnormals, halves exactly between two quants (roundf
// rounds them away from zero), huge and tiny blocks, and rows of 1 to 48 blocks (the AVX-512
// prep works on 16 blocks at a time).
TEST(TiledMatrix, EveryKernelSetQuantisesActivationsAsTheScalarSet) {
  const std::vector<cpu::KernelIsa> isas = AvailableIsas();
  if (isas.size() == 1) GTEST_SKIP() << "only the scalar kernel set runs on this CPU";
  std::mt19937 rng(11);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {std::nanf(""), inf, -inf, 0.0f, -0.0f, 1e-40f, -1e-42f, 3e38f,
                            -3e38f, 0.5f, -0.5f, 1.5f, 127.0f, -127.0f, 63.5f, 1e-30f};
  std::uniform_int_distribution<int> pick(0, 15), coin(0, 3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int checked = 0;
  for (int64_t blocks : {1, 2, 15, 16, 17, 18, 33, 48}) {
    for (int round = 0; round < 20; ++round) {
      std::vector<float> x(static_cast<size_t>(blocks * 32));
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
      for (float& v : x) v = coin(rng) == 0 ? specials[pick(rng)] : u(rng) * scale;
      // Blocks whose largest magnitude is 127: every value k + 0.5 sits exactly between two
      // quants.
      if (round % 4 == 1)
        for (int64_t i = 0; i < blocks * 32; ++i)
          x[i] = i % 32 == 0 ? 127.0f
                             : static_cast<float>(static_cast<int>(rng() % 253) - 126) + 0.5f;
      for (DType t : {DType::kQ4_1, DType::kQ4_0, DType::kQ8_0, DType::kQ5_0}) {
        std::vector<cpu::TileAct> want(static_cast<size_t>(blocks)), got(want.size());
        cpu::TileOpsForIsa(t, cpu::KernelIsa::kScalar)->prep(x.data(), blocks * 32, want.data());
        for (cpu::KernelIsa isa : isas) {
          if (isa == cpu::KernelIsa::kScalar) continue;
          std::memset(got.data(), 0xab, got.size() * sizeof(cpu::TileAct));
          cpu::TileOpsForIsa(t, isa)->prep(x.data(), blocks * 32, got.data());
          for (int64_t b = 0; b < blocks; ++b) {
            ASSERT_EQ(std::memcmp(&got[b], &want[b], sizeof(cpu::TileAct)), 0)
                << DTypeName(t) << " " << IsaName(isa) << " blocks=" << blocks << " round "
                << round << " block " << b << ": d " << got[b].d << " vs " << want[b].d << ", s "
                << got[b].s << " vs " << want[b].s << ", bias " << got[b].bias << " vs "
                << want[b].bias;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// ReferenceDot computes the dot product of the dequantised row and activations, up to float32
// rounding of one FMA and one add per block.
TEST(TiledMatrix, ReferenceDotIsTheDotProduct) {
  std::mt19937 rng(6);
  for (DType t : TiledTypes()) {
    const int64_t cols = 1536;
    const Problem p = MakeProblem(t, 8, cols, 2, rng);
    const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar);
    const cpu::TypeOps* xops = cpu::GetTypeOpsForIsa(ops->vec_dot_type, cpu::KernelIsa::kScalar);
    std::vector<float> wf(cols), xf(cols);
    for (int64_t i = 0; i < p.tokens; ++i) {
      if (xops->to_float == nullptr)
        std::memcpy(xf.data(), p.xq.data() + i * p.xq_row_bytes, cols * sizeof(float));
      else
        xops->to_float(p.xq.data() + i * p.xq_row_bytes, xf.data(), cols);
      for (int64_t r = 0; r < p.w.rows; ++r) {
        ops->to_float(p.w.row(r), wf.data(), cols);
        double exact = 0, abs_terms = 0;
        for (int64_t c = 0; c < cols; ++c) {
          exact += static_cast<double>(wf[c]) * xf[c];
          abs_terms += std::fabs(static_cast<double>(wf[c]) * xf[c]);
        }
        // Q4_1's and Q5_1's m term uses s = fp16(d * sum q): 2^-11 relative. Float types: one
        // rounding per column (a chain of cols FMAs).
        const double roundings = IsQuantized(t) ? cols / 32 + 16 : cols;
        const double tol = (testing::HasMinField(t) ? 2e-3 : 0.0) * abs_terms +
                           roundings * 2.0 / (1 << 24) * abs_terms;
        EXPECT_NEAR(cpu::ReferenceDot(t, cols, p.w.row(r), p.xq.data() + i * p.xq_row_bytes),
                    exact, tol)
            << DTypeName(t) << " row " << r;
      }
    }
  }
}

// Extreme quants (all -128 / 127 / 0xFF nibbles) and full-scale activations: no 16-bit sum may
// saturate in any kernel set.
TEST(TiledMatrix, ExtremeQuantsDoNotOverflow) {
  for (DType t : TiledTypes()) {
    if (!IsQuantized(t)) continue;
    for (uint8_t fill : {0x00, 0xFF, 0x80, 0x7F}) {
      const int64_t cols = 256, rows = 16;
      std::vector<uint8_t> bytes(RowBytes(t, cols) * rows, fill);
      const size_t bb = GetDTypeTraits(t).block_bytes;
      for (size_t off = 0; off < bytes.size(); off += bb) {
        testing::PutHalf(bytes.data() + off, 1.0f);
        if (testing::HasMinField(t)) testing::PutHalf(bytes.data() + off + 2, 0.5f);
      }
      Problem p;
      p.w = WeightMatrix{t, rows, cols, bytes.data()};
      p.tokens = 3;
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar);
      p.xq_row_bytes = RowBytes(ops->vec_dot_type, cols);
      p.xq.resize(p.xq_row_bytes * p.tokens);
      for (int64_t i = 0; i < p.tokens; ++i) {
        std::vector<float> x(cols);
        for (int64_t c = 0; c < cols; ++c) x[c] = ((c + i) % 3 == 0) ? -3.0f : 3.0f;
        if (i == 2)
          for (float& v : x) v = -3.0f;
        p.x.insert(p.x.end(), x.begin(), x.end());
        ops->from_float(x.data(), p.xq.data() + i * p.xq_row_bytes, cols);
      }
      StatusOr<cpu::TiledMatrix> m = cpu::TiledMatrix::Tile(p.w);
      ASSERT_TRUE(m.ok());
      for (cpu::KernelIsa isa : AvailableIsas()) {
        const std::vector<float> got = RunTiles(*cpu::TileOpsForIsa(t, isa), *m, p, 8, 0);
        for (int64_t i = 0; i < p.tokens; ++i) {
          for (int64_t r = 0; r < rows; ++r) {
            const float want =
                cpu::ReferenceDot(t, cols, p.w.row(r), p.xq.data() + i * p.xq_row_bytes);
            ASSERT_EQ(got[i * rows + r], want)
                << DTypeName(t) << " fill " << int(fill) << " " << IsaName(isa);
          }
        }
      }
    }
  }
}

// Where the CPU cannot run a kernel set, its bit-exactness was not checked above: say so.
TEST(TiledMatrix, Avx512KernelsRunHere) {
  if (!cpu::GetCpuFeatures().use_avx512_kernels)
    GTEST_SKIP() << "this CPU lacks AVX-512 F/VL/BW/VNNI (or SPECINFER_NO_AVX512 is set): the "
                    "AVX-512 tile kernels were not checked";
  EXPECT_NE(cpu::TileOpsForIsa(DType::kQ4_1, cpu::KernelIsa::kAvx512), nullptr);
}

TEST(TiledMatrix, Avx2KernelsRunHere) {
  if (!cpu::GetCpuFeatures().use_avx2_kernels)
    GTEST_SKIP() << "this CPU lacks AVX2/FMA/F16C (or SPECINFER_NO_AVX2 is set): the AVX2 tile "
                    "kernels were not checked";
  EXPECT_NE(cpu::TileOpsForIsa(DType::kQ4_1, cpu::KernelIsa::kAvx2), nullptr);
}

TEST(TiledMatrix, RefusesWhatItCannotTile) {
  std::vector<uint8_t> bytes(4 * 48);
  EXPECT_FALSE(cpu::TiledMatrix::Tile(WeightMatrix{DType::kQ8_1, 1, 32, bytes.data()}).ok());
  EXPECT_FALSE(cpu::TiledMatrix::Tile(WeightMatrix{DType::kQ8_0, 0, 32, bytes.data()}).ok());
  EXPECT_FALSE(cpu::TiledMatrix::Tile(WeightMatrix{DType::kQ8_0, 1, 48, bytes.data()}).ok());
}

}  // namespace
}  // namespace specinfer
