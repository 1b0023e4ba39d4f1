// End-to-end generation on stories260K against llama2.c's published test vector and against the
// independent numpy reference (tests/reference/llama2c_reference.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "engine/engine.h"
#include "test_util.h"

namespace specinfer {
namespace {

std::unique_ptr<Engine> MakeEngine(int threads = 2) {
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = threads;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::string DecodeContinuation(const Tokenizer& tok, int32_t prev,
                               const std::vector<int32_t>& ids) {
  Utf8StreamDecoder d;
  std::string out;
  for (int32_t id : ids) {
    out += d.Push(tok.TokenBytes(prev, id));
    prev = id;
  }
  return out + d.Flush();
}

// llama2.c's published vector: BOS alone, greedy, 200 sampled tokens (llama2.c's "-n 200" runs
// positions 0..199 and prints the token chosen at each, so 200 tokens follow BOS).
TEST(Generation, MatchesLlama2cPublishedGreedyVector) {
  for (int threads : {1, 2}) {
    auto engine = MakeEngine(threads);
    ASSERT_TRUE(engine);
    GenerateRequest req;
    req.prompt_tokens = *engine->EncodePrompt("");
    req.max_new_tokens = 200;
    req.sampling.temperature = 0;
    req.stop_tokens = engine->default_stop_tokens();
    auto r = engine->Generate(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto expected =
        ReadFileToString(testing::SourcePath("tests/data/stories260K/expected_greedy_200.txt"));
    ASSERT_TRUE(expected.ok());
    EXPECT_EQ(DecodeContinuation(engine->tokenizer(), req.prompt_tokens.back(), r->tokens),
              *expected)
        << "threads=" << threads;
  }
}

TEST(Generation, MatchesIndependentReferenceOnSeveralPrompts) {
  auto json_text =
      ReadFileToString(testing::SourcePath("tests/data/stories260K/reference_greedy.json"));
  ASSERT_TRUE(json_text.ok());
  auto ref = nlohmann::json::parse(*json_text);
  auto engine = MakeEngine();
  ASSERT_TRUE(engine);
  ASSERT_GE(ref["cases"].size(), 8u);
  for (const auto& c : ref["cases"]) {
    const std::string prompt = c["prompt"];
    SCOPED_TRACE("prompt: " + prompt);
    auto ids = engine->EncodePrompt(prompt);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["prompt_tokens"].get<std::vector<int32_t>>());

    // Logits of the first step within float tolerance of the reference.
    {
      std::vector<float> logits = testing::PromptLogits(
          engine->runner(), engine->kv(), *ids, {static_cast<int32_t>(ids->size()) - 1});
      auto want = c["first_logits"].get<std::vector<float>>();
      ASSERT_EQ(want.size(), logits.size());
      float max_err = 0;
      for (size_t i = 0; i < want.size(); ++i)
        max_err = std::max(max_err, std::fabs(want[i] - logits[i]));
      EXPECT_LT(max_err, 1e-4f);
    }

    GenerateRequest req;
    req.prompt_tokens = *ids;
    req.max_new_tokens = c["max_new_tokens"];
    req.sampling.temperature = 0;
    req.stop_tokens = engine->default_stop_tokens();
    auto r = engine->Generate(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->tokens, c["generated_tokens"].get<std::vector<int32_t>>());
    EXPECT_EQ(DecodeContinuation(engine->tokenizer(), ids->back(), r->tokens),
              c["text"].get<std::string>());
  }
}

TEST(Generation, SeededSamplingIsRepeatableAndSeedsDiffer) {
  auto engine = MakeEngine();
  ASSERT_TRUE(engine);
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  req.max_new_tokens = 40;
  req.sampling.temperature = 1.0f;
  req.sampling.top_p = 0.9f;
  req.sampling.seed = 1234;
  auto a = engine->Generate(req);
  auto b = engine->Generate(req);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  req.sampling.seed = 99;
  auto c = engine->Generate(req);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->tokens, c->tokens);
}

TEST(Generation, StopsOnStopTokenAndReportsIt) {
  auto engine = MakeEngine();
  ASSERT_TRUE(engine);
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  req.max_new_tokens = 50;
  req.sampling.temperature = 0;
  auto full = engine->Generate(req);
  ASSERT_TRUE(full.ok());
  ASSERT_GT(full->tokens.size(), 5u);
  req.stop_tokens = {full->tokens[4]};  // the 5th greedy token becomes a stop token
  auto r = engine->Generate(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
  auto first = std::find(full->tokens.begin(), full->tokens.end(), full->tokens[4]);
  EXPECT_EQ(r->tokens, std::vector<int32_t>(full->tokens.begin(), first + 1));
}

TEST(Generation, PromptLongerThanContextIsOutOfRange) {
  auto engine = MakeEngine();
  ASSERT_TRUE(engine);
  GenerateRequest req;
  req.prompt_tokens.assign(engine->context_length() + 1, 300);
  auto r = engine->Generate(req);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(engine->kv().used_blocks(), 0);  // nothing left held
  // Generation near the end of the context is clamped, not an error.
  req.prompt_tokens.assign(engine->context_length() - 3, 300);
  req.max_new_tokens = 100;
  req.sampling.temperature = 0;
  auto ok = engine->Generate(req);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->tokens.size(), 4u);
  EXPECT_EQ(ok->finish_reason, FinishReason::kLength);
}

TEST(Generation, CallbackCanCancel) {
  auto engine = MakeEngine();
  ASSERT_TRUE(engine);
  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Once");
  req.max_new_tokens = 100;
  int seen = 0;
  auto r = engine->Generate(req, [&](int32_t, std::span<const float>) { return ++seen < 3; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens.size(), 3u);
  EXPECT_EQ(r->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(engine->kv().used_blocks(), 0);
}

}  // namespace
}  // namespace specinfer
