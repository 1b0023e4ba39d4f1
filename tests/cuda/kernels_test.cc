// The Llama-layer kernels (everything but attention) against the CPU reference, element by
// element, over awkward shapes: dequantisation and the embedding gather, the batch-invariant
// matrix product on every weight type (K-quants included), RoPE in both pairings, SwiGLU,
// RMSNorm of gathered rows, KV append and move in the paged layout, argmax and the sampling
// distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "cuda_test_util.h"
#include "dequant.cuh"
#include "elementwise.cuh"
#include "kv_cache.cuh"
#include "linear.cuh"
#include "quant/quant_random.h"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "sampling.cuh"
#include "sampling/dist_rows.h"
#include "sampling/sampler.h"
#include "tensor/half.h"

namespace specinfer {
namespace {

using kernels::ElemType;
using testing::DeviceArray;

struct TypePair {
  DType dtype;
  ElemType etype;
};
const TypePair kTypes[] = {{DType::kF32, ElemType::kF32},   {DType::kF16, ElemType::kF16},
                           {DType::kBF16, ElemType::kBF16}, {DType::kQ8_0, ElemType::kQ8_0},
                           {DType::kQ4_0, ElemType::kQ4_0}, {DType::kQ4_1, ElemType::kQ4_1},
                           {DType::kQ5_0, ElemType::kQ5_0}, {DType::kQ5_1, ElemType::kQ5_1},
                           {DType::kQ2_K, ElemType::kQ2_K}, {DType::kQ3_K, ElemType::kQ3_K},
                           {DType::kQ4_K, ElemType::kQ4_K}, {DType::kQ5_K, ElemType::kQ5_K},
                           {DType::kQ6_K, ElemType::kQ6_K}};

// Row lengths for a sweep: `plain` for the float and 32-element block types, `kquant` (multiples
// of 256) for the K-quants.
std::vector<int64_t> ColsFor(const TypePair& tp, std::vector<int64_t> plain,
                             std::vector<int64_t> kquant) {
  return kernels::IsKQuant(tp.etype) ? kquant : plain;
}

// Device scratch for kernels::LaunchLinear, valid until the next call.
float* LinearScratch(ElemType type, int64_t rows, int64_t cols, int32_t n) {
  static std::unique_ptr<DeviceArray<float>> scratch;
  scratch = std::make_unique<DeviceArray<float>>(
      static_cast<size_t>(std::max<int64_t>(1, kernels::LinearScratchFloats(type, rows, cols, n))));
  return scratch->get();
}

// rows x cols random matrix of type t (bytes) and its float32 values from the CPU's to_float.
void RandomMatrix(DType t, int64_t rows, int64_t cols, std::mt19937& rng,
                  std::vector<uint8_t>* bytes, std::vector<float>* values) {
  bytes->clear();
  values->assign(static_cast<size_t>(rows * cols), 0.0f);
  const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar);
  ASSERT_NE(ops, nullptr);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<uint8_t> row = testing::RandomRow(t, cols, rng);
    if (ops->to_float) {
      ops->to_float(row.data(), values->data() + r * cols, cols);
    } else {
      std::memcpy(values->data() + r * cols, row.data(), static_cast<size_t>(cols) * 4);
    }
    bytes->insert(bytes->end(), row.begin(), row.end());
  }
}

// fp64 reference of one output of a matrix product: sum_c W[r, c] x[t, c], and in *abs_sum the
// sum of the products' magnitudes (the scale the kernels' tolerance is relative to).
double Fp64Output(const std::vector<float>& w, const std::vector<float>& x, int64_t cols,
                  int32_t t, int64_t r, double* abs_sum) {
  double s = 0, a = 0;
  for (int64_t c = 0; c < cols; ++c) {
    const double p = static_cast<double>(w[r * cols + c]) * x[t * cols + c];
    s += p;
    a += std::fabs(p);
  }
  *abs_sum = a;
  return s;
}

TEST(CudaDequant, MatchesCpuToFloatOnEveryType) {
  std::mt19937 rng(11);
  for (const TypePair& tp : kTypes) {
    for (int64_t cols : ColsFor(tp, {32, 96, 4096}, {256, 768, 4096})) {
      for (int64_t rows : {1, 5, 33}) {
        std::vector<uint8_t> bytes;
        std::vector<float> want;
        RandomMatrix(tp.dtype, rows, cols, rng, &bytes, &want);
        DeviceArray<uint8_t> src(bytes);
        DeviceArray<float> out(want.size());
        DeviceArray<__half> out16(want.size());
        CUDA_OK(kernels::LaunchDequantizeRows(tp.etype, src.get(), rows, cols, nullptr, rows,
                                              out.get(), nullptr));
        CUDA_OK(kernels::LaunchDequantizeRows(tp.etype, src.get(), rows, cols, nullptr, rows,
                                              out16.get(), nullptr));
        const std::string what = std::string(DTypeName(tp.dtype)) + " " + std::to_string(rows) +
                                 "x" + std::to_string(cols);
        EXPECT_ALL_CLOSE(out.Download(), want, 0.0, 0.0, what + " (float)");
        std::vector<float> got16, want16;
        for (__half h : out16.Download()) got16.push_back(__half2float(h));
        for (float v : want) want16.push_back(Fp16ToFp32(Fp32ToFp16(v)));
        EXPECT_ALL_CLOSE(got16, want16, 0.0, 0.0, what + " (fp16)");
      }
    }
  }
}

