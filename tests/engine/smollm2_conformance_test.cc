// SmolLM2-135M-Instruct (Q4_1 GGUF) against llama.cpp, an independent implementation
// (tests/reference/make_llamacpp_vectors.py, via llama-cpp-python): the same prompt ids, last
// prompt position logits within quantisation noise, and the same greedy continuation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "engine/engine.h"
#include "test_util.h"

namespace specinfer {
namespace {

using testing::DecodeBase64Floats;

std::string ModelPath() { return testing::DefaultModel(); }

class SmolLM2Conformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (ModelPath().empty()) return;
    EngineOptions o;
    o.model_path = ModelPath();
    o.num_threads = 2;
    o.context_length = 1024;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value().release();
    auto text = ReadFileToString(testing::SourcePath("tests/data/smollm2/reference_llamacpp.json"));
    ASSERT_TRUE(text.ok());
    ref_ = new nlohmann::json(nlohmann::json::parse(*text));
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete ref_;
    engine_ = nullptr;
    ref_ = nullptr;
  }
  void SetUp() override {
    if (ModelPath().empty()) GTEST_SKIP() << "default model absent (scripts/fetch_model.sh)";
  }

  static Engine* engine_;
  static nlohmann::json* ref_;
};
Engine* SmolLM2Conformance::engine_ = nullptr;
nlohmann::json* SmolLM2Conformance::ref_ = nullptr;

TEST_F(SmolLM2Conformance, PromptIdsEqualLlamaCpp) {
  for (const auto& c : (*ref_)["cases"]) {
    auto ids = engine_->tokenizer().Encode(c["prompt"].get<std::string>(), false,
                                           c["parse_special"].get<bool>());
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["prompt_tokens"].get<std::vector<int32_t>>()) << c["name"];
  }
}

// Both implementations re-quantise activations to Q8 blocks before every Q4_1/Q8_0 product, so a
// tiny float difference anywhere (a SiLU or exp approximation, a summation order) flips some
// roundings and propagates: these logits are not reproducible to float precision. The yardstick
// is llama.cpp against itself: switching its KV cache from f32 to f16 moves them by up to 1.01
// (kv_f16_check in the JSON). A real error (wrong RoPE base, norm, head layout) moves them by
// several units and changes the argmax; the test demands the argmax, a spread of the differences
// (after their mean, which softmax ignores) under 0.25, and no difference above 1.25.
TEST_F(SmolLM2Conformance, LastPromptLogitsWithinQuantisationNoise) {
  const int32_t vocab = engine_->model().config().vocab_size;
  for (const auto& c : (*ref_)["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<int32_t> prompt = c["prompt_tokens"];
    std::vector<float> logits = testing::PromptLogits(
        engine_->runner(), engine_->kv(), prompt, {static_cast<int32_t>(prompt.size()) - 1});
    ASSERT_EQ(logits.size(), static_cast<size_t>(vocab));

    std::vector<float> want = DecodeBase64Floats(c["last_logits_b64"].get<std::string>());
    ASSERT_EQ(want.size(), logits.size());
    double max_err = 0, sum_err = 0, signed_sum = 0, sq = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      double d = static_cast<double>(logits[i]) - want[i];
      double e = std::fabs(d);
      max_err = std::max(max_err, e);
      sum_err += e;
      signed_sum += d;
      sq += d * d;
    }
    double mean_d = signed_sum / vocab;

    std::printf("[ %-8s ] logits vs llama.cpp: max |diff| %.3f, mean |diff| %.3f, spread %.3f\n",
                c["name"].get<std::string>().c_str(), max_err, sum_err / vocab,
                std::sqrt(sq / vocab - mean_d * mean_d));
    EXPECT_LT(max_err, 1.25);
    EXPECT_LT(std::sqrt(sq / vocab - mean_d * mean_d), 0.25);
    EXPECT_EQ(Argmax(logits), Argmax(want));
  }
}

// Teacher-forced greedy check: llama.cpp's own 64-token greedy continuation is fed after the
// prompt in one pass, and at every step where llama.cpp's top-1 logit led its top-2 by more than
// 0.5 our argmax must be the same token. (Free-running continuations are not compared token for
// token: where the margin is a few hundredths, quantisation noise legitimately flips the choice
// and the texts then part; llama.cpp with an f16 instead of f32 KV cache parts from itself on
// three of these six prompts.) The free-running agreement is printed for the record.
TEST_F(SmolLM2Conformance, GreedyStepsAgreeWithLlamaCppWhereTheChoiceIsClear) {
  const int32_t vocab = engine_->model().config().vocab_size;
  int clear_steps = 0;
  for (const auto& c : (*ref_)["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<int32_t> prompt = c["prompt_tokens"];
    std::vector<int32_t> greedy = c["greedy_tokens"];
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), greedy.begin(), greedy.end() - 1);
    std::vector<int32_t> rows;
    for (size_t k = 0; k < greedy.size(); ++k)
      rows.push_back(static_cast<int32_t>(prompt.size() + k) - 1);
    std::vector<float> logits = testing::PromptLogits(engine_->runner(), engine_->kv(), seq, rows);
    ASSERT_EQ(logits.size(), greedy.size() * vocab);
    int agree = 0;
    for (size_t k = 0; k < greedy.size(); ++k) {
      const int32_t ours =
          Argmax(std::span<const float>(logits).subspan(k * vocab, static_cast<size_t>(vocab)));
      const double margin = c["greedy_steps"][k]["margin"];
      if (ours == greedy[k]) ++agree;
      if (margin > 0.5) {
        ++clear_steps;
        EXPECT_EQ(ours, greedy[k]) << "step " << k << " (llama.cpp margin " << margin << ")";
      }
    }

    GenerateRequest req;
    req.prompt_tokens = prompt;
    req.max_new_tokens = static_cast<int32_t>(greedy.size());
    req.sampling.temperature = 0;
    auto r = engine_->Generate(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    size_t same = 0;
    while (same < greedy.size() && r->tokens[same] == greedy[same]) ++same;
    std::printf("[ %-8s ] teacher-forced argmax equal at %d of %zu steps; free-running greedy "
                "equal for the first %zu tokens\n",
                c["name"].get<std::string>().c_str(), agree, greedy.size(), same);
  }
  EXPECT_GT(clear_steps, 200);  // the check covers most steps
}

}  // namespace
}  // namespace specinfer
