// The request queue (FIFO worker over the Engine, bounded queue, cancellation, failure isolation)
// with its output processor, and the CompletionService checks in front of it, on stories260K.
#include "server/request_queue.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <thread>

#include "server/completion_service.h"
#include "server/text_output.h"
#include "server_test_util.h"

namespace specinfer {
namespace {

using namespace std::chrono_literals;

SequenceJob Job(const Engine& engine, const std::string& prompt, int32_t max_tokens,
                float temperature = 0, uint64_t seed = 0) {
  SequenceJob j;
  j.generate.prompt_tokens = *engine.EncodePrompt(prompt);
  j.generate.max_new_tokens = max_tokens;
  j.generate.sampling.temperature = temperature;
  j.generate.sampling.seed = seed;
  j.generate.stop_tokens = engine.default_stop_tokens();
  return j;
}

// A sequence that runs for its whole length (no stop tokens): keeps the worker busy.
SequenceJob LongJob(const Engine& engine, const std::string& prompt, int32_t max_tokens = 450) {
  SequenceJob j = Job(engine, prompt, max_tokens);
  j.generate.stop_tokens.clear();
  return j;
}

struct Collected {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<StreamEvent> finals;  // kFinished / kError, in order
};

// Reads the stream to its end (fails the test after `timeout`).
Collected Drain(ResponseStream& s, std::chrono::seconds timeout = 30s) {
  Collected c;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!s.finished()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "stream did not finish";
      break;
    }
    auto e = s.Next(50ms);
    if (!e) continue;
    c.text += e->text;
    c.tokens.insert(c.tokens.end(), e->tokens.begin(), e->tokens.end());
    if (e->type != StreamEvent::Type::kDelta) c.finals.push_back(*e);
  }
  return c;
}

// Waits for the first event of a stream (the sequence is running then); returns it.
std::optional<StreamEvent> First(ResponseStream& s) {
  for (int i = 0; i < 600; ++i)
    if (auto e = s.Next(50ms)) return e;
  ADD_FAILURE() << "no event";
  return std::nullopt;
}

class RequestQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testing::Stories260KEngine();
    ASSERT_TRUE(engine_);
  }
  // max_running = 1: one sequence at a time, the others wait in FIFO order.
  std::unique_ptr<RequestQueue> Make(int32_t max_queue = 16, int32_t max_running = 1) {
    RequestQueueOptions o;
    o.max_queue = max_queue;
    o.batch.max_sequences = max_running;
    return std::make_unique<RequestQueue>(*engine_, metrics_, o);
  }

  std::unique_ptr<Engine> engine_;
  ServerMetrics metrics_;
};

TEST_F(RequestQueueTest, StreamsExactlyWhatEngineGenerateProduces) {
  // Reference first, on the engine alone.
  SequenceJob job = Job(*engine_, "Once upon a time", 50, 0.8f, 11);
  auto ref = engine_->Generate(job.generate);
  ASSERT_TRUE(ref.ok());
  CompletionText text(engine_->tokenizer(), job.generate.prompt_tokens.back(),
                      job.generate.stop_tokens, {});
  std::string ref_text;
  for (int32_t t : ref->tokens) ref_text += text.Push(t);
  ref_text += text.Finish();

  auto queue = Make();
  auto stream = queue->Submit({job});
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  Collected c = Drain(**stream);
  EXPECT_EQ(c.tokens, ref->tokens);
  EXPECT_EQ(c.text, ref_text);
  ASSERT_EQ(c.finals.size(), 1u);
  EXPECT_EQ(c.finals[0].type, StreamEvent::Type::kFinished);
  EXPECT_EQ(c.finals[0].finish_reason, ref->finish_reason);
  EXPECT_EQ(c.finals[0].completion_tokens, static_cast<int32_t>(ref->tokens.size()));
  EXPECT_EQ(c.finals[0].prompt_tokens, static_cast<int32_t>(job.generate.prompt_tokens.size()));
  EXPECT_EQ(queue->gauges().kv_blocks_used, 0);
  EXPECT_EQ(metrics_.ttft_count(), 1u);
}

