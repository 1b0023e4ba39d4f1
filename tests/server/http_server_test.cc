// The OpenAI-compatible gateway end to end: an in-process daemon on stories260K (chat template
// chatml) on an ephemeral loopback port, spoken to over real HTTP.
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "server/inference_server.h"
#include "server/sse_client.h"
#include "server_test_util.h"

namespace specinfer {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr size_t kMaxBody = 64 << 10;

std::unique_ptr<InferenceServer> StartServer(InferenceServerOptions o) {
  auto engine = testing::Stories260KEngine();
  if (!engine) return nullptr;
  o.served_model_name = "stories";
  o.chat_template = "chatml";
  o.http.port = 0;
  o.http.max_body_bytes = kMaxBody;
  o.enable_grpc = false;
  auto s = InferenceServer::Start(std::move(engine), std::move(o));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// The request counter of /metrics for (endpoint, code) once it reaches `want`, or after 5 s. The
// server counts a request after writing its response (httplib's logger), so a client can see
// its answer a moment before the count moves.
int64_t CountedRequests(InferenceServer& server, std::string_view endpoint, std::string_view code,
                        int64_t want) {
  int64_t n = server.metrics().requests(endpoint, code);
  for (int i = 0; i < 500 && n < want; ++i) {
    std::this_thread::sleep_for(10ms);
    n = server.metrics().requests(endpoint, code);
  }
  return n;
}

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Static trees: these tests check what speculation does to replies and counters, so it must
    // happen; the adaptive controller may rightly decode plainly on a loaded machine (seen in
    // CI: no accepted token on the speculative-request test).
    InferenceServerOptions o;
    o.queue.batch.spec_budget = SpecBudgetMode::kStatic;
    server_ = StartServer(std::move(o)).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  static SseReply Post(const std::string& path, const json& body, int stop_after = 0) {
    return PostSse("127.0.0.1", server_->http_port(), path, body.dump(), stop_after);
  }
  static SseReply PostRaw(const std::string& path, const std::string& body) {
    return PostSse("127.0.0.1", server_->http_port(), path, body);
  }
  static httplib::Result Get(const std::string& path) {
    httplib::Client cli("127.0.0.1", server_->http_port());
    return cli.Get(path.c_str());
  }
  // Waits until the worker is idle (a cancelled sequence's KV is freed when it returns).
  static void WaitIdle() {
    for (int i = 0; i < 500; ++i) {
      ServingGauges g = server_->queue().gauges();
      if (g.running == 0 && g.queued == 0) return;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "the request queue did not become idle";
  }

  static InferenceServer* server_;
};
InferenceServer* HttpServerTest::server_ = nullptr;

// The text (per choice) and finish reasons of an SSE completion stream; checks the framing.
struct StreamedChoices {
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  std::map<int, int> logprob_tokens;
  json usage;
};
StreamedChoices ParseStream(const SseReply& r, bool chat) {
  StreamedChoices out;
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.events.empty());
  if (r.events.empty()) return out;
  EXPECT_EQ(r.events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < r.events.size(); ++i) {
    json j = json::parse(r.events[i]);
    EXPECT_FALSE(j.contains("error")) << r.events[i];
    EXPECT_EQ(j["object"], chat ? "chat.completion.chunk" : "text_completion");
    if (j.contains("usage") && !j["usage"].is_null()) out.usage = j["usage"];
    for (const json& c : j["choices"]) {
      const int idx = c["index"];
      if (chat) {
        if (c["delta"].contains("content"))
          out.text[idx] += c["delta"]["content"].get<std::string>();
      } else {
        out.text[idx] += c["text"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) out.finish[idx] = c["finish_reason"];
      if (!c["logprobs"].is_null())
        out.logprob_tokens[idx] +=
            chat ? c["logprobs"]["content"].size() : c["logprobs"]["tokens"].size();
    }
  }
  return out;
}

TEST_F(HttpServerTest, HealthModelsMetrics) {
  auto h = Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  json models = json::parse(m->body);
  EXPECT_EQ(models["data"][0]["id"], "stories");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  auto one = Get("/v1/models/stories");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  auto missing = Get("/v1/models/other");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto metrics = Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  for (const char* family :
       {"specinfer_requests_total", "specinfer_queue_length", "specinfer_running_sequences",
        "specinfer_kv_blocks_used", "specinfer_kv_blocks_total",
        "specinfer_time_to_first_token_seconds_bucket",
        "specinfer_inter_token_latency_seconds_bucket", "specinfer_generated_tokens_total",
        "specinfer_spec_llm_passes_total", "specinfer_spec_accepted_tokens_total"})
    EXPECT_NE(metrics->body.find(family), std::string::npos) << family;
}

TEST_F(HttpServerTest, CompletionStreamEqualsNonStream) {
  json req = {{"model", "stories"},
              {"prompt", "Once upon a time"},
              {"max_tokens", 60},
              {"temperature", 0.9},
              {"seed", 1234}};
  SseReply whole = Post("/v1/completions", req);
  ASSERT_EQ(whole.status, 200) << whole.body;
  json j = json::parse(whole.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "stories");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  const std::string text = j["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  const int completion_tokens = j["usage"]["completion_tokens"];
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + completion_tokens);

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  SseReply stream = Post("/v1/completions", req);
  StreamedChoices s = ParseStream(stream, false);
  EXPECT_EQ(s.text[0], text);
  EXPECT_EQ(s.finish[0], j["choices"][0]["finish_reason"]);
  EXPECT_EQ(s.usage, j["usage"]);
  EXPECT_GT(stream.events.size(), 3u);  // streamed piece by piece, not in one chunk
}

// usage.prompt_tokens_details.cached_tokens: the first request with a long prompt computes all of
// it (0 cached); a second one sharing that prompt reuses the prefix cache's blocks (> 0, fewer than
// its prompt tokens), in the non-streamed response and in the streamed usage chunk alike, on both
// endpoints. The prompts are unique to this test: the server is shared by the suite.
TEST_F(HttpServerTest, UsageReportsCachedPromptTokens) {
  std::string story = "Tom the cached tokens test";
  for (int i = 0; i < 6; ++i) story += ". Lily and Ben went to the park to play with a red ball";
  auto cached = [](const json& usage) {
    return usage["prompt_tokens_details"]["cached_tokens"].get<int>();
  };

  json req = {{"prompt", story}, {"max_tokens", 4}, {"temperature", 0}};
  SseReply first = Post("/v1/completions", req);
  ASSERT_EQ(first.status, 200) << first.body;
  const json u1 = json::parse(first.body)["usage"];
  const int prompt_tokens = u1["prompt_tokens"];
  ASSERT_GT(prompt_tokens, 64) << "the prompt should span several KV blocks";
  EXPECT_EQ(cached(u1), 0) << u1.dump();

  req["prompt"] = story + ". The end";
  SseReply second = Post("/v1/completions", req);
  ASSERT_EQ(second.status, 200) << second.body;
  const json u2 = json::parse(second.body)["usage"];
  EXPECT_GT(cached(u2), 0) << u2.dump();
  EXPECT_LT(cached(u2), u2["prompt_tokens"].get<int>());
  EXPECT_LE(cached(u2), prompt_tokens);

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  StreamedChoices s = ParseStream(Post("/v1/completions", req), false);
  ASSERT_TRUE(s.usage.is_object());
  EXPECT_GT(cached(s.usage), 0) << s.usage.dump();

  // Chat: a long system message shared by two conversations.
  json chat = {{"messages", {{{"role", "system"}, {"content", "Chat cached tokens test. " + story}},
                             {{"role", "user"}, {"content", "Hello"}}}},
               {"max_tokens", 4},
               {"temperature", 0}};
  SseReply c1 = Post("/v1/chat/completions", chat);
  ASSERT_EQ(c1.status, 200) << c1.body;
  EXPECT_EQ(cached(json::parse(c1.body)["usage"]), 0) << c1.body;
  chat["messages"][1]["content"] = "Tell me more";
  chat["stream"] = true;
  chat["stream_options"] = {{"include_usage", true}};
  StreamedChoices c2 = ParseStream(Post("/v1/chat/completions", chat), true);
  ASSERT_TRUE(c2.usage.is_object());
  EXPECT_GT(cached(c2.usage), 0) << c2.usage.dump();
}

// Per-request speculation: greedy output with speculators equals output without, streamed too,
// and the speculation counters of /metrics move.
TEST_F(HttpServerTest, SpeculativeRequestsGiveTheSameGreedyTextAndCountAcceptedTokens) {
  json req = {{"prompt", "Lily and Ben went to the park. Lily and Ben"},
              {"max_tokens", 80},
              {"temperature", 0}};
  SseReply plain = Post("/v1/completions", req);
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::string want = json::parse(plain.body)["choices"][0]["text"];
  for (const json& spec :
       {json{{"enabled", true}},
        json{{"enabled", true}, {"draft", {"ngram:2", "layers:3"}}, {"tree", {2, 1, 1}}}}) {
    json r = req;
    r["speculation"] = spec;
    SseReply whole = Post("/v1/completions", r);
    ASSERT_EQ(whole.status, 200) << whole.body;
    EXPECT_EQ(json::parse(whole.body)["choices"][0]["text"], want) << spec.dump();
    r["stream"] = true;
    StreamedChoices s = ParseStream(Post("/v1/completions", r), false);
    EXPECT_EQ(s.text[0], want) << spec.dump();
  }
  auto m = Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("specinfer_spec_llm_passes_total"), std::string::npos);
  const std::string name = "\nspecinfer_spec_accepted_tokens_total ";
  const size_t p = m->body.find(name);
  ASSERT_NE(p, std::string::npos) << m->body;
  EXPECT_GT(std::stod(m->body.substr(p + name.size())), 0) << "no accepted speculative token";
}

TEST_F(HttpServerTest, ChatStreamEqualsNonStream) {
  json req = {{"messages",
               {{{"role", "system"}, {"content", "You tell stories."}},
                {{"role", "user"}, {"content", "Tell me about a cat."}}}},
              {"max_completion_tokens", 50},
              {"temperature", 0}};
  SseReply whole = Post("/v1/chat/completions", req);
  ASSERT_EQ(whole.status, 200) << whole.body;
  json j = json::parse(whole.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const std::string text = j["choices"][0]["message"]["content"];
  EXPECT_FALSE(text.empty());

  req["stream"] = true;
  SseReply stream = Post("/v1/chat/completions", req);
  StreamedChoices s = ParseStream(stream, true);
  EXPECT_EQ(s.text[0], text);
  EXPECT_EQ(s.finish[0], j["choices"][0]["finish_reason"]);
  json first = json::parse(stream.events.front());
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
}

TEST_F(HttpServerTest, SeveralChoicesStopStringsAndLogprobs) {
  json req = {{"prompt", {"Once upon a time", "The dog"}},
              {"n", 2},
              {"max_tokens", 40},
              {"temperature", 1.0},
              {"seed", 7},
              {"stop", {"."}},
              {"logprobs", 2}};
  SseReply whole = Post("/v1/completions", req);
  ASSERT_EQ(whole.status, 200) << whole.body;
  json j = json::parse(whole.body);
  ASSERT_EQ(j["choices"].size(), 4u);
  req["stream"] = true;
  StreamedChoices s = ParseStream(Post("/v1/completions", req), false);
  int total_tokens = 0;
  for (int i = 0; i < 4; ++i) {
    const json& c = j["choices"][i];
    EXPECT_EQ(c["index"], i);
    const std::string text = c["text"];
    EXPECT_EQ(text.find('.'), std::string::npos) << "stop string not removed: " << text;
    EXPECT_EQ(s.text[i], text) << i;
    EXPECT_EQ(s.finish[i], c["finish_reason"]) << i;
    const json& lp = c["logprobs"];
    ASSERT_TRUE(lp.is_object()) << c;
    EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
    EXPECT_EQ(s.logprob_tokens[i], static_cast<int>(lp["tokens"].size())) << i;
    for (const json& t : lp["token_logprobs"]) EXPECT_LE(t.get<double>(), 0.0);
    for (const json& top : lp["top_logprobs"]) EXPECT_EQ(top.size(), 2u);
    total_tokens += static_cast<int>(lp["tokens"].size());
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], total_tokens);
  // Same seed, same prompt: choice 0 of either prompt equals a single request with that seed.
  json single = {{"prompt", "The dog"},
                 {"max_tokens", 40},
                 {"temperature", 1.0},
                 {"seed", 8},
                 {"stop", {"."}}};
  SseReply r = Post("/v1/completions", single);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], j["choices"][3]["text"]);
}