TEST(CudaDequant, EmbeddingGatherPicksTheRows) {
  std::mt19937 rng(12);
  for (const TypePair& tp : kTypes) {
    const int64_t vocab = 77, dim = kernels::IsKQuant(tp.etype) ? 256 : 64;
    std::vector<uint8_t> bytes;
    std::vector<float> table;
    RandomMatrix(tp.dtype, vocab, dim, rng, &bytes, &table);
    const std::vector<int32_t> ids = {5, 0, 76, 5, 13, 42, 1};
    std::vector<float> want;
    for (int32_t id : ids)
      want.insert(want.end(), table.begin() + id * dim, table.begin() + (id + 1) * dim);
    DeviceArray<uint8_t> src(bytes);
    DeviceArray<int32_t> d_ids(ids);
    DeviceArray<float> out(want.size());
    CUDA_OK(kernels::LaunchDequantizeRows(tp.etype, src.get(), vocab, dim, d_ids.get(),
                                          static_cast<int64_t>(ids.size()), out.get(), nullptr));
    EXPECT_ALL_CLOSE(out.Download(), want, 0.0, 0.0, DTypeName(tp.dtype));
  }
}

// y = beta * y0 + x W^T against an fp64 reference on the same weights; tolerance relative to
// sum |w x| (the float32 accumulation error bound's scale).
TEST(CudaLinear, MatchesFp64ReferenceOnEveryType) {
  std::mt19937 rng(13);
  for (const TypePair& tp : kTypes) {
    for (int64_t cols : ColsFor(tp, {32, 64, 288, 4096}, {256, 512, 4096})) {
      for (int64_t rows : {1, 7, 130}) {
        for (int32_t n : {1, 2, 3, 5, 8, 13}) {
          if (cols == 4096 && rows == 130 && n > 5) continue;  // keep the sweep quick
          std::vector<uint8_t> bytes;
          std::vector<float> wv;
          RandomMatrix(tp.dtype, rows, cols, rng, &bytes, &wv);
          std::vector<float> x = testing::RandomActivations(n * cols, rng);
          std::vector<float> y0(static_cast<size_t>(n * rows));
          std::normal_distribution<float> normal(0.0f, 1.0f);
          for (float& v : y0) v = normal(rng);
          for (float beta : {0.0f, 1.0f}) {
            std::vector<double> want(y0.size());
            std::vector<double> scale(y0.size());
            for (int32_t t = 0; t < n; ++t)
              for (int64_t r = 0; r < rows; ++r) {
                double a = 0;
                const double s = Fp64Output(wv, x, cols, t, r, &a);
                want[t * rows + r] = beta * y0[t * rows + r] + s;
                scale[t * rows + r] = a + std::fabs(y0[t * rows + r]);
              }
            DeviceArray<uint8_t> dw(bytes);
            DeviceArray<float> dx(x), dy(y0);
            CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, dx.get(), n, dy.get(),
                                          beta, nullptr, LinearScratch(tp.etype, rows, cols, n)));
            const std::vector<float> got = dy.Download();
            // Per-element tolerance: 1e-5 of the magnitude sum.
            std::vector<double> err(got.size()), zero(got.size(), 0.0);
            for (size_t i = 0; i < got.size(); ++i)
              err[i] = std::fabs(got[i] - want[i]) / (1e-30 + scale[i]);
            EXPECT_ALL_CLOSE(err, zero, 1e-5, 0.0,
                             std::string(DTypeName(tp.dtype)) + " rows " + std::to_string(rows) +
                                 " cols " + std::to_string(cols) + " n " + std::to_string(n) +
                                 " beta " + std::to_string(beta) + " (relative error)");
          }
        }
      }
    }
  }
}

// A token's outputs are bit-identical whatever batch it is in and wherever in the batch.
TEST(CudaLinear, IsBatchInvariant) {
  std::mt19937 rng(14);
  for (const TypePair& tp : kTypes) {
    const int64_t rows = 67, cols = kernels::IsKQuant(tp.etype) ? 768 : 320;
    std::vector<uint8_t> bytes;
    std::vector<float> wv;
    RandomMatrix(tp.dtype, rows, cols, rng, &bytes, &wv);
    const int32_t n = 21;
    std::vector<float> x = testing::RandomActivations(n * cols, rng);
    DeviceArray<uint8_t> dw(bytes);
    DeviceArray<float> dx(x), dy(static_cast<size_t>(n * rows));
    CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, dx.get(), n, dy.get(), 0.0f,
                                  nullptr, LinearScratch(tp.etype, rows, cols, n)));
    const std::vector<float> all = dy.Download();
    for (int32_t t : {0, 1, 7, 8, 20}) {
      for (int32_t count : {1, 2, 3, 4, 5, 9}) {
        if (t + count > n) continue;
        DeviceArray<float> sx(
            std::vector<float>(x.begin() + t * cols, x.begin() + (t + count) * cols));
        DeviceArray<float> sy(static_cast<size_t>(count * rows));
        CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, sx.get(), count, sy.get(),
                                      0.0f, nullptr, LinearScratch(tp.etype, rows, cols, count)));
        const std::vector<float> part = sy.Download();
        const std::vector<float> want(all.begin() + t * rows, all.begin() + (t + count) * rows);
        EXPECT_ALL_CLOSE(part, want, 0.0, 0.0,
                         std::string(DTypeName(tp.dtype)) + " tokens " + std::to_string(t) + ".." +
                             std::to_string(t + count));
      }
    }
  }
}

