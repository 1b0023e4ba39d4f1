#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <tuple>

#include "backend/cpu/simd.h"

namespace specinfer {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 0.5f, 2.5f}; }

TEST(Sampler, GreedyIsArgmaxAndOneHot) {
  SamplingParams p;
  p.temperature = 0;
  std::vector<float> probs;
  ComputeProbs(Logits(), p, probs);
  EXPECT_EQ(probs, (std::vector<float>{0, 1, 0, 0, 0}));
  Rng rng(1);
  EXPECT_EQ(SampleToken(Logits(), p, rng, probs), 1);
}

TEST(Sampler, TemperatureSoftmax) {
  SamplingParams p;
  p.temperature = 2.0f;
  std::vector<float> probs;
  auto l = Logits();
  ComputeProbs(l, p, probs);
  double z = 0;
  for (float v : l) z += std::exp(v / 2.0);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(probs[i], std::exp(l[i] / 2.0) / z, 1e-6);
}

TEST(Sampler, TopKKeepsTheKLargestRenormalised) {
  SamplingParams p;
  p.top_k = 2;
  std::vector<float> probs;
  ComputeProbs(Logits(), p, probs);
  double e3 = std::exp(3.0), e25 = std::exp(2.5);
  EXPECT_NEAR(probs[1], e3 / (e3 + e25), 1e-6);
  EXPECT_NEAR(probs[4], e25 / (e3 + e25), 1e-6);
  EXPECT_EQ(probs[0] + probs[2] + probs[3], 0.0f);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps the first two (0.8 >= 0.75).
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams p;
  p.top_p = 0.75f;
  std::vector<float> probs;
  ComputeProbs(l, p, probs);
  EXPECT_NEAR(probs[0], 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(probs[1], 0.3 / 0.8, 1e-6);
  EXPECT_EQ(probs[2], 0.0f);
  EXPECT_EQ(probs[3], 0.0f);
}

// ComputeProbs's contract written the plain way: the whole vocabulary sorted by probability (ties
// by index), top-k's prefix, then the shortest prefix of it whose mass (summed most likely first)
// reaches top_p of what top-k kept (of the total `sum` without top-k), renormalised.
std::vector<float> ReferenceProbs(std::span<const float> logits, const SamplingParams& params) {
  const size_t n = logits.size();
  const float max = *std::max_element(logits.begin(), logits.end());
  std::vector<float> e(n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    e[i] = std::exp((logits[i] - max) * (1.0f / params.temperature));
    sum += e[i];
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return e[a] != e[b] ? e[a] > e[b] : a < b; });
  const bool use_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < n;
  size_t keep = use_k ? params.top_k : n;
  double mass = sum;
  if (use_k) {
    mass = 0.0;
    for (size_t i = 0; i < keep; ++i) mass += e[order[i]];
  }
  if (params.top_p < 1.0f) {
    const double target = static_cast<double>(params.top_p) * mass;
    double acc = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      acc += e[order[i]];
      if (acc >= target) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += e[order[i]];
  std::vector<float> out(n, 0.0f);
  if (!use_k && params.top_p >= 1.0f) {
    const float inv = static_cast<float>(1.0 / sum);
    for (size_t i = 0; i < n; ++i) out[i] = e[i] * inv;
    return out;
  }
  for (size_t i = 0; i < keep; ++i) out[order[i]] = static_cast<float>(e[order[i]] * (1.0 / kept));
  return out;
}

// The kept set is found without sorting the whole vocabulary (a growing sorted prefix): it must
// be the full sort's, bit for bit, whatever the nucleus size — one token, a few, thousands, the
// whole vocabulary — and with ties (logits on a coarse grid) at the cut.
TEST(Sampler, TopKTopPEqualTheFullSortForEveryNucleusSize) {
  std::mt19937 gen(7);
  int rows = 0;
  size_t largest_kept = 0;
  for (int32_t vocab : {1, 2, 5, 63, 64, 65, 300, 4096, 49152}) {
    for (float scale : {0.01f, 0.5f, 2.0f, 8.0f, 40.0f}) {
      for (bool grid : {false, true}) {
        std::normal_distribution<float> normal(0.0f, scale);
        std::vector<float> logits(vocab);
        for (float& v : logits) v = grid ? std::round(normal(gen)) : normal(gen);
        for (auto [k, p, t] : {std::tuple{0, 0.9f, 1.0f},
                               {0, 0.5f, 0.7f},
                               {0, 0.999f, 1.0f},
                               {0, 1e-6f, 1.0f},
                               {50, 0.95f, 1.0f},
                               {1000, 0.8f, 1.3f},
                               {40, 1.0f, 0.8f},
                               {0, 1.0f, 1.0f}}) {
          SamplingParams params;
          params.top_k = k;
          params.top_p = p;
          params.temperature = t;
          std::vector<float> probs;
          ComputeProbs(logits, params, probs);
          const std::vector<float> want = ReferenceProbs(logits, params);
          ASSERT_EQ(probs, want) << "vocab " << vocab << " scale " << scale << " grid " << grid
                                 << " top_k " << k << " top_p " << p << " T " << t;
          largest_kept = std::max<size_t>(
              largest_kept,
              std::count_if(probs.begin(), probs.end(), [](float x) { return x > 0; }));
          ++rows;
        }
      }
    }
  }
  EXPECT_EQ(rows, 9 * 5 * 2 * 8);
  EXPECT_GT(largest_kept, 20000u);  // some nuclei needed most of the 49k vocabulary
}

TEST(Sampler, SeededDrawsAreRepeatable) {
  SamplingParams p;
  p.seed = 42;
  std::vector<float> probs;
  Rng a(7), b(7);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(SampleToken(Logits(), p, a, probs), SampleToken(Logits(), p, b, probs));
}

// Draw 200k samples and check each frequency against its probability with a 5-sigma bound.
TEST(Sampler, DrawFrequenciesMatchTheDistribution) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 4;
  std::vector<float> probs;
  auto l = Logits();
  ComputeProbs(l, p, probs);
  const int kDraws = 200000;
  std::vector<int> counts(l.size(), 0);
  Rng rng(123);
  for (int i = 0; i < kDraws; ++i) ++counts[SampleFromProbs(probs, rng)];
  for (size_t i = 0; i < l.size(); ++i) {
    double expect = probs[i] * kDraws;
    double sigma = std::sqrt(kDraws * probs[i] * (1 - probs[i]));
    EXPECT_NEAR(counts[i], expect, 5 * sigma + 1e-9) << "token " << i;
  }
}