// A greedy request without logprobs brings back only its rows' argmax from the engine; with
// logprobs it needs its logits rows: both give the same text, and the logprobs are those of the
// chosen tokens (the largest of each top-2, as greedy picks the argmax).
TEST_F(HttpServerTest, GreedyLogprobsStillComeWithTheirLogits) {
  json req = {{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0}};
  SseReply plain = Post("/v1/completions", req);
  ASSERT_EQ(plain.status, 200) << plain.body;
  req["logprobs"] = 2;
  SseReply with = Post("/v1/completions", req);
  ASSERT_EQ(with.status, 200) << with.body;
  const json p = json::parse(plain.body)["choices"][0], w = json::parse(with.body)["choices"][0];
  EXPECT_EQ(w["text"], p["text"]);
  EXPECT_TRUE(p["logprobs"].is_null()) << p;
  const json& lp = w["logprobs"];
  ASSERT_TRUE(lp.is_object()) << w;
  const size_t n = lp["token_logprobs"].size();
  EXPECT_GE(n, 5u);
  EXPECT_EQ(n, json::parse(with.body)["usage"]["completion_tokens"].get<size_t>());
  for (size_t i = 0; i < n; ++i) {
    const double chosen = lp["token_logprobs"][i].get<double>();
    EXPECT_LE(chosen, 0.0);
    EXPECT_GT(chosen, -50.0);
    for (const auto& [token, logprob] : lp["top_logprobs"][i].items())
      EXPECT_LE(logprob.get<double>(), chosen + 1e-6) << "token " << i << " " << token;
  }
}