// The tiled shapes' edges: token tiles of 8 and 16 with a partial last tile, rows that do not
// fill the last block, column chunks (1024 or 512) with a partial last chunk, and cols that are
// not a multiple of 8 (the column-at-a-time path). Every token of a 40-token batch must equal,
// bit for bit, the same token computed alone (n = 1, the decode shape) and within a sub-batch
// of 3 or 9, and be within the fp64 tolerance.
TEST(CudaLinear, TilesAndChunksKeepTheOrder) {
  std::mt19937 rng(16);
  for (const TypePair& tp : kTypes) {
    const bool block_type = kernels::ElemBlockElems(tp.etype) > 1;
    // K-quants: 5 super-blocks, so the 1024-column chunks end with a partial one.
    std::vector<int64_t> col_set = {kernels::IsKQuant(tp.etype) ? 1280 : 1312};
    if (!block_type) col_set.insert(col_set.end(), {1100, 1101});
    for (int64_t cols : col_set) {
      const int64_t rows = 37;
      const int32_t n = 40;
      std::vector<uint8_t> bytes;
      std::vector<float> wv;
      RandomMatrix(tp.dtype, rows, cols, rng, &bytes, &wv);
      std::vector<float> x = testing::RandomActivations(n * cols, rng);
      const std::string what = std::string(DTypeName(tp.dtype)) + " cols " + std::to_string(cols);
      DeviceArray<uint8_t> dw(bytes);
      DeviceArray<float> dx(x), dy(static_cast<size_t>(n * rows));
      CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, dx.get(), n, dy.get(), 0.0f,
                                    nullptr, LinearScratch(tp.etype, rows, cols, n)));
      const std::vector<float> all = dy.Download();

      std::vector<double> err(all.size()), zero(all.size(), 0.0);
      for (int32_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double a = 0;
          const double s = Fp64Output(wv, x, cols, t, r, &a);
          err[t * rows + r] = std::fabs(all[t * rows + r] - s) / (1e-30 + a);
        }
      EXPECT_ALL_CLOSE(err, zero, 1e-5, 0.0, what + " (relative error)");

      for (int32_t t = 0; t < n; ++t) {
        for (int32_t count : {1, 3, 9}) {
          if (t + count > n || (count > 1 && t % 13 != 4)) continue;
          DeviceArray<float> sx(
              std::vector<float>(x.begin() + t * cols, x.begin() + (t + count) * cols));
          DeviceArray<float> sy(static_cast<size_t>(count * rows));
          CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, sx.get(), count, sy.get(),
                                        0.0f, nullptr, LinearScratch(tp.etype, rows, cols, count)));
          const std::vector<float> want(all.begin() + t * rows, all.begin() + (t + count) * rows);
          EXPECT_ALL_CLOSE(
              sy.Download(), want, 0.0, 0.0,
              what + " tokens " + std::to_string(t) + ".." + std::to_string(t + count));
        }
      }
    }
  }
}

// 17-64 tokens of 16-bit weights go through blocks that each own one column partition of 256 rows
// (LinearPartKernel, then the partition sums added in order): every token equals, bit for bit,
// what the 64-token tiles of all partitions give it (SetLinearPartitionBlocks(false)), the same
// token in a 70-token batch (the 64-token tiles of all partitions) and alone (decode),
// with beta 0 and 1, for 300 rows (a partial second row block), one step (partitions without
// columns), steps that do not divide by 8, and 1024-wide rows; and is within the fp64 tolerance.
TEST(CudaLinear, PartitionBlocksKeepTheOrder) {
  std::mt19937 rng(19);
  for (const TypePair& tp : kTypes) {
    if (tp.etype != ElemType::kF16 && tp.etype != ElemType::kBF16) continue;
    for (int64_t cols : {32, 352, 1024}) {
      const int64_t rows = cols == 1024 ? 40 : 300;
      const int32_t big = 70;
      std::vector<uint8_t> bytes;
      std::vector<float> wv;
      RandomMatrix(tp.dtype, rows, cols, rng, &bytes, &wv);
      const std::vector<float> x = testing::RandomActivations(big * cols, rng);
      std::vector<float> y0(static_cast<size_t>(big * rows));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : y0) v = normal(rng);
      DeviceArray<uint8_t> dw(bytes);
      for (float beta : {0.0f, 1.0f}) {
        DeviceArray<float> dx(x), dy(y0);
        CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, dx.get(), big, dy.get(), beta,
                                      nullptr, LinearScratch(tp.etype, rows, cols, big)));
        const std::vector<float> all = dy.Download();
        const std::string what = std::string(DTypeName(tp.dtype)) + " cols " +
                                 std::to_string(cols) + " beta " + std::to_string(beta);
        for (const auto& [t, count] : {std::pair{0, 64}, std::pair{5, 33}, std::pair{6, 64},
                                       std::pair{3, 32}, std::pair{40, 17}, std::pair{61, 1}}) {
          DeviceArray<float> sx(
              std::vector<float>(x.begin() + t * cols, x.begin() + (t + count) * cols));
          DeviceArray<float> sy(
              std::vector<float>(y0.begin() + t * rows, y0.begin() + (t + count) * rows));
          CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, sx.get(), count, sy.get(),
                                        beta, nullptr, LinearScratch(tp.etype, rows, cols, count)));
          const std::vector<float> got = sy.Download();
          const std::vector<float> want(all.begin() + t * rows, all.begin() + (t + count) * rows);
          EXPECT_ALL_CLOSE(
              got, want, 0.0, 0.0,
              what + " tokens " + std::to_string(t) + ".." + std::to_string(t + count));
          if (count != 64 && count != 32) continue;
          // The same tokens on the tiles of all partitions (the shape before): the same bits.
          DeviceArray<float> ty(
              std::vector<float>(y0.begin() + t * rows, y0.begin() + (t + count) * rows));
          kernels::SetLinearPartitionBlocks(false);
          const cudaError_t tiled =
              kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, sx.get(), count, ty.get(), beta,
                                    nullptr, LinearScratch(tp.etype, rows, cols, count));
          kernels::SetLinearPartitionBlocks(true);
          CUDA_OK(tiled);
          EXPECT_ALL_CLOSE(ty.Download(), got, 0.0, 0.0, what + " partition blocks vs tiles");
          std::vector<double> err(got.size()), zero(got.size(), 0.0);
          for (int32_t i = 0; i < count; ++i)
            for (int64_t r = 0; r < rows; ++r) {
              double a = 0;
              const double s = Fp64Output(wv, x, cols, t + i, r, &a);
              const double y = y0[(t + i) * rows + r];
              err[i * rows + r] =
                  std::fabs(got[i * rows + r] - (beta * y + s)) / (1e-30 + a + std::fabs(beta * y));
            }
          EXPECT_ALL_CLOSE(err, zero, 1e-5, 0.0, what + " (relative error)");
        }
      }
    }
  }
}

