// RMSNorm kernel against the CPU reference, element by element, over awkward shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_device.h"

namespace specinfer {
namespace {

TEST(CudaRmsNorm, MatchesCpuReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int n : {1, 31, 64, 576, 1000, 4096, 8193}) {
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

}  // namespace
}  // namespace specinfer