// Every bad request gets its 4xx with an OpenAI error object, and the daemon keeps serving.
TEST_F(HttpServerTest, BadRequestsGetOpenAiErrors) {
  struct Case {
    std::string path;
    std::string body;
    int status;
    std::string param;  // "-" = do not check
  };
  const std::string ok = R"({"prompt":"hi","max_tokens":2})";
  std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt":"hi",)", 400, ""},
      {"/v1/completions", "not json at all", 400, ""},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":"2"})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"hi","temperature":"0.5"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt":"hi","stream":"true"})", 400, "stream"},
      {"/v1/completions", R"({"prompt":"hi","model":"gpt-4o"})", 404, "model"},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":-5})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":1000000000000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":1e30})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":18446744073709551615})", 400,
       "max_tokens"},
      {"/v1/completions", R"({"prompt":"hi","temperature":2.5})", 400, "temperature"},
      {"/v1/completions", R"({"prompt":"hi","temperature":-1})", 400, "temperature"},
      {"/v1/completions", R"({"prompt":"hi","top_p":0})", 400, "top_p"},
      {"/v1/completions", "{\"prompt\":\"\xC3\x28\"}", 400, ""},
      {"/v1/completions", R"({"prompt":")" + std::string(20000, 'a') + "\"}", 400, "prompt"},
      {"/v1/completions",
       R"({"prompt":"hi","speculation":{"enabled":true,"draft":["model:/etc/passwd"]}})", 400,
       "speculation.draft"},
      {"/v1/completions", R"({"prompt":"hi","speculation":{"enabled":true,"draft":["layers:9"]}})",
       400, "speculation"},
      {"/v1/completions", R"({"prompt":"hi","speculation":{"tree":[0]}})", 400, "speculation"},
      {"/v1/chat/completions", R"({"messages":"hi"})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":0})", 400, "n"},
      {"/v1/completions", "{\"prompt\":\"" + std::string(kMaxBody, 'a') + "\"}", 413, ""},
      {"/v1/nothing", ok, 404, ""},
  };
  for (const Case& c : cases) {
    SseReply r = PostRaw(c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 200) << " -> " << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    const json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_TRUE(e.contains("code"));
    ASSERT_TRUE(e.contains("param"));
    if (c.param != "-") {
      EXPECT_EQ(e["param"].is_null() ? "" : e["param"].get<std::string>(), c.param)
          << c.body.substr(0, 200);
    }
    // The daemon still serves a good request after each bad one.
    SseReply good = PostRaw("/v1/completions", ok);
    EXPECT_EQ(good.status, 200) << good.body;
  }
  httplib::Client cli("127.0.0.1", server_->http_port());
  auto get = cli.Get("/v1/completions");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_GE(server_->metrics().requests("/v1/completions", "400"), 10);
  EXPECT_GE(server_->metrics().requests("/v1/completions", "413"), 1);
}