// The products read exactly the weights the CPU's to_float gives: with x the identity (token t
// selects column t), y[t, r] = W[r, t] bit for bit, since every other product is a zero added
// to the sum. Covers every element of the K-quant layouts (all groups of a super-block, both
// halves of each group), on the tiled shape and on the decode shape (one token).
TEST(CudaLinear, KQuantsReadTheCpuWeightsExactly) {
  std::mt19937 rng(17);
  for (const TypePair& tp : kTypes) {
    if (!kernels::IsKQuant(tp.etype)) continue;
    const int64_t rows = 9, cols = 512;
    const int32_t n = static_cast<int32_t>(cols);
    std::vector<uint8_t> bytes;
    std::vector<float> wv;
    RandomMatrix(tp.dtype, rows, cols, rng, &bytes, &wv);
    std::vector<float> x(static_cast<size_t>(n * cols), 0.0f);
    for (int32_t t = 0; t < n; ++t) x[t * cols + t] = 1.0f;
    std::vector<float> want(static_cast<size_t>(n * rows));
    for (int32_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) want[t * rows + r] = wv[r * cols + t];
    DeviceArray<uint8_t> dw(bytes);
    DeviceArray<float> dx(x), dy(want.size());
    CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, dx.get(), n, dy.get(), 0.0f,
                                  nullptr, LinearScratch(tp.etype, rows, cols, n)));
    EXPECT_ALL_CLOSE(dy.Download(), want, 0.0, 0.0, std::string(DTypeName(tp.dtype)) + " tiled");
    for (int32_t t : {0, 17, 255, 256, 300, 511}) {
      DeviceArray<float> sx(std::vector<float>(x.begin() + t * cols, x.begin() + (t + 1) * cols));
      DeviceArray<float> sy(static_cast<size_t>(rows));
      CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, sx.get(), 1, sy.get(), 0.0f,
                                    nullptr, LinearScratch(tp.etype, rows, cols, 1)));
      EXPECT_ALL_CLOSE(sy.Download(),
                       std::vector<float>(want.begin() + t * rows, want.begin() + (t + 1) * rows),
                       0.0, 0.0, std::string(DTypeName(tp.dtype)) + " column " + std::to_string(t));
    }
  }
}

// The 16-bit weight types run on tensor cores with the activations split into 16-bit parts (fp16
// with a per-token power-of-two scale, bf16 in three parts): they must keep float32 precision at
// activation scales far outside fp16's range (1e-30 to 1e30) and with outliers beside small
// values, a batch of more than 8 tokens without scratch is refused, and a token's outputs stay
// bit-identical in any batch at every scale (alone: split by the product kernel; in the batch of
// 12: split once by a first kernel).
TEST(CudaLinear, SixteenBitWeightsKeepFloatPrecisionAtAnyActivationScale) {
  std::mt19937 rng(18);
  const int64_t rows = 40, cols = 512;
  const int32_t n = 12;
  for (const TypePair& tp : {kTypes[1], kTypes[2]}) {
    std::vector<uint8_t> bytes;
    std::vector<float> wv;
    RandomMatrix(tp.dtype, rows, cols, rng, &bytes, &wv);
    DeviceArray<uint8_t> dw(bytes);
    for (float magnitude : {1e-30f, 1e-6f, 1.0f, 7e4f, 1e30f}) {
      std::vector<float> x = testing::RandomActivations(n * cols, rng);
      for (float& v : x) v *= magnitude;
      x[3] = 3e4f * magnitude;  // an outlier beside values 30000 times smaller
      x[cols + 5] = -1e-4f * magnitude;
      const std::string what = std::string(DTypeName(tp.dtype)) + " activations ~" +
                               std::to_string(magnitude);
      DeviceArray<float> dx(x), dy(static_cast<size_t>(n * rows));
      CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, dx.get(), n, dy.get(), 0.0f,
                                    nullptr, LinearScratch(tp.etype, rows, cols, n)));
      const std::vector<float> all = dy.Download();
      std::vector<double> err(all.size()), zero(all.size(), 0.0);
      for (int32_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double a = 0;
          const double s = Fp64Output(wv, x, cols, t, r, &a);
          err[t * rows + r] = std::fabs(all[t * rows + r] - s) / (1e-300 + a);
        }
      EXPECT_ALL_CLOSE(err, zero, 1e-5, 0.0, what + " (relative error)");
      for (int32_t t : {0, 1, 5, 11}) {
        DeviceArray<float> sx(std::vector<float>(x.begin() + t * cols, x.begin() + (t + 1) * cols));
        DeviceArray<float> sy(static_cast<size_t>(rows));
        CUDA_OK(kernels::LaunchLinear(tp.etype, dw.get(), rows, cols, sx.get(), 1, sy.get(), 0.0f,
                                      nullptr, LinearScratch(tp.etype, rows, cols, 1)));
        EXPECT_ALL_CLOSE(sy.Download(),
                         std::vector<float>(all.begin() + t * rows, all.begin() + (t + 1) * rows),
                         0.0, 0.0, what + " token " + std::to_string(t) + " alone");
      }
    }
  }
  // More than 8 tokens need the scratch (the activations are split once, for every block).
  const int32_t many = 12;
  DeviceArray<float> dx(static_cast<size_t>(many * cols)), dy(static_cast<size_t>(many * rows));
  DeviceArray<uint8_t> dw(static_cast<size_t>(rows * cols * 2));
  for (ElemType type : {ElemType::kF16, ElemType::kBF16}) {
    EXPECT_EQ(kernels::LinearScratchFloats(type, rows, cols, 8), 0);
    EXPECT_GE(kernels::LinearScratchFloats(type, rows, cols, many), int64_t{many} * cols);
    EXPECT_EQ(kernels::LaunchLinear(type, dw.get(), rows, cols, dx.get(), many, dy.get(), 0.0f,
                                    nullptr, nullptr),
              cudaErrorInvalidValue);
  }
}

