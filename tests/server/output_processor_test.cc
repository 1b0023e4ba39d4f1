// The output processor (server/output_processor.h) on its own, on stories260K: what a sequence's
// tokens and end become on its ResponseStream, and what the metrics count.
#include "server/output_processor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server_test_util.h"

namespace specinfer {
namespace {

using namespace std::chrono_literals;

class OutputProcessorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testing::Stories260KEngine();
    ASSERT_TRUE(engine_);
    job_.index = 3;
    job_.generate.prompt_tokens = *engine_->EncodePrompt("Once upon a time");
    job_.generate.max_new_tokens = 24;
    job_.generate.sampling.temperature = 0;
    auto r = engine_->Generate(job_.generate);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    result_ = *r;
    ASSERT_FALSE(result_.tokens.empty());
    logits_.assign(static_cast<size_t>(engine_->model().config().vocab_size), 0.0f);
  }

  std::vector<StreamEvent> Drain(ResponseStream& s) {
    std::vector<StreamEvent> out;
    while (auto e = s.Next(0ms)) out.push_back(std::move(*e));
    return out;
  }

  std::unique_ptr<Engine> engine_;
  ServerMetrics metrics_;
  SequenceJob job_;
  GenerateResult result_;
  std::vector<float> logits_;
};

TEST_F(OutputProcessorTest, OneDeltaPerTokenThenOneFinalEventWithUsage) {
  job_.top_logprobs = 2;
  OutputProcessor processor(engine_->tokenizer(), metrics_);
  auto stream = std::make_shared<ResponseStream>(1);
  auto out = processor.Open(stream, job_, /*speculative=*/false);
  for (int32_t t : result_.tokens) EXPECT_TRUE(out->OnToken(t, logits_));
  out->OnDone(result_);

  const std::vector<StreamEvent> events = Drain(*stream);
  ASSERT_EQ(events.size(), result_.tokens.size() + 1);
  CompletionText want(engine_->tokenizer(), job_.generate.prompt_tokens.back(), {}, {});
  std::string text, want_text;
  for (size_t i = 0; i < result_.tokens.size(); ++i) {
    EXPECT_EQ(events[i].type, StreamEvent::Type::kDelta);
    EXPECT_EQ(events[i].index, 3);
    EXPECT_EQ(events[i].tokens, std::vector<int32_t>{result_.tokens[i]});
    ASSERT_EQ(events[i].logprobs.size(), 1u);
    EXPECT_EQ(events[i].logprobs[0].top.size(), 2u);
    text += events[i].text;
    want_text += want.Push(result_.tokens[i]);
  }
  const StreamEvent& done = events.back();
  EXPECT_EQ(done.type, StreamEvent::Type::kFinished);
  EXPECT_EQ(done.finish_reason, result_.finish_reason);
  EXPECT_EQ(done.prompt_tokens, static_cast<int32_t>(job_.generate.prompt_tokens.size()));
  EXPECT_EQ(done.completion_tokens, static_cast<int32_t>(result_.tokens.size()));
  EXPECT_EQ(text + done.text, want_text + want.Finish());
  EXPECT_TRUE(stream->finished());
  EXPECT_EQ(metrics_.finished(FinishReasonName(result_.finish_reason)), 1);
  EXPECT_EQ(metrics_.ttft_count(), 1u);
}

TEST_F(OutputProcessorTest, AStopStringEndsItAndItsCancellationFinishesAsStop) {
  // A stop string from the middle of the text, so some token completes it.
  CompletionText whole(engine_->tokenizer(), job_.generate.prompt_tokens.back(), {}, {});
  std::string text;
  for (int32_t t : result_.tokens) text += whole.Push(t);
  text += whole.Finish();
  ASSERT_GE(text.size(), 8u);
  job_.stop_strings = {text.substr(text.size() / 2, 2)};

  OutputProcessor processor(engine_->tokenizer(), metrics_);
  auto stream = std::make_shared<ResponseStream>(1);
  auto out = processor.Open(stream, job_, /*speculative=*/false);
  size_t fed = 0;
  while (fed < result_.tokens.size() && out->OnToken(result_.tokens[fed], logits_)) ++fed;
  ASSERT_LT(fed, result_.tokens.size()) << "the stop string never appeared";
  GenerateResult cut = result_;
  cut.tokens.resize(fed + 1);
  cut.finish_reason = FinishReason::kCancelled;  // the engine saw the callback say "stop"
  out->OnDone(cut);

  const std::vector<StreamEvent> events = Drain(*stream);
  ASSERT_FALSE(events.empty());
  std::string streamed;
  for (const StreamEvent& e : events) streamed += e.text;
  EXPECT_EQ(streamed, text.substr(0, text.find(job_.stop_strings[0])));
  EXPECT_EQ(events.back().type, StreamEvent::Type::kFinished);
  EXPECT_EQ(events.back().finish_reason, FinishReason::kStop);
  EXPECT_EQ(metrics_.finished("stop"), 1);
}

TEST_F(OutputProcessorTest, SequencesThatNeverRanGetTheirFinalEvent) {
  OutputProcessor processor(engine_->tokenizer(), metrics_);
  auto stream = std::make_shared<ResponseStream>(3);
  processor.Cancelled(*stream, job_);
  processor.Failed(*stream, job_, UnavailableError("shutting down"), /*counted=*/false);
  processor.Failed(*stream, job_, InternalError("broken"));

  const std::vector<StreamEvent> events = Drain(*stream);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, StreamEvent::Type::kFinished);
  EXPECT_EQ(events[0].finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(events[0].prompt_tokens, static_cast<int32_t>(job_.generate.prompt_tokens.size()));
  EXPECT_EQ(events[1].type, StreamEvent::Type::kError);
  EXPECT_EQ(events[1].error.code(), StatusCode::kUnavailable);
  EXPECT_EQ(events[2].error.code(), StatusCode::kInternal);
  EXPECT_TRUE(stream->finished());
  EXPECT_EQ(metrics_.finished("cancelled"), 1);
  EXPECT_EQ(metrics_.finished("error"), 1);  // the uncounted one is not
}

}  // namespace
}  // namespace specinfer