// The value of the sample line starting with `name` (e.g. `x{a="b"}`) in a metrics text; 0 if
// absent.
double MetricValue(const std::string& text, const std::string& name) {
  const size_t p = text.find("\n" + name + " ");
  if (p == std::string::npos) return 0;
  return std::stod(text.substr(p + name.size() + 2));
}

// Prefix caching is on by default: a prompt sent again reuses its KV blocks (the hit counters
// of /metrics move) and the greedy text stays the same.
TEST_F(HttpServerTest, RepeatedPromptReusesCachedKvAndKeepsTheText) {
  auto metrics = [] {
    auto m = Get("/metrics");
    EXPECT_TRUE(m);
    return m ? m->body : std::string();
  };
  json req = {{"prompt", "Lily and Ben went to the park. They saw a big dog. The dog was happy "
                         "and ran to them. They played with a ball all day long."},
              {"max_tokens", 24},
              {"temperature", 0}};
  WaitIdle();
  const std::string before = metrics();
  SseReply first = Post("/v1/completions", req);
  ASSERT_EQ(first.status, 200) << first.body;
  WaitIdle();
  const std::string middle = metrics();
  SseReply second = Post("/v1/completions", req);
  ASSERT_EQ(second.status, 200) << second.body;
  WaitIdle();
  const std::string after = metrics();
  EXPECT_EQ(json::parse(second.body)["choices"][0]["text"],
            json::parse(first.body)["choices"][0]["text"]);
  const std::string hit = "specinfer_prefix_cache_hit_tokens_total";
  const std::string queried = "specinfer_prefix_cache_queried_tokens_total";
  const int prompt_tokens = json::parse(first.body)["usage"]["prompt_tokens"];
  ASSERT_GT(prompt_tokens, 32);
  EXPECT_EQ(MetricValue(middle, queried) - MetricValue(before, queried), prompt_tokens);
  // Every whole block but the one holding the last prompt token.
  EXPECT_EQ(MetricValue(after, hit) - MetricValue(middle, hit), (prompt_tokens - 1) / 16 * 16);
  EXPECT_GT(MetricValue(after, "specinfer_kv_blocks_cached"), 0);
  EXPECT_GT(MetricValue(after, "specinfer_prefix_cache_hit_rate"), 0);
}