TEST(CudaRope, MatchesCpuRopeTableBitForBit) {
  std::mt19937 rng(15);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalf}) {
    for (int32_t head_dim : {8, 64, 128}) {
      const int32_t q_heads = 6, k_heads = 2, max_pos = 50;
      std::vector<float> inv(static_cast<size_t>(head_dim / 2));
      for (int32_t i = 0; i < head_dim / 2; ++i)
        inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / head_dim) / (i % 3 == 0 ? 1.5f : 1.0f);
      cpu::RopeTable table(inv, max_pos);
      std::vector<float> cs, sn;
      for (int32_t p = 0; p < max_pos; ++p)
        for (int32_t i = 0; i < head_dim / 2; ++i) {
          const float a = static_cast<float>(p) * inv[i];
          cs.push_back(std::cos(a));
          sn.push_back(std::sin(a));
        }
      const std::vector<int32_t> pos = {0, 1, 17, 49, 3, 3, 60, 1000};  // last two: off table
      const int32_t n = static_cast<int32_t>(pos.size());
      std::vector<float> q(static_cast<size_t>(n * q_heads * head_dim)),
          k(static_cast<size_t>(n * k_heads * head_dim));
      for (float& v : q) v = normal(rng);
      for (float& v : k) v = normal(rng);
      std::vector<float> wq = q, wk = k;
      for (int32_t t = 0; t < n; ++t) {
        table.Apply(&wq[static_cast<size_t>(t * q_heads * head_dim)], q_heads, pos[t], style);
        table.Apply(&wk[static_cast<size_t>(t * k_heads * head_dim)], k_heads, pos[t], style);
      }
      DeviceArray<float> dq(q), dk(k), dcos(cs), dsin(sn), dinv(inv);
      DeviceArray<int32_t> dpos(pos);
      CUDA_OK(kernels::LaunchRope(dq.get(), q_heads, dk.get(), k_heads, head_dim, dpos.get(), n,
                                  dcos.get(), dsin.get(), max_pos, dinv.get(),
                                  style == RopeStyle::kInterleaved ? kernels::RopeMode::kInterleaved
                                                                   : kernels::RopeMode::kHalf,
                                  nullptr));
      const std::vector<float> gq = dq.Download(), gk = dk.Download();
      const std::string what = "style " + std::to_string(static_cast<int>(style)) + " head_dim " +
                               std::to_string(head_dim);
      // Tokens within the table: exact. Off the table: cosf/sinf vs std::cos, a few ulp.
      const size_t q_in = static_cast<size_t>(6 * q_heads * head_dim);
      const size_t k_in = static_cast<size_t>(6 * k_heads * head_dim);
      EXPECT_ALL_CLOSE(std::vector<float>(gq.begin(), gq.begin() + q_in),
                       std::vector<float>(wq.begin(), wq.begin() + q_in), 0.0, 0.0, what);
      EXPECT_ALL_CLOSE(std::vector<float>(gk.begin(), gk.begin() + k_in),
                       std::vector<float>(wk.begin(), wk.begin() + k_in), 0.0, 0.0, what);
      EXPECT_ALL_CLOSE(gq, wq, 1e-4, 1e-4, what + " (off table)");
      EXPECT_ALL_CLOSE(gk, wk, 1e-4, 1e-4, what + " (off table)");
    }
  }
}

TEST(CudaElementwise, SwiGluBiasAndCastMatchTheCpu) {
  std::mt19937 rng(16);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n : {1, 31, 172 * 5, 100003}) {
    std::vector<float> g(static_cast<size_t>(n)), u(g.size());
    for (float& v : g) v = normal(rng);
    for (float& v : u) v = normal(rng);
    std::vector<float> want = g;
    cpu::SwiGlu(want.data(), u.data(), n);
    DeviceArray<float> dg(g), du(u);
    CUDA_OK(kernels::LaunchSwiGlu(dg.get(), du.get(), n, nullptr));
    EXPECT_ALL_CLOSE(dg.Download(), want, 1e-7, 1e-6, "swiglu n " + std::to_string(n));

    std::vector<__half> hwant;
    for (float v : g) hwant.push_back(__float2half_rn(v));
    DeviceArray<__half> dh(g.size());
    DeviceArray<float> dsrc(g);
    CUDA_OK(kernels::LaunchCast(dsrc.get(), dh.get(), n, nullptr));
    std::vector<float> got, want16;
    for (__half h : dh.Download()) got.push_back(__half2float(h));
    for (float v : g) want16.push_back(Fp16ToFp32(Fp32ToFp16(v)));
    EXPECT_ALL_CLOSE(got, want16, 0.0, 0.0, "cast fp16");
  }
  const int64_t rows = 5, dim = 40;
  std::vector<float> y(rows * dim), b(dim);
  for (float& v : y) v = normal(rng);
  for (float& v : b) v = normal(rng);
  std::vector<float> want = y;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < dim; ++i) want[t * dim + i] += b[i];
  DeviceArray<float> dy(y), db(b);
  CUDA_OK(kernels::LaunchAddBias(dy.get(), db.get(), rows, dim, nullptr));
  EXPECT_ALL_CLOSE(dy.Download(), want, 0.0, 0.0, "bias");
}