TEST_F(RequestQueueTest, AdmitsInFifoOrderWhenTheBatchIsFull) {
  auto queue = Make();
  auto a = queue->Submit({LongJob(*engine_, "First")});
  auto b = queue->Submit({LongJob(*engine_, "Second")});
  auto c = queue->Submit({Job(*engine_, "Third", 5)});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(First(**a));
  // While a runs, b and c wait untouched.
  EXPECT_FALSE((*b)->Next(0ms));
  EXPECT_FALSE((*c)->Next(0ms));
  EXPECT_EQ(queue->gauges().queued, 2);
  EXPECT_EQ(queue->gauges().running, 1);
  Collected ca = Drain(**a);
  EXPECT_EQ(ca.tokens.size() + 1, 450u);  // + the first event's token
  // Then b, while c still waits.
  ASSERT_TRUE(First(**b));
  EXPECT_FALSE((*c)->Next(0ms));
  EXPECT_EQ(queue->gauges().queued, 1);
  Drain(**b);
  Collected cc = Drain(**c);
  ASSERT_EQ(cc.finals.size(), 1u);
  EXPECT_EQ(cc.finals[0].completion_tokens, 5);
  EXPECT_EQ(queue->gauges().queued, 0);
}

// Continuous batching: sequences submitted one after the other run side by side (a short one
// finishes while a long one goes on), and each streams exactly what it produces alone.
TEST_F(RequestQueueTest, RunsSequencesSideBySide) {
  std::vector<SequenceJob> jobs = {LongJob(*engine_, "Once upon a time", 300),
                                   Job(*engine_, "The cat", 20, 0.9f, 5),
                                   Job(*engine_, "Lily and Ben went to the park", 40),
                                   Job(*engine_, "One day", 30, 1.0f, 9)};
  std::vector<std::vector<int32_t>> alone;
  for (const SequenceJob& j : jobs) {
    auto r = engine_->Generate(j.generate);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    alone.push_back(r->tokens);
  }
  auto queue = Make(/*max_queue=*/16, /*max_running=*/4);
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const SequenceJob& j : jobs) {
    auto s = queue->Submit({j});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    streams.push_back(*s);
  }
  // The long one is still running when the short ones are done: they did not wait for it.
  Collected c1 = Drain(*streams[1]);
  EXPECT_FALSE(streams[0]->finished());
  EXPECT_GE(queue->gauges().running, 1);
  std::vector<Collected> got(jobs.size());
  got[1] = c1;
  for (size_t i : {0u, 2u, 3u}) got[i] = Drain(*streams[i]);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, alone[i]) << "sequence " << i;
    ASSERT_EQ(got[i].finals.size(), 1u);
    EXPECT_EQ(got[i].finals[0].type, StreamEvent::Type::kFinished);
  }
  EXPECT_EQ(queue->gauges().running, 0);
  EXPECT_EQ(queue->gauges().kv_blocks_used, 0);
}