TEST_F(HttpServerTest, DisconnectingMidStreamCancelsAndFreesKv) {
  WaitIdle();
  auto metrics = [] {
    auto m = Get("/metrics");
    EXPECT_TRUE(m);
    return m ? m->body : std::string();
  };
  const std::string cancelled = "specinfer_sequences_finished_total{reason=\"cancelled\"}";
  const std::string before = metrics();
  json req = {
      {"prompt", "Once upon a time"}, {"max_tokens", 450}, {"ignore_eos", true}, {"stream", true}};
  SseReply r = Post("/v1/completions", req, /*stop_after=*/3);
  EXPECT_TRUE(r.aborted);
  EXPECT_EQ(r.status, 200);
  WaitIdle();
  const std::string after = metrics();
  EXPECT_EQ(MetricValue(after, cancelled) - MetricValue(before, cancelled), 1) << after;
  const double produced = MetricValue(after, "specinfer_generated_tokens_total") -
                          MetricValue(before, "specinfer_generated_tokens_total");
  EXPECT_GE(produced, 3);
  EXPECT_LT(produced, 450) << "generation was not cancelled";
  EXPECT_EQ(MetricValue(after, "specinfer_kv_blocks_used"), 0);
  EXPECT_GT(MetricValue(after, "specinfer_kv_blocks_total"), 0);
  EXPECT_EQ(server_->queue().gauges().kv_blocks_used, 0);
  // And the daemon serves the next request.
  SseReply next = Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 3}});
  EXPECT_EQ(next.status, 200);
}