TEST(CudaRmsNorm, GatheredRowsMatchCpu) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int n = 576, rows = 9;
  std::vector<float> x(rows * n), w(n);
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  const std::vector<int32_t> ids = {8, 0, 3, 3};
  std::vector<float> want(ids.size() * n);
  for (size_t r = 0; r < ids.size(); ++r)
    cpu::RmsNorm(&x[ids[r] * n], w.data(), &want[r * n], n, 1e-5f);
  DeviceArray<float> dx(x), dw(w), out(want.size());
  DeviceArray<int32_t> did(ids);
  CUDA_OK(kernels::LaunchRmsNormRows(dx.get(), did.get(), dw.get(), out.get(),
                                     static_cast<int>(ids.size()), n, 1e-5f, nullptr));
  EXPECT_ALL_CLOSE(out.Download(), want, 1e-5, 1e-5, "rmsnorm rows");
}

// Append writes each token's K and V at its slot; Move copies slots in every layer.
TEST(CudaKvCache, AppendAndMoveInThePagedLayout) {
  std::mt19937 rng(18);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int32_t layers = 3, slots = 64, kv_dim = 24, n = 5;
  std::vector<float> k(n * kv_dim), v(n * kv_dim);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  const std::vector<int64_t> where = {17, 3, 63, 0, 40};
  std::vector<float> want_k(static_cast<size_t>(layers) * slots * kv_dim, 0.0f),
      want_v(want_k.size(), 0.0f);
  DeviceArray<float> dk(k), dv(v), ck(want_k.size()), cv(want_v.size());
  DeviceArray<int64_t> dslots(where);
  for (int32_t l = 0; l < layers; ++l) {
    // Each layer gets the values scaled differently, to tell layers apart.
    std::vector<float> kl = k, vl = v;
    for (float& x : kl) x *= static_cast<float>(l + 1);
    for (float& x : vl) x *= -static_cast<float>(l + 1);
    DeviceArray<float> dkl(kl), dvl(vl);
    CUDA_OK(kernels::LaunchKvAppend(dkl.get(), dvl.get(), dslots.get(), n, kv_dim,
                                    ck.get() + static_cast<size_t>(l) * slots * kv_dim,
                                    cv.get() + static_cast<size_t>(l) * slots * kv_dim, nullptr));
    for (int32_t t = 0; t < n; ++t)
      for (int32_t i = 0; i < kv_dim; ++i) {
        want_k[(static_cast<size_t>(l) * slots + where[t]) * kv_dim + i] = kl[t * kv_dim + i];
        want_v[(static_cast<size_t>(l) * slots + where[t]) * kv_dim + i] = vl[t * kv_dim + i];
      }
  }
  EXPECT_ALL_CLOSE(ck.Download(), want_k, 0.0, 0.0, "K after append");
  EXPECT_ALL_CLOSE(cv.Download(), want_v, 0.0, 0.0, "V after append");

  const std::vector<int64_t> src = {40, 63, 17}, dst = {1, 2, 5};
  for (size_t m = 0; m < src.size(); ++m)
    for (int32_t l = 0; l < layers; ++l)
      for (int32_t i = 0; i < kv_dim; ++i) {
        const size_t from = (static_cast<size_t>(l) * slots + src[m]) * kv_dim + i;
        const size_t to = (static_cast<size_t>(l) * slots + dst[m]) * kv_dim + i;
        want_k[to] = want_k[from];
        want_v[to] = want_v[from];
      }
  DeviceArray<int64_t> dsrc(src), ddst(dst);
  CUDA_OK(kernels::LaunchKvMove(ck.get(), cv.get(), 4, layers, int64_t{slots} * kv_dim, kv_dim,
                                dsrc.get(), ddst.get(), static_cast<int32_t>(src.size()), nullptr));
  EXPECT_ALL_CLOSE(ck.Download(), want_k, 0.0, 0.0, "K after move");
  EXPECT_ALL_CLOSE(cv.Download(), want_v, 0.0, 0.0, "V after move");
}

TEST(CudaKvCache, HalfCacheRoundsToNearest) {
  const int32_t kv_dim = 8;
  std::vector<float> k = {1.0f, 1.0009765625f, 0.1f, -3.3f, 65504.0f, 1e-8f, 2.5f, -0.0f};
  std::vector<float> v = k;
  DeviceArray<float> dk(k), dv(v);
  DeviceArray<__half> ck(kv_dim * 4), cv(kv_dim * 4);
  DeviceArray<int64_t> slot(std::vector<int64_t>{2});
  CUDA_OK(kernels::LaunchKvAppend(dk.get(), dv.get(), slot.get(), 1, kv_dim, ck.get(), cv.get(),
                                  nullptr));
  const std::vector<__half> got = ck.Download();
  std::vector<float> g, want;
  for (int32_t i = 0; i < kv_dim; ++i) {
    g.push_back(__half2float(got[2 * kv_dim + i]));
    want.push_back(Fp16ToFp32(Fp32ToFp16(k[i])));
  }
  EXPECT_ALL_CLOSE(g, want, 0.0, 0.0, "fp16 KV");
}

