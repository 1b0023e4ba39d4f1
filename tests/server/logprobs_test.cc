// Logprobs: log_softmax of raw logits. (That the generator hands each token its own logits row is
// tested in tests/engine/generation_test.cc.)
#include "server/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>


namespace specinfer {
namespace {

TEST(LogprobsFromLogits, LogSoftmaxAndTopN) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  TokenLogprob lp = LogprobsFromLogits(logits, 2, 3);
  EXPECT_EQ(lp.token, 2);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // ties: lower id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 2);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    total += std::exp(LogprobsFromLogits(logits, i, 0).logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_TRUE(LogprobsFromLogits(logits, 0, 0).top.empty());
  EXPECT_EQ(LogprobsFromLogits(logits, 0, 99).top.size(), 4u);  // capped at the vocabulary
}

TEST(LogprobsFromLogits, LargeLogitsDoNotOverflow) {
  const std::vector<float> logits = {1000.0f, 999.0f, -1000.0f};
  TokenLogprob lp = LogprobsFromLogits(logits, 0, 1);
  EXPECT_TRUE(std::isfinite(lp.logprob));
  EXPECT_NEAR(lp.logprob, -std::log(1 + std::exp(-1.0)), 1e-5);
}

}  // namespace
}  // namespace specinfer
