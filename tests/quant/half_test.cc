// fp16 / bf16 <-> fp32 scalar conversions (tensor/half.h): exhaustive over the 16-bit side,
// against an arithmetic (ldexp) definition, and against the CPU's F16C instructions when present.
#include "tensor/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "backend/cpu/simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

namespace specinfer {
namespace {

// fp16 value by its definition, in double.
double Fp16Definition(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v;
  if (exp == 0) {
    v = std::ldexp(man, -24);
  } else if (exp == 31) {
    v = man ? std::nan("") : INFINITY;
  } else {
    v = std::ldexp(1024 + man, exp - 25);
  }
  return sign ? -v : v;
}

TEST(HalfTest, Fp16ToFp32IsExactForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = Fp16ToFp32(static_cast<uint16_t>(h));
    const double want = Fp16Definition(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(HalfTest, Fp16RoundTripsThroughFp32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = Fp32ToFp16(Fp16ToFp32(static_cast<uint16_t>(h)));
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) {
      ASSERT_EQ(back & 0x7E00, 0x7E00) << "NaN " << h << " must stay a (quiet) NaN";
    } else {
      ASSERT_EQ(back, h);
    }
  }
}

TEST(HalfTest, Fp32ToFp16RoundsToNearestEven) {
  struct {
    float in;
    uint16_t out;
  } cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3C00},
      {65504.0f, 0x7BFF},
      {65519.99f, 0x7BFF},
      {65520.0f, 0x7C00},
      {1e10f, 0x7C00},
      {-INFINITY, 0xFC00},
      {0x1p-24f, 0x0001},
      {0x1p-25f, 0x0000},
      {0x1.000002p-25f, 0x0001},  // just above the tie
      {0x3p-25f, 0x0002},
      {0x5p-25f, 0x0002},
      {0x1p-14f, 0x0400},
      {0x1.ffcp-15f, 0x0400},  // rounds up into the smallest normal
      {1.0f + 0x1p-11f, 0x3C00},
      {1.0f + 0x3p-11f, 0x3C02},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Fp32ToFp16(c.in), c.out) << c.in;
  }
}

TEST(HalfTest, Bf16Conversions) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Bf16ToFp32(static_cast<uint16_t>(b));
    ASSERT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(Fp32ToBf16(f), b);
    }
  }
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie -> even
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x7F800001u)) & 0x7FC0, 0x7FC0);  // quiet NaN
  EXPECT_EQ(Fp32ToBf16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);           // rounds to inf
}

#if defined(HAVE_X86)
__attribute__((target("f16c"))) uint16_t F16cConvert(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) float F16cWiden(uint16_t h) { return _cvtsh_ss(h); }

TEST(HalfTest, MatchesF16cInstructions) {
  if (!cpu::GetCpuFeatures().f16c) GTEST_SKIP() << "CPU has no F16C";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = Fp16ToFp32(static_cast<uint16_t>(h)), b = F16cWiden(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(a));
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b)) << h;
    }
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<uint32_t> near_range(0x33000000u - 4096, 0x47800000u + 4096);
  for (int i = 0; i < 2000000; ++i) {
    // Half the samples anywhere, half where fp16 has something to round to.
    uint32_t u = (i & 1) ? bits(rng) : (near_range(rng) | (bits(rng) & 0x80000000u));
    const float f = std::bit_cast<float>(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(Fp32ToFp16(f), F16cConvert(f)) << std::hex << "0x" << u;
  }
}
#endif

}  // namespace
}  // namespace specinfer