TEST(CudaSampling, ArgmaxTakesTheLowestIndexAmongEquals) {
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int32_t vocab : {1, 2, 512, 32000, 151936}) {
    const int32_t rows = 3;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& v : logits) v = normal(rng);
    if (vocab > 10) {  // row 1: a tie for the maximum
      logits[static_cast<size_t>(vocab) + 7] = 100.0f;
      logits[static_cast<size_t>(vocab) + 3] = 100.0f;
    }
    std::vector<int32_t> want;
    for (int32_t r = 0; r < rows; ++r)
      want.push_back(Argmax(std::span<const float>(&logits[static_cast<size_t>(r) * vocab],
                                                   static_cast<size_t>(vocab))));
    DeviceArray<float> dl(logits);
    DeviceArray<int32_t> out(rows);
    CUDA_OK(kernels::LaunchArgmax(dl.get(), rows, vocab, out.get(), nullptr));
    EXPECT_EQ(out.Download(), want) << "vocab " << vocab;
    // With the maximum too (what a tensor-parallel share sends, to combine with its peers').
    DeviceArray<int32_t> out2(rows);
    DeviceArray<float> values(rows);
    CUDA_OK(kernels::LaunchArgmax(dl.get(), rows, vocab, out2.get(), nullptr, values.get()));
    EXPECT_EQ(out2.Download(), want) << "vocab " << vocab;
    const std::vector<float> got_values = values.Download();
    for (int32_t r = 0; r < rows; ++r)
      EXPECT_EQ(got_values[r], logits[static_cast<size_t>(r) * vocab + want[r]])
          << "vocab " << vocab << " row " << r;
  }
}

TEST(CudaSampling, ProbabilitiesMatchComputeProbs) {
  std::mt19937 rng(20);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  const Case cases[] = {{1.0f, 0, 1.0f},  {0.7f, 0, 1.0f},    {1.0f, 40, 1.0f}, {0.8f, 0, 0.9f},
                        {1.3f, 50, 0.8f}, {0.5f, 5, 0.5f},    {0.0f, 0, 1.0f},  {1.0f, 1, 1.0f},
                        {2.0f, 0, 0.05f}, {1.0f, 1000, 0.95f}};
  for (int32_t vocab : {10, 512, 32000}) {
    const int32_t rows = 4;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& v : logits) v = normal(rng);
    // Row 2 has many exact ties (the tie rules by index matter there).
    for (int32_t i = 0; i < vocab; ++i)
      logits[2 * static_cast<size_t>(vocab) + i] = static_cast<float>(i % 7);
    DeviceArray<float> dl(logits), dp(logits.size());
    for (const Case& cs : cases) {
      SamplingParams sp;
      sp.temperature = cs.temperature;
      sp.top_k = cs.top_k;
      sp.top_p = cs.top_p;
      std::vector<float> want;
      for (int32_t r = 0; r < rows; ++r) {
        std::vector<float> probs;
        ComputeProbs(std::span<const float>(&logits[static_cast<size_t>(r) * vocab],
                                            static_cast<size_t>(vocab)),
                     sp, probs);
        want.insert(want.end(), probs.begin(), probs.end());
      }
      kernels::SamplingConfig cfg{cs.temperature, cs.top_k, cs.top_p};
      CUDA_OK(kernels::LaunchSamplingProbs(dl.get(), rows, vocab, cfg, dp.get(), nullptr));
      const std::vector<float> got = dp.Download();
      const std::string what = "vocab " + std::to_string(vocab) + " T " +
                               std::to_string(cs.temperature) + " k " + std::to_string(cs.top_k) +
                               " p " + std::to_string(cs.top_p);
      EXPECT_ALL_CLOSE(got, want, 1e-6, 1e-5, what);
      // The kept sets are identical (zero exactly where the CPU's is zero).
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += (got[i] == 0.0f) != (want[i] == 0.0f);
      EXPECT_EQ(differ, 0u) << what;
    }
  }
}