TEST_F(RequestQueueTest, FullQueueRefusesWholeRequests) {
  auto queue = Make(/*max_queue=*/2);
  auto running = queue->Submit({LongJob(*engine_, "Running")});
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(First(**running));  // the worker took it: the queue is empty again
  auto q1 = queue->Submit({Job(*engine_, "q1", 10)});
  ASSERT_TRUE(q1.ok());
  // Two more sequences do not fit in the one slot left: refused whole, nothing queued.
  auto two = queue->Submit({Job(*engine_, "x", 10), Job(*engine_, "y", 10)});
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(two.status().message().find("busy"), std::string::npos);
  EXPECT_EQ(queue->gauges().queued, 1);
  auto q2 = queue->Submit({Job(*engine_, "q2", 10)});
  ASSERT_TRUE(q2.ok());
  auto q3 = queue->Submit({Job(*engine_, "q3", 10)});
  ASSERT_FALSE(q3.ok());
  EXPECT_EQ(q3.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(queue->gauges().queued, 2);
  queue->Cancel(*running);
  Drain(**running);
  Drain(**q1);
  Drain(**q2);
  EXPECT_FALSE(queue->Submit({}).ok());
}

TEST_F(RequestQueueTest, CancellingQueuedSequencesDropsThemAtOnce) {
  auto queue = Make();
  auto running = queue->Submit({LongJob(*engine_, "Running")});
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(First(**running));
  auto queued = queue->Submit({Job(*engine_, "q", 10), Job(*engine_, "r", 10)});
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(queue->gauges().queued, 2);
  queue->Cancel(*queued);
  // Removed from the queue at once; one the worker had already taken as the next to admit (it
  // still counts as queued) is dropped at its next step. Either way long before the running
  // sequence ends.
  const auto until = std::chrono::steady_clock::now() + 1s;
  while (queue->gauges().queued > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(queue->gauges().queued, 0);
  Collected q = Drain(**queued, 1s);
  ASSERT_EQ(q.finals.size(), 2u);
  for (const StreamEvent& f : q.finals) {
    EXPECT_EQ(f.type, StreamEvent::Type::kFinished);
    EXPECT_EQ(f.finish_reason, FinishReason::kCancelled);
  }
  EXPECT_TRUE(q.tokens.empty());
  queue->Cancel(*running);
  Drain(**running);
}

TEST_F(RequestQueueTest, CancellingTheRunningSequenceStopsItAndFreesItsKv) {
  auto queue = Make();
  auto s = queue->Submit({LongJob(*engine_, "Once upon a time")});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(First(**s));
  EXPECT_GT(queue->gauges().kv_blocks_used, 0);
  queue->Cancel(*s);
  Collected c = Drain(**s, 5s);
  ASSERT_EQ(c.finals.size(), 1u);
  EXPECT_EQ(c.finals[0].finish_reason, FinishReason::kCancelled);
  EXPECT_LT(c.finals[0].completion_tokens, 450);
  // The worker publishes the KV figure after the generator returned (and freed the sequence).
  for (int i = 0; i < 100 && queue->gauges().running; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(queue->gauges().kv_blocks_used, 0);
  EXPECT_EQ(engine_->kv().used_blocks(), 0);
  // The next request is served normally.
  auto next = queue->Submit({Job(*engine_, "Next", 5)});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Drain(**next).finals[0].completion_tokens, 5);
}

TEST_F(RequestQueueTest, StopStringEndsGenerationAtTheCompletingToken) {
  SequenceJob job = Job(*engine_, "Once upon a time", 80);
  auto ref = engine_->Generate(job.generate);
  ASSERT_TRUE(ref.ok());
  CompletionText full(engine_->tokenizer(), job.generate.prompt_tokens.back(), {}, {});
  std::string text;
  for (int32_t t : ref->tokens) text += full.Push(t);
  text += full.Finish();
  const size_t pos = text.find(" park");
  ASSERT_NE(pos, std::string::npos) << text;

  job.stop_strings = {" park", "never appears"};
  auto queue = Make();
  auto s = queue->Submit({job});
  ASSERT_TRUE(s.ok());
  Collected c = Drain(**s);
  EXPECT_EQ(c.text, text.substr(0, pos));
  ASSERT_EQ(c.finals.size(), 1u);
  EXPECT_EQ(c.finals[0].finish_reason, FinishReason::kStop);
  EXPECT_LT(c.tokens.size(), ref->tokens.size());
  // Generation stopped exactly at the token that completed " park".
  CompletionText check(engine_->tokenizer(), job.generate.prompt_tokens.back(), {}, {" park"});
  size_t n = 0;
  for (int32_t t : ref->tokens) {
    check.Push(t);
    ++n;
    if (check.stopped()) break;
  }
  EXPECT_EQ(c.tokens.size(), n);
}

TEST_F(RequestQueueTest, AFailingSequenceDoesNotAffectOthers) {
  auto queue = Make();
  SequenceJob bad = Job(*engine_, "x", 5);
  bad.generate.prompt_tokens = {1, 999999};  // outside the vocabulary: the generator refuses it
  auto a = queue->Submit({bad});
  auto b = queue->Submit({Job(*engine_, "Fine", 7)});
  ASSERT_TRUE(a.ok() && b.ok());
  Collected ca = Drain(**a);
  ASSERT_EQ(ca.finals.size(), 1u);
  EXPECT_EQ(ca.finals[0].type, StreamEvent::Type::kError);
  EXPECT_EQ(ca.finals[0].error.code(), StatusCode::kInvalidArgument);
  Collected cb = Drain(**b);
  ASSERT_EQ(cb.finals.size(), 1u);
  EXPECT_EQ(cb.finals[0].type, StreamEvent::Type::kFinished);
  EXPECT_EQ(cb.finals[0].completion_tokens, 7);
}

TEST_F(RequestQueueTest, LogprobsAccompanyEveryToken) {
  auto queue = Make();
  SequenceJob job = Job(*engine_, "Lily", 20, 1.0f, 5);
  job.top_logprobs = 3;
  auto s = queue->Submit({job});
  ASSERT_TRUE(s.ok());
  size_t deltas = 0;
  while (!(*s)->finished()) {
    auto e = (*s)->Next(50ms);
    if (!e || e->type != StreamEvent::Type::kDelta) continue;
    ++deltas;
    ASSERT_EQ(e->tokens.size(), 1u);
    ASSERT_EQ(e->logprobs.size(), 1u);
    EXPECT_EQ(e->logprobs[0].token, e->tokens[0]);
    EXPECT_LE(e->logprobs[0].logprob, 0.0f);
    ASSERT_EQ(e->logprobs[0].top.size(), 3u);
    EXPECT_GE(e->logprobs[0].top[0].second, e->logprobs[0].logprob);
  }
  EXPECT_EQ(deltas, 20u);
  EXPECT_EQ(engine_->kv().used_blocks(), 0);
}

TEST_F(RequestQueueTest, ShutdownFailsQueuedAndCancelsRunning) {
  auto queue = Make();
  auto running = queue->Submit({LongJob(*engine_, "Running")});
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(First(**running));
  auto queued = queue->Submit({Job(*engine_, "Queued", 10)});
  ASSERT_TRUE(queued.ok());
  queue->Shutdown();
  Collected q = Drain(**queued, 1s);
  ASSERT_EQ(q.finals.size(), 1u);
  EXPECT_EQ(q.finals[0].type, StreamEvent::Type::kError);
  EXPECT_EQ(q.finals[0].error.code(), StatusCode::kUnavailable);
  Collected r = Drain(**running, 1s);
  ASSERT_EQ(r.finals.size(), 1u);
  EXPECT_EQ(r.finals[0].finish_reason, FinishReason::kCancelled);
  auto late = queue->Submit({Job(*engine_, "late", 1)});
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable);
  queue->Shutdown();  // idempotent
}

// ---- CompletionService::Prepare ----------------------------------------------------------------

class CompletionServiceTest : public RequestQueueTest {
 protected:
  void SetUp() override {
    RequestQueueTest::SetUp();
    queue_ = Make();
    ServiceOptions o;
    o.served_model_name = "tiny";
    o.chat_template = "chatml";
    service_ = std::make_unique<CompletionService>(*queue_, metrics_, o);
  }
  CompletionRequest Text(const std::string& prompt) {
    CompletionRequest r;
    r.prompts.push_back(PromptInput{false, prompt, {}});
    return r;
  }
  std::unique_ptr<RequestQueue> queue_;
  std::unique_ptr<CompletionService> service_;
};

TEST_F(CompletionServiceTest, BuildsOneJobPerChoiceWithSeeds) {
  CompletionRequest r = Text("Hello");
  r.prompts.push_back(PromptInput{true, "", {1, 400, 401}});
  r.n = 3;
  r.seed = 100;
  r.temperature = 0.7f;
  r.top_k = -1;
  r.max_tokens = 9;
  r.stop = {"\n"};
  r.logprobs = 2;
  PreparedRequest p;
  ApiError e = service_->Prepare(r, &p);
  ASSERT_TRUE(e.ok()) << e.message;
  ASSERT_EQ(p.jobs.size(), 6u);
  const int32_t hello_len = static_cast<int32_t>(engine_->EncodePrompt("Hello")->size());
  EXPECT_EQ(p.prompt_tokens, hello_len + 3);
  for (int i = 0; i < 6; ++i) {
    const SequenceJob& j = p.jobs[i];
    EXPECT_EQ(j.index, i);
    EXPECT_EQ(j.generate.sampling.seed, 100u + i % 3);
    EXPECT_EQ(j.generate.sampling.top_k, 0);
    EXPECT_EQ(j.generate.max_new_tokens, 9);
    EXPECT_EQ(j.stop_strings, r.stop);
    EXPECT_EQ(j.top_logprobs, 2);
    EXPECT_EQ(j.generate.stop_tokens, engine_->default_stop_tokens());
  }
  EXPECT_EQ(p.jobs[4].generate.prompt_tokens, (std::vector<int32_t>{1, 400, 401}));
}

TEST_F(CompletionServiceTest, MaxTokensDefaults) {
  CompletionRequest r = Text("Hello");
  PreparedRequest p;
  ASSERT_TRUE(service_->Prepare(r, &p).ok());
  const int32_t prompt_len = static_cast<int32_t>(p.jobs[0].generate.prompt_tokens.size());
  EXPECT_EQ(p.jobs[0].generate.max_new_tokens, 512 - prompt_len);  // rest of the context
  r.default_max_tokens = 16;
  ASSERT_TRUE(service_->Prepare(r, &p).ok());
  EXPECT_EQ(p.jobs[0].generate.max_new_tokens, 16);
}

// A server's GenerationDefaults fill the fields a request leaves out (llama.cpp's --temp,
// vLLM's generation config); what a request gives always wins, including an explicit "off".
TEST_F(CompletionServiceTest, ServerDefaultsFillAbsentFields) {
  ServiceOptions o;
  o.served_model_name = "tiny";
  o.defaults.temperature = 0.3f;
  o.defaults.top_p = 0.8f;
  o.defaults.top_k = 5;
  o.defaults.max_tokens = 20;
  ASSERT_TRUE(o.defaults.Validate().ok());
  CompletionService service(*queue_, metrics_, o);

  CompletionRequest r = Text("Hello");
  r.default_max_tokens = 16;  // as /v1/completions sets it: the server's default replaces it
  PreparedRequest p;
  ASSERT_TRUE(service.Prepare(r, &p).ok());
  const SamplingParams& s = p.jobs[0].generate.sampling;
  EXPECT_FLOAT_EQ(s.temperature, 0.3f);
  EXPECT_FLOAT_EQ(s.top_p, 0.8f);
  EXPECT_EQ(s.top_k, 5);
  EXPECT_EQ(p.jobs[0].generate.max_new_tokens, 20);

  r.temperature = 0.0f;  // greedy, asked for
  r.top_p = 1.0f;
  r.top_k = -1;  // off, asked for
  r.max_tokens = 3;
  ASSERT_TRUE(service.Prepare(r, &p).ok());
  EXPECT_FLOAT_EQ(p.jobs[0].generate.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(p.jobs[0].generate.sampling.top_p, 1.0f);
  EXPECT_EQ(p.jobs[0].generate.sampling.top_k, 0);
  EXPECT_EQ(p.jobs[0].generate.max_new_tokens, 3);

  // A default max_tokens beyond what the context holds is cut to it, not refused (the request
  // did not ask for it).
  o.defaults.max_tokens = 100000;
  CompletionService roomy(*queue_, metrics_, o);
  CompletionRequest plain = Text("Hello");
  ASSERT_TRUE(roomy.Prepare(plain, &p).ok());
  const int32_t prompt_len = static_cast<int32_t>(p.jobs[0].generate.prompt_tokens.size());
  EXPECT_EQ(p.jobs[0].generate.max_new_tokens, 512 - prompt_len);

  // Without configured defaults: OpenAI's (temperature 1, top_p 1, top_k off).
  ASSERT_TRUE(service_->Prepare(plain, &p).ok());
  EXPECT_FLOAT_EQ(p.jobs[0].generate.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(p.jobs[0].generate.sampling.top_p, 1.0f);
  EXPECT_EQ(p.jobs[0].generate.sampling.top_k, 0);
}

TEST(GenerationDefaults, ValidateRefusesWhatNoRequestCouldCarry) {
  EXPECT_TRUE(GenerationDefaults{}.Validate().ok());
  auto bad = [](auto edit) {
    GenerationDefaults d;
    edit(d);
    return d.Validate();
  };
  struct Case {
    Status status;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {bad([](GenerationDefaults& d) { d.temperature = 2.5f; }), "temperature"},
      {bad([](GenerationDefaults& d) { d.temperature = std::nanf(""); }), "temperature"},
      {bad([](GenerationDefaults& d) { d.top_p = 0; }), "top_p"},
      {bad([](GenerationDefaults& d) { d.top_k = -2; }), "top_k"},
      {bad([](GenerationDefaults& d) { d.max_tokens = 0; }), "max_tokens"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), StatusCode::kInvalidArgument) << c.expect;
    EXPECT_NE(c.status.message().find(c.expect), std::string::npos) << c.status.message();
  }
  GenerationDefaults d;
  d.temperature = 0.2f;
  d.top_p = 0.9f;
  d.max_tokens = 256;
  EXPECT_TRUE(d.Validate().ok());
  EXPECT_EQ(d.ToString(), "temperature 0.2, top_p 0.9, top_k off, max_tokens 256");
}

TEST_F(CompletionServiceTest, ChatUsesTheTemplate) {
  CompletionRequest r;
  r.chat = true;
  r.messages = {{"user", "hi"}};
  PreparedRequest p;
  ApiError e = service_->Prepare(r, &p);
  ASSERT_TRUE(e.ok()) << e.message;
  std::vector<int32_t> stops = engine_->default_stop_tokens();
  std::vector<ChatMessage> msgs = {{"user", "hi"}};
  EXPECT_EQ(p.jobs[0].generate.prompt_tokens, *engine_->EncodeChat(msgs, "chatml", &stops));
  r.messages = {{"system", "a"}, {"system", "b"}};  // the template refuses a second system message
  e = service_->Prepare(r, &p);
  EXPECT_EQ(e.HttpStatus(), 400);
  EXPECT_EQ(e.param, "messages");
}

TEST_F(CompletionServiceTest, RefusesWhatTheModelCannotServe) {
  struct Case {
    std::function<void(CompletionRequest&)> edit;
    int status;
    std::string param;
    std::string code;
  };
  const std::string long_prompt(5000, 'a');
  std::vector<Case> cases = {
      {[](CompletionRequest& r) { r.model = "gpt-4"; }, 404, "model", "model_not_found"},
      {[](CompletionRequest& r) { r.temperature = 2.5f; }, 400, "temperature", ""},
      {[](CompletionRequest& r) { r.temperature = -0.1f; }, 400, "temperature", ""},
      {[](CompletionRequest& r) { r.temperature = std::nanf(""); }, 400, "temperature", ""},
      {[](CompletionRequest& r) { r.top_p = 0; }, 400, "top_p", ""},
      {[](CompletionRequest& r) { r.top_p = 1.01f; }, 400, "top_p", ""},
      {[](CompletionRequest& r) { r.top_k = -2; }, 400, "top_k", ""},
      {[](CompletionRequest& r) { r.n = 0; }, 400, "n", ""},
      {[](CompletionRequest& r) { r.n = 17; }, 400, "n", ""},
      {[](CompletionRequest& r) {
         r.n = 9;
         r.prompts.push_back(r.prompts[0]);
       },
       400, "n", ""},
      {[](CompletionRequest& r) { r.logprobs = 21; }, 400, "logprobs", ""},
      {[](CompletionRequest& r) { r.stop = {""}; }, 400, "stop", ""},
      {[](CompletionRequest& r) { r.stop = std::vector<std::string>(17, "x"); }, 400, "stop", ""},
      {[](CompletionRequest& r) { r.stop = {std::string(300, 'x')}; }, 400, "stop", ""},
      {[](CompletionRequest& r) { r.max_tokens = -1; }, 400, "max_tokens", ""},
      {[](CompletionRequest& r) { r.max_tokens = 513; }, 400, "max_tokens",
       "context_length_exceeded"},
      {[](CompletionRequest& r) { r.max_tokens = int64_t{1} << 62; }, 400, "max_tokens",
       "context_length_exceeded"},
      {[](CompletionRequest& r) { r.max_tokens = std::numeric_limits<int64_t>::max(); }, 400,
       "max_tokens", "context_length_exceeded"},
      {[&](CompletionRequest& r) { r.prompts[0].text = long_prompt; }, 400, "prompt",
       "context_length_exceeded"},
      {[](CompletionRequest& r) {
         r.prompts[0] = PromptInput{true, "", {1, 512}};
       },
       400, "prompt", ""},
      {[](CompletionRequest& r) {
         r.prompts[0] = PromptInput{true, "", {}};
       },
       400, "prompt", ""},
      {[](CompletionRequest& r) {
         r.speculation.tree = {1, 0};
       },
       400, "speculation", ""},
      {[](CompletionRequest& r) {
         r.speculation.drafts = {DraftSpec{DraftSpec::Kind::kLayers, 5, ""}};
       },
       400, "speculation", ""},  // stories260K has 5 layers
      {[](CompletionRequest& r) { r.speculation.enabled = true; }, 400, "speculation.enabled", ""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CompletionRequest r = Text("Hello");
    cases[i].edit(r);
    PreparedRequest p;
    ApiError e = service_->Prepare(r, &p);
    EXPECT_FALSE(e.ok()) << "case " << i;
    EXPECT_EQ(e.HttpStatus(), cases[i].status) << "case " << i << ": " << e.message;
    EXPECT_EQ(e.param, cases[i].param) << "case " << i << ": " << e.message;
    EXPECT_EQ(e.error_code, cases[i].code) << "case " << i << ": " << e.message;
  }
  // The speculation refusal says what is going on.
  CompletionRequest r = Text("Hello");
  r.speculation.enabled = true;
  PreparedRequest p;
  EXPECT_EQ(service_->Prepare(r, &p).message, "speculation is not enabled on this server");
  // Exactly filling the context is fine.
  r = Text("");
  r.max_tokens = 511;  // BOS + 511
  EXPECT_TRUE(service_->Prepare(r, &p).ok());
}

}  // namespace
}  // namespace specinfer
