// Logprobs: log_softmax of raw logits, and the teacher-forced pass that recomputes the logits a
// generation was sampled from.
#include "server/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>

#include "server_test_util.h"

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

// The teacher-forced pass must reproduce, per generated token, the logits of decoding
// prompt + generated[0..i) from scratch -- for greedy and for sampled generations, and across
// the pass's row chunks (more than 32 generated tokens) and a multi-chunk prompt prefill.
TEST(TeacherForcedLogprobs, EqualsTheLogitsOfEachPrefix) {
  auto engine = testing::Stories260KEngine();
  ASSERT_TRUE(engine);
  for (float temperature : {0.0f, 1.0f}) {
    GenerateRequest req;
    req.prompt_tokens = *engine->EncodePrompt("Once upon a time, there was a big dog");
    req.max_new_tokens = 40;
    req.sampling.temperature = temperature;
    req.sampling.seed = 3;
    req.prefill_chunk = 4;  // several prefill chunks
    auto r = engine->Generate(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->tokens.size(), 40u);
    auto scored = TeacherForcedLogprobs(engine->runner(), engine->kv(), req.prompt_tokens,
                                        r->tokens, 5, req.prefill_chunk);
    ASSERT_TRUE(scored.ok()) << scored.status().ToString();
    ASSERT_EQ(scored->size(), r->tokens.size());
    EXPECT_EQ(engine->kv().used_blocks(), 0);  // its sequence is gone

    const int32_t vocab = engine->model().config().vocab_size;
    std::vector<int32_t> prefix = req.prompt_tokens;
    for (size_t i = 0; i < r->tokens.size(); ++i) {
      const int32_t last = static_cast<int32_t>(prefix.size()) - 1;
      const std::vector<float> logits =
          testing::PromptLogits(engine->runner(), engine->kv(), prefix, {last});
      ASSERT_EQ(logits.size(), static_cast<size_t>(vocab));
      const TokenLogprob want = LogprobsFromLogits(logits, r->tokens[i], 5);
      const TokenLogprob& got = (*scored)[i];
      EXPECT_EQ(got.token, r->tokens[i]);
      // The prompt's KV comes from the (possibly BLAS) prefill path in one and the
      // batch-invariant path in the other: equal up to float rounding.
      EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "T=" << temperature << " token " << i;
      ASSERT_EQ(got.top.size(), 5u);
      for (size_t k = 0; k < 5; ++k)
        EXPECT_NEAR(got.top[k].second, want.top[k].second, 1e-4) << i << "/" << k;
      EXPECT_EQ(got.top[0].first, want.top[0].first) << i;
      if (temperature == 0) {
        EXPECT_EQ(got.top[0].first, r->tokens[i]) << "greedy picks the argmax";
      }
      prefix.push_back(r->tokens[i]);
    }
    EXPECT_EQ(engine->kv().used_blocks(), 0);
  }
}

TEST(TeacherForcedLogprobs, EmptyGenerationAndBadInput) {
  auto engine = testing::Stories260KEngine();
  ASSERT_TRUE(engine);
  std::vector<int32_t> prompt = {1, 400};
  auto none = TeacherForcedLogprobs(engine->runner(), engine->kv(), prompt, {}, 2, 512);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  std::vector<int32_t> gen = {5};
  EXPECT_FALSE(TeacherForcedLogprobs(engine->runner(), engine->kv(), {}, gen, 2, 512).ok());
  EXPECT_FALSE(TeacherForcedLogprobs(engine->runner(), engine->kv(), prompt, gen, 2, 0).ok());
  auto one = TeacherForcedLogprobs(engine->runner(), engine->kv(), prompt, gen, 0, 512);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_LT(one->front().logprob, 0.0f);
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

}  // namespace
}  // namespace specinfer
