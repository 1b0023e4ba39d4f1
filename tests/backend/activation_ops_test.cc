// Softmax and SwiGlu (backend/cpu/ops.h), which use a polynomial exp where the CPU has AVX2:
// within a few float32 roundings of the exact (double) functions, and each element's value a
// function of its own inputs only, wherever it sits in the array (the masked tails), so a token's
// activations do not depend on how many tokens share the batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"

namespace specinfer {
namespace {

TEST(ActivationOps, SoftmaxIsCloseToExact) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (int64_t n : {1, 2, 7, 8, 9, 31, 288, 301}) {
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    x[n / 2] = -200.0f;  // far below the maximum: (close to) zero
    std::vector<double> want(n);
    double max = x[0], sum = 0;
    for (float v : x) max = std::max<double>(max, v);
    for (int64_t i = 0; i < n; ++i) sum += want[i] = std::exp(x[i] - max);
    std::vector<float> got = x;
    cpu::Softmax(got.data(), n);
    // x - max is rounded to float32 first: a relative error of |x - max| * 2^-24 in exp, plus a
    // few roundings.
    for (int64_t i = 0; i < n; ++i) {
      const double rel = (std::fabs(x[i] - max) + 8) * 6e-8;
      EXPECT_NEAR(got[i], want[i] / sum, rel * want[i] / sum + 1e-37) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ActivationOps, SwiGluIsCloseToExactAndIndependentOfPosition) {
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int64_t n = 203;
  std::vector<float> gate(n), up(n);
  for (int64_t i = 0; i < n; ++i) {
    gate[i] = dist(rng);
    up[i] = dist(rng);
  }
  gate[0] = 100.0f;
  gate[1] = -100.0f;
  std::vector<float> all = gate;
  cpu::SwiGlu(all.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(all[i], want, 4e-7 * std::fabs(want) + 1e-30) << i;
  }
  // Every suffix and prefix length: the same value for each element, bit for bit.
  for (int64_t begin : {1, 3, 8, 13}) {
    for (int64_t len : {1, 5, 8, 17, 64}) {
      std::vector<float> part(gate.begin() + begin, gate.begin() + begin + len);
      cpu::SwiGlu(part.data(), up.data() + begin, len);
      for (int64_t i = 0; i < len; ++i)
        EXPECT_EQ(std::memcmp(&part[i], &all[begin + i], 4), 0) << begin << "+" << i;
    }
  }
}

}  // namespace
}  // namespace specinfer