TEST(Sampler, ValidateRejectsOutOfRange) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_EQ(p.Validate().code(), StatusCode::kInvalidArgument);
  p = {};
  p.temperature = NAN;
  EXPECT_FALSE(p.Validate().ok());
  p = {};
  p.top_p = 0;
  EXPECT_FALSE(p.Validate().ok());
  p = {};
  p.top_p = 1.5f;
  EXPECT_FALSE(p.Validate().ok());
  p = {};
  p.top_k = -3;
  EXPECT_FALSE(p.Validate().ok());
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
}

// Argmax's contract, written out: the first index whose value no other beats; NaNs never win
// unless at index 0 (nothing compares greater than it).
int32_t ReferenceArgmax(const std::vector<float>& x) {
  int32_t best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

// Rows a greedy verifier meets and the ones that trip vector code: ties (the first must win),
// the maximum in the scalar tail or the first lane, -0 against +0, infinities, NaNs.
std::vector<std::vector<float>> ArgmaxCases() {
  std::vector<std::vector<float>> rows;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (size_t n : {1, 2, 7, 8, 15, 16, 17, 31, 64, 100, 1000, 49152, 49155}) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(gen);
    rows.push_back(x);
    auto tie = x;  // the maximum twice: the lower index must win
    const size_t top = static_cast<size_t>(ReferenceArgmax(tie));
    tie[n - 1] = tie[top];
    rows.push_back(tie);
    auto tail = x;  // the maximum in the last (scalar) positions
    tail[n - 1] = 100.0f;
    rows.push_back(tail);
    auto flat = std::vector<float>(n, -1.5f);  // all equal: index 0
    rows.push_back(flat);
    auto zeros = std::vector<float>(n, -3.0f);  // -0 then +0: equal, the first wins
    zeros[n / 2] = -0.0f;
    zeros[n - 1] = 0.0f;
    rows.push_back(zeros);
    auto inf = x;
    inf[n / 3] = std::numeric_limits<float>::infinity();
    rows.push_back(inf);
    auto ninf = std::vector<float>(n, -std::numeric_limits<float>::infinity());
    rows.push_back(ninf);
    auto nan = x;  // a NaN in the middle is skipped
    nan[n / 2] = std::numeric_limits<float>::quiet_NaN();
    rows.push_back(nan);
    auto nan0 = x;  // a NaN at index 0 wins
    nan0[0] = std::numeric_limits<float>::quiet_NaN();
    rows.push_back(nan0);
  }
  return rows;
}

TEST(Sampler, ArgmaxKernelsAgreeWithTheContract) {
  const bool avx2 = cpu::GetCpuFeatures().use_avx2_kernels;
  int checked = 0;
  for (const auto& x : ArgmaxCases()) {
    const int32_t want = ReferenceArgmax(x);
    EXPECT_EQ(ArgmaxPortable(x), want) << "n " << x.size();
    EXPECT_EQ(Argmax(x), want) << "n " << x.size();
    if (avx2) {
      EXPECT_EQ(ArgmaxAvx2(x), want) << "n " << x.size();
    }
    ++checked;
  }
  EXPECT_GT(checked, 100);
  if (!avx2) GTEST_SKIP() << "no AVX2 here (or SPECINFER_NO_AVX2): the AVX2 kernel was not run";
}

}  // namespace
}  // namespace specinfer
