// RMSNorm kernel against the CPU reference, element by element, over awkward shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_device.h"

namespace specinfer {
namespace {

TEST(CudaRmsNorm, MatchesCpuReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  // 1000..16384 take the float4 kernel (1, 2 and 4 float4s a thread); 8193 and 16392 the generic.
  for (int n : {1, 31, 64, 576, 1000, 4096, 8192, 8193, 12288, 16384, 16392}) {
    for (int rows : {1, 3, 17}) {
      std::vector<float> x(static_cast<size_t>(rows) * n), w(n), got(x.size()), want(x.size());
      for (float& v : x) v = dist(rng);
      for (float& v : w) v = dist(rng);
      for (int r = 0; r < rows; ++r)
        cpu::RmsNorm(&x[static_cast<size_t>(r) * n], w.data(), &want[static_cast<size_t>(r) * n],
                     n, 1e-5f);
      ASSERT_TRUE(cuda::RmsNormOnDevice(x, w, got, rows, 1e-5f).ok());
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_LE(std::fabs(got[i] - want[i]), 1e-5f + 1e-5f * std::fabs(want[i]))
            << "n=" << n << " rows=" << rows << " at " << i;
    }
  }
}

// A row's bits do not depend on how many rows share the launch (decode vs tree verification).
TEST(CudaRmsNorm, RowIsBatchInvariant) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int n : {576, 4096, 8193}) {
    const int rows = 9;
    std::vector<float> x(static_cast<size_t>(rows) * n), w(n), all(x.size()), one(n);
    for (float& v : x) v = dist(rng);
    for (float& v : w) v = dist(rng);
    ASSERT_TRUE(cuda::RmsNormOnDevice(x, w, all, rows, 1e-6f).ok());
    for (int r = 0; r < rows; ++r) {
      const std::span<const float> row(&x[static_cast<size_t>(r) * n], n);
      ASSERT_TRUE(cuda::RmsNormOnDevice(row, w, one, 1, 1e-6f).ok());
      ASSERT_EQ(0, std::memcmp(one.data(), &all[static_cast<size_t>(r) * n], n * sizeof(float)))
          << "n=" << n << " row " << r;
    }
  }
}

}  // namespace
}  // namespace specinfer
