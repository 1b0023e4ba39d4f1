// The matrix products the CPU runner computes for gemma-3-270m Q4_K_M's weight types (Q5_0 and
// Q8_0 with Q8_0 activations, both through their tiles; Q4_K and Q6_K with Q8_K activations), taken
// whole: CpuMatrix::Prepare, then MatMul / MatMulShared with a mix of types as the Q/K/V
// projections have, for 1, 5 and 19 tokens. Each output must equal, up to float32 rounding, the
// exact product of the dequantised weights with the activations quantised as llama.cpp's reference
// quantises them (quantize_row_q8_0_ref, quantize_row_q8_K_ref), written out here on their own.
// So the activation type paired with each weight type, its block size, scale and rounding are
// checked end to end; the checkpoint test cannot see such errors (activation quantisation noise
// there is several % of a logit: tests/model/gemma3_checkpoint_test.cc). The test also shows that
// its tolerance separates: float activations, and Q8 activations with a 1% scale error, miss it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/tiled_matrix.h"
#include "backend/cpu/type_ops.h"
#include "common/thread_pool.h"
#include "quant_random.h"
#include "tensor/half.h"

namespace specinfer {
namespace {

// llama.cpp's quantize_row_q8_0_ref, dequantised: d = amax / 127 (products use fp16(d)),
// q = roundf(x / d).
std::vector<double> Q8_0(const std::vector<float>& x) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
    const double dh = Fp16ToFp32(Fp32ToFp16(d));
    for (size_t i = b; i < b + 32; ++i) out[i] = std::roundf(x[i] * id) * dh;
  }
  return out;
}

// llama.cpp's quantize_row_q8_K_ref, dequantised: blocks of 256, iscale = -127 / (the signed
// value of largest magnitude), q = min(127, nearest_int(iscale * x)), d = 1 / iscale (float32).
std::vector<double> Q8_K(const std::vector<float>& x) {
  std::vector<double> out(x.size(), 0.0);
  for (size_t b = 0; b < x.size(); b += 256) {
    float amax = 0, max = 0;
    for (size_t i = b; i < b + 256; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        max = x[i];
      }
    }
    if (amax == 0) continue;
    const float iscale = -127.0f / max, d = 1.0f / iscale;
    for (size_t i = b; i < b + 256; ++i)
      out[i] = std::min(127.0f, std::nearbyint(iscale * x[i])) * static_cast<double>(d);
  }
  return out;
}

struct Matrix {
  DType type;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantised, [rows, cols]
  cpu::CpuMatrix prepared;
};

Matrix MakeMatrix(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  Matrix m{t, rows, cols, {}, {}, {}};
  const bool k_quant = GetDTypeTraits(t).block_size == 256;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t> row =
        k_quant ? testing::RandomKRow(t, cols, rng) : testing::RandomRow(t, cols, rng);
    m.bytes.insert(m.bytes.end(), row.begin(), row.end());
  }
  m.values.resize(static_cast<size_t>(rows * cols));
  const WeightMatrix w{t, rows, cols, m.bytes.data()};
  for (int64_t r = 0; r < rows; ++r)
    cpu::GetTypeOps(t)->to_float(w.row(r), m.values.data() + r * cols, cols);
  StatusOr<cpu::CpuMatrix> p = cpu::CpuMatrix::Prepare(w);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (p.ok()) m.prepared = std::move(p).value();
  return m;
}

// Checks y [n, rows] against the llama.cpp-style product; counts into `miss` how many outputs of
// the float activations' product and of a 1%-scale-error product would fail the same tolerance.
struct Misses {
  int64_t outputs = 0, float_acts = 0, scale_error = 0;
};
void Check(const Matrix& m, const std::vector<float>& x, int64_t n, const std::vector<float>& y,
           const std::string& what, Misses& miss) {
  const bool k_quant = m.type == DType::kQ4_K || m.type == DType::kQ6_K;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> xt(x.begin() + t * m.cols, x.begin() + (t + 1) * m.cols);
    const std::vector<double> xq = k_quant ? Q8_K(xt) : Q8_0(xt);
    for (int64_t r = 0; r < m.rows; ++r) {
      const float* w = m.values.data() + r * m.cols;
      double exact = 0, exact_float = 0, wmax = 0, xl1 = 0;
      for (int64_t c = 0; c < m.cols; ++c) {
        exact += w[c] * xq[c];
        exact_float += double(w[c]) * xt[c];
        wmax = std::max(wmax, std::fabs(double(w[c])));
        xl1 += std::fabs(xq[c]);
      }
      // The kernels sum exact integer block products in float32, a few roundings per block of
      // 16-32 columns, each at most 2^-24 of a partial sum bounded by max|w| * sum|x| (for
      // K-quants the scale and minimum terms separately; 4 covers them).
      const double tol = 4 * (m.cols / 16 + 16) * std::ldexp(1.0, -24) * wmax * xl1;
      const double got = y[t * m.rows + r];
      ASSERT_NEAR(got, exact, tol) << what << " " << DTypeName(m.type) << " token " << t
                                   << " row " << r;
      ++miss.outputs;
      miss.float_acts += std::fabs(got - exact_float) > tol;
      miss.scale_error += std::fabs(got - 1.01 * exact) > tol;  // activations' d 1% large
    }
  }
}

