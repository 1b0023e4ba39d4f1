// Activation quantisation (from_float to Q8_0 / Q8_1): the AVX2 kernels are bit-identical to the
// scalar ones on hostile inputs, the scale is fp16(amax / 127), Q8_1's s is fp16(d * sum q), and
// the round trip x -> q -> d * q is within half a quantisation step (plus the fp16 rounding of
// d) of x.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/quants.h"
#include "quant_random.h"
#include "quant_vectors.h"

namespace specinfer {
namespace {

using testing::AvailableIsas;
using testing::IsaName;

const DType kActTypes[] = {DType::kQ8_0, DType::kQ8_1};

// Inputs meant to trip up vector code: zeros, ties, tiny/huge/subnormal values, single spikes.
// With `beyond_fp16`, also blocks whose scale amax/127 overflows fp16 (d becomes inf: the format
// cannot represent them, but both kernel sets must still agree).
std::vector<float> HostileInput(int64_t n, std::mt19937& rng, bool beyond_fp16 = false) {
  std::vector<float> x = testing::RandomActivations(n, rng);
  std::uniform_int_distribution<int> kind(0, 7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t b = 0; b < n / 32; ++b) {
    float* p = x.data() + b * 32;
    switch (kind(rng)) {
      case 0:
        std::fill(p, p + 32, 0.0f);
        break;
      case 1:  // amax 127: d = 1, so k + 0.5 values are exact ties
        for (int j = 0; j < 32; ++j) p[j] = std::floor(normal(rng) * 40.0f) + 0.5f;
        p[5] = -127.0f;
        break;
      case 2:
        for (int j = 0; j < 32; ++j) p[j] = normal(rng) * 1e-40f;  // subnormal floats
        break;
      case 3:
        for (int j = 0; j < 32; ++j) p[j] = normal(rng) * (beyond_fp16 ? 1e30f : 1e6f);
        break;
      case 4:
        std::fill(p, p + 32, 0.0f);
        p[31] = -1e-3f;
        break;
      case 5:
        for (int j = 0; j < 32; ++j) p[j] = (j % 2 ? -1.0f : 1.0f) * 0.75f;
        break;
      default:
        break;  // keep the Gaussian block
    }
  }
  return x;
}

TEST(FromFloatTest, Avx2IsBitIdenticalToScalar) {
  const std::vector<cpu::KernelIsa> isas = AvailableIsas();
  if (isas.size() < 2) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(7);
  for (DType t : kActTypes) {
    for (int64_t n : {32, 64, 576, 1536, 4096}) {
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> x = HostileInput(n, rng, /*beyond_fp16=*/true);
        std::vector<uint8_t> a(RowBytes(t, n), 0x11), b(RowBytes(t, n), 0x22);
        cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kScalar)->from_float(x.data(), a.data(), n);
        cpu::GetTypeOpsForIsa(t, cpu::KernelIsa::kAvx2)->from_float(x.data(), b.data(), n);
        const size_t bb = GetDTypeTraits(t).block_bytes;
        for (size_t blk = 0; blk < a.size() / bb; ++blk) {
          ASSERT_EQ(std::memcmp(a.data() + blk * bb, b.data() + blk * bb, bb), 0)
              << DTypeName(t) << " n=" << n << " rep " << rep << ": block " << blk
              << " differs (first input " << x[blk * 32] << ")";
        }
      }
    }
  }
}

TEST(FromFloatTest, RoundTripWithinHalfAStep) {
  std::mt19937 rng(11);
  for (cpu::KernelIsa isa : AvailableIsas()) {
    for (DType t : kActTypes) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      for (int64_t n : {32, 160, 576, 4096}) {
        SCOPED_TRACE(std::string(DTypeName(t)) + " " + IsaName(isa) + " n=" + std::to_string(n));
        const std::vector<float> x = HostileInput(n, rng);
        std::vector<uint8_t> q(RowBytes(t, n));
        ops->from_float(x.data(), q.data(), n);
        std::vector<float> back(n);
        ops->to_float(q.data(), back.data(), n);
        const size_t bb = GetDTypeTraits(t).block_bytes;
        for (int64_t b = 0; b < n / 32; ++b) {
          const uint8_t* blk = q.data() + b * bb;
          float amax = 0;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
          const float d = amax / 127.0f;
          const float d16 = testing::GetHalf(blk);
          ASSERT_EQ(Fp32ToFp16(d), Fp32ToFp16(d16)) << "block " << b;
          // |x - q d| <= d/2 (+ rounding of x / d); |q d - q d16| <= 127 |d - d16|.
          const double bound = d * (0.5 + 1e-5) + 127.0 * std::fabs(static_cast<double>(d) - d16);
          const int8_t* qs = reinterpret_cast<const int8_t*>(blk + bb - 32);
          int sum = 0;
          for (int j = 0; j < 32; ++j) {
            const float xi = x[b * 32 + j];
            ASSERT_LE(std::fabs(static_cast<double>(back[b * 32 + j]) - xi), bound)
                << "block " << b << " element " << j << ": x=" << xi << " d=" << d;
            ASSERT_GE(qs[j], -127);
            sum += qs[j];
          }
          if (amax == 0) {
            for (int j = 0; j < 32; ++j) ASSERT_EQ(qs[j], 0);
          }
          if (t == DType::kQ8_1) {
            // s = fp16(d * sum q), d as computed in float (not the fp16-rounded one).
            ASSERT_EQ(Fp32ToFp16(testing::GetHalf(blk + 2)),
                      Fp32ToFp16(d * static_cast<float>(sum)))
                << "block " << b;
          }
        }
      }
    }
  }
}

TEST(FromFloatTest, NonFiniteInputsStayContained) {
  // A NaN or inf in one block must not disturb the other blocks, and must not crash.
  for (cpu::KernelIsa isa : AvailableIsas()) {
    for (DType t : kActTypes) {
      std::vector<float> x(96, 1.0f);
      x[3] = std::numeric_limits<float>::quiet_NaN();
      x[40] = std::numeric_limits<float>::infinity();
      std::vector<uint8_t> q(RowBytes(t, 96));
      cpu::GetTypeOpsForIsa(t, isa)->from_float(x.data(), q.data(), 96);
      std::vector<float> back(96);
      cpu::GetTypeOpsForIsa(t, isa)->to_float(q.data(), back.data(), 96);
      for (int j = 64; j < 96; ++j) EXPECT_NEAR(back[j], 1.0f, 1e-3f) << IsaName(isa);
      for (int j = 0; j < 32; ++j) {
        if (j != 3) {
          EXPECT_NEAR(back[j], 1.0f, 0.01f) << IsaName(isa);
        }
      }
    }
  }
}

}  // namespace
}  // namespace specinfer