// Speculative requests, finished or disconnected mid-stream, leave no draft session behind
// (the specinfer_draft_sessions gauge is back to 0 once the queue is idle).
TEST_F(HttpServerTest, SpeculativeRequestsLeaveNoDraftSession) {
  WaitIdle();
  json req = {{"prompt", "Lily and Ben went to the park. Lily and Ben"},
              {"max_tokens", 300},
              {"ignore_eos", true},
              {"temperature", 0},
              {"speculation", {{"enabled", true}, {"draft", {"ngram:2", "layers:3"}}}}};
  SseReply whole = Post("/v1/completions", req);
  EXPECT_EQ(whole.status, 200) << whole.body;
  req["stream"] = true;
  SseReply cut = Post("/v1/completions", req, /*stop_after=*/3);
  EXPECT_TRUE(cut.aborted);
  WaitIdle();
  auto m = Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("\nspecinfer_draft_sessions "), std::string::npos) << m->body;
  EXPECT_EQ(MetricValue(m->body, "specinfer_draft_sessions"), 0) << m->body;
  EXPECT_EQ(server_->queue().gauges().draft_sessions, 0);
}

// Non-streaming requests that outlast the plain-response wait: the body is held open with
// whitespace and ends in the JSON; and a client that gives up (closes its connection) cancels its
// generation and frees its KV memory. Needs a model slow enough to outlast the wait: the default
// SmolLM2 (skipped without it).
TEST(HttpServerSlowModel, LongNonStreamingRequestsAndClientsThatLeave) {
  const std::string model = testing::DefaultModel();
  if (model.empty()) GTEST_SKIP() << "default model absent (scripts/fetch_model.sh places it)";
  InferenceServerOptions o;
  o.engine.model_path = model;
  o.engine.num_threads = 1;
  o.engine.context_length = 4096;
  o.queue.batch.max_sequences = 1;
  o.http.port = 0;
  o.enable_grpc = false;
  auto started = InferenceServer::Start(std::move(o));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<InferenceServer> server = std::move(started).value();
  const int port = server->http_port();

  // (1) Longer than the plain-response wait, answered whole: valid JSON after the keep-alives.
  {
    json req = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true},
                {"temperature", 0}};
    const auto t0 = std::chrono::steady_clock::now();
    SseReply r = PostSse("127.0.0.1", port, "/v1/completions", req.dump());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body);  // leading whitespace is valid JSON
    EXPECT_EQ(j["usage"]["completion_tokens"], 400);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    if (seconds > 2.5) {
      EXPECT_EQ(r.body.front(), ' ') << "a long response is held open with whitespace";
    }
  }

  // (2) A client that gives up after a second: its generation stops soon after.
  const int64_t cancelled_before = server->metrics().finished("cancelled");
  {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(1, 0);
    json req = {{"prompt", "Once upon a time"}, {"max_tokens", 3000}, {"ignore_eos", true}};
    auto res = cli.Post("/v1/completions", req.dump(), "application/json");
    EXPECT_FALSE(res) << "the client was to time out";
  }  // closes the connection
  const auto left = std::chrono::steady_clock::now();
  bool idle = false;
  while (std::chrono::steady_clock::now() - left < 20s) {
    if (server->queue().gauges().running == 0) {
      idle = true;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(idle) << "generation went on after the client left";
  EXPECT_LT(std::chrono::steady_clock::now() - left, 10s);
  EXPECT_EQ(server->metrics().finished("cancelled") - cancelled_before, 1);
  EXPECT_EQ(server->queue().gauges().kv_blocks_used, 0);
}

TEST(HttpServerLimits, QueueFullIs503) {
  InferenceServerOptions o;
  o.queue.max_queue = 2;
  o.queue.batch.max_sequences = 1;  // one runs, the others queue
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  const int port = server->http_port();
  auto wait_for = [&](int64_t running, int64_t queued) {
    for (int i = 0; i < 5000; ++i) {
      const ServingGauges g = server->queue().gauges();
      if (g.running == running && g.queued == queued) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  };
  // Long sequences (450 tokens, no EOS): two from one request, then one more: one runs, two wait.
  auto long_request = [port](int n) {
    json req = {{"prompt", "Once"}, {"n", n}, {"max_tokens", 450}, {"ignore_eos", true}};
    SseReply r = PostSse("127.0.0.1", port, "/v1/completions", req.dump());
    EXPECT_EQ(r.status, 200) << r.body;
  };
  std::thread first(long_request, 2);
  const bool one_waiting = wait_for(1, 1);
  std::thread second(long_request, 1);
  const bool full = one_waiting && wait_for(1, 2);
  SseReply r;
  if (full)
    r = PostSse("127.0.0.1", port, "/v1/completions", R"({"prompt":"x","max_tokens":1})");
  first.join();
  second.join();
  ASSERT_TRUE(full);
  EXPECT_EQ(r.status, 503) << r.body;
  json e = json::parse(r.body);
  EXPECT_EQ(e["error"]["code"], "server_busy");
  EXPECT_EQ(e["error"]["type"], "server_error");
  // Served again once the queue drained.
  r = PostSse("127.0.0.1", port, "/v1/completions", R"({"prompt":"x","max_tokens":1})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(CountedRequests(*server, "/v1/completions", "503", 1), 1);
}

TEST(HttpServerLimits, ApiKey) {
  InferenceServerOptions o;
  o.http.api_key = "sk-test-123";
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  const int port = server->http_port();
  const std::string body = R"({"prompt":"hi","max_tokens":2})";
  SseReply none = PostSse("127.0.0.1", port, "/v1/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(json::parse(none.body)["error"]["code"], "invalid_api_key");
  SseReply wrong = PostSse("127.0.0.1", port, "/v1/completions", body, 0,
                                           {{"Authorization", "Bearer sk-test-12"}});
  EXPECT_EQ(wrong.status, 401);
  SseReply basic = PostSse("127.0.0.1", port, "/v1/completions", body, 0,
                                           {{"Authorization", "sk-test-123"}});
  EXPECT_EQ(basic.status, 401);
  SseReply right = PostSse("127.0.0.1", port, "/v1/completions", body, 0,
                                           {{"Authorization", "Bearer sk-test-123"}});
  EXPECT_EQ(right.status, 200) << right.body;
  httplib::Client cli("127.0.0.1", port);
  auto models = cli.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto health = cli.Get("/health");  // probes need no key
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(CountedRequests(*server, "/v1/completions", "401", 3), 3);
}

TEST(HttpServerLimits, PortInUseIsAnError) {
  auto first = StartServer({});
  ASSERT_TRUE(first);
  auto engine = testing::Stories260KEngine();
  ASSERT_TRUE(engine);
  InferenceServerOptions o;
  o.http.port = first->http_port();
  o.enable_grpc = false;
  auto second = InferenceServer::Start(std::move(engine), o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace specinfer