std::vector<float> Activations(int64_t n, int64_t cols, std::mt19937& rng) {
  std::vector<float> x;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> xt = testing::RandomActivations(cols, rng);
    x.insert(x.end(), xt.begin(), xt.end());
  }
  return x;
}

void ExpectSeparates(const Misses& m, const std::string& what) {
  // Float activations differ from the quantised ones by ~1e-4 of max|w| * sum|x|; a 1% scale
  // error by ~3e-4: most outputs must fall outside the tolerance, or the check sees nothing.
  // (Outputs near zero miss by little either way: about 10% for a 1% scale error.)
  std::printf("%s: outside the tolerance: float activations %lld of %lld, 1%% scale error %lld\n",
              what.c_str(), static_cast<long long>(m.float_acts), static_cast<long long>(m.outputs),
              static_cast<long long>(m.scale_error));
  EXPECT_GT(m.float_acts, m.outputs / 2) << what << ": the tolerance hides 8-bit quantisation";
  EXPECT_GT(m.scale_error, m.outputs * 3 / 4) << what << ": the tolerance hides a 1% scale error";
}

TEST(MatMulActivationQuant, GemmaWeightTypesAsLlamaCpp) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  std::vector<uint8_t> scratch;
  // Gemma 3 270m's shapes: dim 640 into Q5_0/Q8_0; 1024 and 2048 into Q4_K/Q6_K (37 rows: a
  // partly padded last tile).
  const std::vector<std::pair<DType, int64_t>> cases = {
      {DType::kQ5_0, 640}, {DType::kQ8_0, 640}, {DType::kQ4_K, 1024}, {DType::kQ6_K, 2048}};
  for (const auto& [type, cols] : cases) {
    Matrix m = MakeMatrix(type, 37, cols, rng);
    EXPECT_EQ(m.prepared.tiles != nullptr, cpu::TiledMatrix::Supports(type)) << DTypeName(type);
    Misses total;
    for (int64_t n : {1, 5, 19}) {
      for (bool invariant : {true, false}) {
        const std::vector<float> x = Activations(n, cols, rng);
        std::vector<float> y(static_cast<size_t>(n * m.rows));
        cpu::MatMul(m.prepared, x.data(), n, y.data(), pool, scratch, invariant);
        Check(m, x, n, y, "n=" + std::to_string(n), total);
        if (HasFatalFailure()) return;
      }
    }
    ExpectSeparates(total, std::string(DTypeName(type)));
  }
}

// The Q/K/V projections of a Gemma layer share one input: MatMulShared with Q5_0 and Q8_0
// (tiled) targets converts the activations per target type.
TEST(MatMulActivationQuant, SharedInputWithMixedTypes) {
  std::mt19937 rng(12);
  ThreadPool pool(2);
  std::vector<uint8_t> scratch;
  const int64_t cols = 640;
  Matrix q = MakeMatrix(DType::kQ5_0, 40, cols, rng), k = MakeMatrix(DType::kQ5_0, 21, cols, rng),
         v = MakeMatrix(DType::kQ8_0, 21, cols, rng);
  for (int64_t n : {1, 19}) {
    const std::vector<float> x = Activations(n, cols, rng);
    std::vector<float> yq(n * q.rows), yk(n * k.rows), yv(n * v.rows);
    const cpu::MatMulTarget targets[] = {
        {&q.prepared, yq.data()}, {&k.prepared, yk.data()}, {&v.prepared, yv.data()}};
    cpu::MatMulShared(std::span(targets), x.data(), n, pool, scratch, /*batch_invariant=*/true);
    for (const auto& [m, y] : {std::pair(&q, &yq), std::pair(&k, &yk), std::pair(&v, &yv)}) {
      Misses miss;
      Check(*m, x, n, *y, "shared, n=" + std::to_string(n), miss);
      if (HasFatalFailure()) return;
      ExpectSeparates(miss, std::string(DTypeName(m->type)));
    }
  }
}

}  // namespace
}  // namespace specinfer