// DrawTokens: greedy rows take the argmax (and its logit); sampled rows are overwritten with their
// SamplingProbs distribution, bit for bit, and take the token SampleFromProbs draws from that
// distribution at the row's uniform, including u = 0 (the first kept token) and u just below 1.
TEST(CudaSampling, DrawsTakeTheTokenSampleFromProbsTakes) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int checked = 0;
  for (int32_t vocab : {1, 7, 512, 5000}) {
    std::vector<kernels::TokenDraw> draws;
    for (float t : {0.0f, 1.0f, 0.7f}) {
      for (int32_t k : {0, 1, 40}) {
        for (float p : {1.0f, 0.9f}) {
          for (double u : {0.0, 0.999999999, uniform(rng), uniform(rng)}) {
            kernels::TokenDraw d;
            d.temperature = t;
            d.top_k = k;
            d.top_p = p;
            d.u = u;
            draws.push_back(d);
          }
        }
      }
    }
    const auto rows = static_cast<int32_t>(draws.size());
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& v : logits) v = normal(rng);
    for (int32_t i = 0; i < vocab; ++i)  // row 1: ties everywhere
      logits[static_cast<size_t>(vocab) + i] = static_cast<float>(i % 3);
    DeviceArray<float> dl(logits), values(rows);
    DeviceArray<int32_t> out(rows);
    DeviceArray<kernels::TokenDraw> dd(draws);
    CUDA_OK(kernels::LaunchDrawTokens(dl.get(), rows, vocab, dd.get(), out.get(), nullptr,
                                      values.get()));
    const std::vector<int32_t> got = out.Download();
    const std::vector<float> rows_after = dl.Download(), got_values = values.Download();
    for (int32_t r = 0; r < rows; ++r) {
      const kernels::TokenDraw& d = draws[static_cast<size_t>(r)];
      const std::span<const float> row(&logits[static_cast<size_t>(r) * vocab],
                                       static_cast<size_t>(vocab));
      const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) +
                               " T " + std::to_string(d.temperature) + " k " +
                               std::to_string(d.top_k) + " p " + std::to_string(d.top_p) + " u " +
                               std::to_string(d.u);
      if (d.temperature <= 0.0f || d.top_k == 1) {
        EXPECT_EQ(got[r], Argmax(row)) << what;
        EXPECT_EQ(got_values[r], row[static_cast<size_t>(got[r])]) << what;
        continue;
      }
      // The row now holds SamplingProbs' distribution.
      DeviceArray<float> one(std::vector<float>(row.begin(), row.end()));
      DeviceArray<float> probs(static_cast<size_t>(vocab));
      CUDA_OK(kernels::LaunchSamplingProbs(one.get(), 1, vocab, {d.temperature, d.top_k, d.top_p},
                                           probs.get(), nullptr));
      const std::vector<float> want_probs = probs.Download();
      const std::vector<float> got_probs(rows_after.begin() + static_cast<int64_t>(r) * vocab,
                                         rows_after.begin() + static_cast<int64_t>(r + 1) * vocab);
      EXPECT_EQ(got_probs, want_probs) << what;
      EXPECT_EQ(got[r], SampleFromProbs(want_probs, d.u)) << what;
      EXPECT_EQ(got_values[r], want_probs[static_cast<size_t>(got[r])]) << what;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

// DistRows: each row becomes SamplingProbs' distribution, and the packed words hold exactly its
// nonzero probabilities with their ids (ascending) where the host's DistRows keeps it sparse, all
// of it where dense; rows follow one another at the offsets the counts give.
TEST(CudaSampling, DistributionRowsPackWhatSamplingProbsKeeps) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  int sparse = 0, dense = 0;
  for (int32_t vocab : {1, 7, 512, 5000}) {
    std::vector<kernels::TokenDraw> settings;
    for (float t : {0.0f, 1.0f, 0.7f})
      for (int32_t k : {0, 1, 3, 40})
        for (float p : {1.0f, 0.9f, 0.5f}) settings.push_back({t, k, p, 0, 0.0});
    const auto rows = static_cast<int32_t>(settings.size());
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& v : logits) v = normal(rng);
    for (int32_t i = 0; i < vocab; ++i)  // row 2: ties everywhere
      logits[2 * static_cast<size_t>(vocab) + i] = static_cast<float>(i % 3);
    DeviceArray<float> dl(logits);
    DeviceArray<int32_t> counts(rows);
    DeviceArray<uint32_t> packed(static_cast<size_t>(rows) * vocab);
    DeviceArray<kernels::TokenDraw> ds(settings);
    CUDA_OK(kernels::LaunchDistRows(dl.get(), rows, vocab, ds.get(), counts.get(), packed.get(),
                                    nullptr));
    const std::vector<int32_t> got_counts = counts.Download();
    const std::vector<uint32_t> words = packed.Download();
    size_t at = 0;
    for (int32_t r = 0; r < rows; ++r) {
      const kernels::TokenDraw& d = settings[static_cast<size_t>(r)];
      const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) +
                               " T " + std::to_string(d.temperature) + " k " +
                               std::to_string(d.top_k) + " p " + std::to_string(d.top_p);
      DeviceArray<float> one(std::vector<float>(logits.begin() + int64_t{r} * vocab,
                                                logits.begin() + int64_t{r + 1} * vocab));
      DeviceArray<float> probs(static_cast<size_t>(vocab));
      CUDA_OK(kernels::LaunchSamplingProbs(one.get(), 1, vocab, {d.temperature, d.top_k, d.top_p},
                                           probs.get(), nullptr));
      const std::vector<float> want = probs.Download();
      const auto kept = std::count_if(want.begin(), want.end(), [](float x) { return x != 0; });
      ASSERT_EQ(got_counts[static_cast<size_t>(r)], kept) << what;
      ASSERT_EQ(kernels::DistRowSparse(kept, vocab), DistRows::Sparse(kept, vocab)) << what;
      ASSERT_LE(at + kernels::DistRowWords(kept, vocab), words.size()) << what;
      // Unpacked the way the runner does, into the host's DistRows.
      DistRows host;
      host.Reset(vocab);
      if (kernels::DistRowSparse(kept, vocab)) {
        std::vector<float> p(static_cast<size_t>(kept));
        std::vector<int32_t> ids(static_cast<size_t>(kept));
        std::memcpy(p.data(), &words[at], p.size() * 4);
        std::memcpy(ids.data(), &words[at + p.size()], ids.size() * 4);
        ASSERT_TRUE(host.AddSparse(ids, p).ok()) << what;
        ++sparse;
      } else {
        std::vector<float> p(static_cast<size_t>(vocab));
        std::memcpy(p.data(), &words[at], p.size() * 4);
        host.AddDense(p);
        ++dense;
      }
      at += static_cast<size_t>(kernels::DistRowWords(kept, vocab));
      std::vector<float> expanded;
      host.Expand(0, expanded);
      EXPECT_EQ(expanded, want) << what;
    }
  }
  EXPECT_GT(sparse, 30);
  EXPECT_GT(dense, 30);
}

}  // namespace
}  // namespace specinfer
