// The OpenAI wire format: request parsing (types, shapes, UTF-8, unsupported features), error
// bodies, response and stream-chunk rendering, SSE framing.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/text_output.h"
#include "server_test_util.h"

namespace specinfer {
namespace {

using json = nlohmann::json;

ApiError ParseCompletion(const std::string& body, CompletionRequest* out = nullptr) {
  CompletionRequest r;
  ApiError e = ParseOpenAiRequest(OpenAiEndpoint::kCompletions, body, out ? out : &r);
  return e;
}
ApiError ParseChat(const std::string& body, CompletionRequest* out = nullptr) {
  CompletionRequest r;
  return ParseOpenAiRequest(OpenAiEndpoint::kChat, body, out ? out : &r);
}

// The request is refused with 400 naming `param` ("" = no param expected).
void ExpectBadRequest(const ApiError& e, const std::string& param, const std::string& body) {
  EXPECT_FALSE(e.ok()) << body;
  EXPECT_EQ(e.HttpStatus(), 400) << body << ": " << e.message;
  EXPECT_EQ(e.param, param) << body << ": " << e.message;
}

TEST(OpenAiParse, CompletionFields) {
  CompletionRequest r;
  ApiError e = ParseCompletion(
      R"({"model":"m","prompt":"Hello","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,
          "n":2,"seed":42,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},
          "logprobs":3,"user":"ignored","metadata":{"x":"y"}})",
      &r);
  ASSERT_TRUE(e.ok()) << e.message;
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.prompts[0].text, "Hello");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.seed, 42);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.default_max_tokens, 16);  // OpenAI's completions default
}

// As the OpenAI API does: a field the endpoint does not know is refused, naming it, so a typo
// ("max_token", "temprature") never silently runs with the default.
TEST(OpenAiParse, UnknownFieldsAreRefusedByName) {
  CompletionRequest r;
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt":"x","max_token":5})", "max_token"},
      {R"({"prompt":"x","temprature":0})", "temprature"},
      {R"({"prompt":"x","some_future_field":{"x":[1,2]}})", "some_future_field"},
      {R"({"prompt":"x","messages":[]})", "messages"}};
  for (const auto& [body, param] : cases) {
    ApiError e = ParseCompletion(body, &r);
    ExpectBadRequest(e, param, body);
    EXPECT_NE(e.message.find(std::string("Unrecognized request argument supplied: ") + param),
              std::string::npos)
        << e.message;
  }
  // Chat-only fields are unknown to completions and the other way round.
  ExpectBadRequest(ParseChat(R"({"messages":[{"role":"user","content":"hi"}],"echo":true})"),
                   "echo", "chat with echo");
  ExpectBadRequest(ParseCompletion(R"({"prompt":"x","top_logprobs":2})", &r), "top_logprobs",
                   "completion with top_logprobs");
  // Known OpenAI fields that change nothing here are accepted.
  EXPECT_TRUE(ParseChat(R"({"messages":[{"role":"user","content":"hi"}],"user":"u",
                            "store":false,"tool_choice":"none","parallel_tool_calls":true})")
                  .ok());
}

TEST(OpenAiParse, DefaultsAndNulls) {
  CompletionRequest r;
  ASSERT_TRUE(ParseCompletion(R"({"prompt":"x","max_tokens":null,"temperature":null,
                                  "stop":null,"seed":null,"logprobs":null})",
                              &r)
                  .ok());
  EXPECT_FALSE(r.max_tokens.has_value());
  // Absent or null sampling fields stay absent: the server's defaults fill them in.
  EXPECT_FALSE(r.temperature.has_value());
  EXPECT_FALSE(r.top_p.has_value());
  EXPECT_FALSE(r.top_k.has_value());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
}

TEST(OpenAiParse, PromptShapes) {
  CompletionRequest r;
  ASSERT_TRUE(ParseCompletion(R"({"prompt":[1,2,3]})", &r).ok());
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.prompts[0].tokens, (std::vector<int32_t>{1, 2, 3}));

  ASSERT_TRUE(ParseCompletion(R"({"prompt":["a","b"]})", &r).ok());
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].text, "b");

  ASSERT_TRUE(ParseCompletion(R"({"prompt":[[1,2],[3]]})", &r).ok());
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].tokens, (std::vector<int32_t>{3}));

  ASSERT_TRUE(ParseCompletion(R"({"prompt":""})", &r).ok());  // empty text: BOS alone

  for (const char* bad : {R"({})", R"({"prompt":null})", R"({"prompt":5})", R"({"prompt":[]})",
                          R"({"prompt":[1,"a"]})", R"({"prompt":["a",1]})", R"({"prompt":[1.5]})",
                          R"({"prompt":[-1]})", R"({"prompt":[99999999999]})",
                          R"({"prompt":{"text":"a"}})", R"({"prompt":[true]})"}) {
    ExpectBadRequest(ParseCompletion(bad), "prompt", bad);
  }
}

TEST(OpenAiParse, ChatMessages) {
  CompletionRequest r;
  ASSERT_TRUE(ParseChat(R"({"messages":[{"role":"developer","content":"be brief"},
                                        {"role":"user","content":[{"type":"text","text":"a"},
                                                                  {"type":"text","text":"b"}]},
                                        {"role":"assistant","content":null},
                                        {"role":"user","content":"q","name":"bob"}],
                            "max_tokens":5,"max_completion_tokens":9})",
                        &r)
                  .ok());
  EXPECT_TRUE(r.chat);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "a\nb");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r.default_max_tokens, -1);

  struct Case {
    const char* body;
    const char* param;
  };
  for (const Case& c : std::vector<Case>{
           {R"({})", "messages"},
           {R"({"messages":[]})", "messages"},
           {R"({"messages":"hi"})", "messages"},
           {R"({"messages":["hi"]})", "messages[0]"},
           {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
           {R"({"messages":[{"role":5,"content":"x"}]})", "messages[0].role"},
           {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
           {R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].role"},
           {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
           {R"({"messages":[{"role":"user","content":7}]})", "messages[0].content"},
           {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
            "messages[0].content[0].type"},
           {R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})",
            "messages[0].content[0].text"},
           {R"({"messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"1"}]}]})",
            "messages[0].tool_calls"},
       }) {
    ExpectBadRequest(ParseChat(c.body), c.param, c.body);
  }
}

TEST(OpenAiParse, ChatLogprobs) {
  CompletionRequest r;
  ASSERT_TRUE(
      ParseChat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", &r).ok());
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_TRUE(ParseChat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,
                            "top_logprobs":5})",
                        &r)
                  .ok());
  EXPECT_EQ(r.logprobs, 5);
  ASSERT_TRUE(
      ParseChat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false})", &r).ok());
  EXPECT_EQ(r.logprobs, -1);
  ExpectBadRequest(ParseChat(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})"),
                   "top_logprobs", "top_logprobs without logprobs");
  ExpectBadRequest(ParseChat(R"({"messages":[{"role":"user","content":"x"}],"logprobs":3})"),
                   "logprobs", "logprobs as a number");
}

TEST(OpenAiParse, WrongTypesAreRefusedWithTheirParam) {
  struct Case {
    const char* body;
    const char* param;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"prompt":"x","max_tokens":"5"})", "max_tokens"},
           {R"({"prompt":"x","max_tokens":5.5})", "max_tokens"},
           {R"({"prompt":"x","max_tokens":true})", "max_tokens"},
           {R"({"prompt":"x","temperature":"hot"})", "temperature"},
           {R"({"prompt":"x","top_p":[1]})", "top_p"},
           {R"({"prompt":"x","top_k":0.5})", "top_k"},
           {R"({"prompt":"x","n":"2"})", "n"},
           {R"({"prompt":"x","seed":"1"})", "seed"},
           {R"({"prompt":"x","seed":1.5})", "seed"},
           {R"({"prompt":"x","stop":5})", "stop"},
           {R"({"prompt":"x","stop":["a",5]})", "stop"},
           {R"({"prompt":"x","stream":"yes"})", "stream"},
           {R"({"prompt":"x","stream":1})", "stream"},
           {R"({"prompt":"x","stream_options":true})", "stream_options"},
           {R"({"prompt":"x","stream_options":{"include_usage":"y"}})",
            "stream_options.include_usage"},
           {R"({"prompt":"x","logprobs":true})", "logprobs"},
           {R"({"prompt":"x","logprobs":-1})", "logprobs"},
           {R"({"prompt":"x","model":7})", "model"},
           {R"({"prompt":"x","speculation":true})", "speculation"},
           {R"({"prompt":"x","speculation":{"enabled":"yes"}})", "speculation.enabled"},
           {R"({"prompt":"x","speculation":{"draft":"ngram:3"}})", "speculation.draft"},
           {R"({"prompt":"x","speculation":{"draft":[3]}})", "speculation.draft[0]"},
           {R"({"prompt":"x","speculation":{"draft":["ngram:3","bogus"]}})",
            "speculation.draft[1]"},
           {R"({"prompt":"x","speculation":{"tree":[1,"2"]}})", "speculation.tree[1]"},
           {R"({"prompt":"x","speculation":{"tree":3}})", "speculation.tree"},
           {R"({"prompt":"x","speculation":{"enable":true}})", "speculation.enable"},
       }) {
    ExpectBadRequest(ParseCompletion(c.body), c.param, c.body);
  }
  // Integral floats are integers (as OpenAI's own validation accepts them).
  CompletionRequest r;
  ASSERT_TRUE(ParseCompletion(R"({"prompt":"x","max_tokens":5.0,"n":1.0})", &r).ok());
  EXPECT_EQ(r.max_tokens, 5);
}

TEST(OpenAiParse, SpeculationExtension) {
  CompletionRequest r;
  ASSERT_TRUE(ParseCompletion(R"({"prompt":"x","speculation":{"enabled":true,
                                  "draft":["ngram:3","layers:4","model:/m/d.gguf"],
                                  "tree":[1,1,3,1]}})",
                              &r)
                  .ok());
  EXPECT_TRUE(r.speculation.enabled);
  ASSERT_EQ(r.speculation.drafts.size(), 3u);
  EXPECT_EQ(r.speculation.drafts[1].kind, DraftSpec::Kind::kLayers);
  EXPECT_EQ(r.speculation.drafts[2].model_path, "/m/d.gguf");
  EXPECT_EQ(r.speculation.tree, (std::vector<int32_t>{1, 1, 3, 1}));
  // Out-of-range values parse; CompletionService checks the ranges.
  ASSERT_TRUE(ParseCompletion(R"({"prompt":"x","speculation":{"tree":[99999999999]}})", &r).ok());
  EXPECT_FALSE(ValidateSpeculation(r.speculation).ok());
}

TEST(OpenAiParse, MalformedBodies) {
  for (const char* bad : {"", "{", "{\"prompt\":", "[1,2]", "\"text\"", "null",
                          "{\"prompt\":\"x\"}}", "{'prompt':'x'}", "{\"prompt\":\"x\",}"}) {
    ExpectBadRequest(ParseCompletion(bad), "", bad);
  }
  // Invalid UTF-8 anywhere: a truncated character, a lone continuation byte, an overlong form, a
  // surrogate.
  for (std::string bad :
       {std::string("{\"prompt\":\"\xE2\x82\"}"), std::string("{\"prompt\":\"\x80\"}"),
        std::string("{\"prompt\":\"\xC0\xAF\"}"), std::string("{\"prompt\":\"\xED\xA0\x80\"}"),
        std::string("{\"prompt\":\"ok\"} \xFF")}) {
    ApiError e = ParseCompletion(bad);
    ExpectBadRequest(e, "", bad);
    EXPECT_NE(e.message.find("UTF-8"), std::string::npos) << e.message;
  }
  // A lone surrogate escape is invalid JSON text too.
  ExpectBadRequest(ParseCompletion(R"({"prompt":"\ud800"})"), "", "lone surrogate escape");
  // Valid multi-byte text is fine.
  CompletionRequest r;
  ASSERT_TRUE(ParseCompletion("{\"prompt\":\"caf\xC3\xA9 \xF0\x9F\x99\x82\"}", &r).ok());
  EXPECT_EQ(r.prompts[0].text, "caf\xC3\xA9 \xF0\x9F\x99\x82");
  // Deep nesting is refused before the recursive parser sees it.
  ApiError deep = ParseCompletion(std::string(100000, '['));
  ExpectBadRequest(deep, "", "deep nesting");
  EXPECT_NE(deep.message.find("nests deeper"), std::string::npos);
  std::string ok_depth =
      "{\"prompt\":\"x\",\"metadata\":" + std::string(60, '[') + std::string(60, ']') + "}";
  EXPECT_TRUE(ParseCompletion(ok_depth).ok());
  // Brackets inside strings do not count.
  EXPECT_TRUE(ParseCompletion("{\"prompt\":\"" + std::string(1000, '[') + "\"}").ok());
}

TEST(OpenAiParse, UnsupportedFeaturesAreRefusedWhenUsed) {
  struct Case {
    const char* body;
    const char* param;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"prompt":"x","echo":true})", "echo"},
           {R"({"prompt":"x","suffix":"end"})", "suffix"},
           {R"({"prompt":"x","best_of":3})", "best_of"},
           {R"({"prompt":"x","logit_bias":{"50256":-100}})", "logit_bias"},
           {R"({"prompt":"x","presence_penalty":0.5})", "presence_penalty"},
           {R"({"prompt":"x","frequency_penalty":-1})", "frequency_penalty"},
       }) {
    ExpectBadRequest(ParseCompletion(c.body), c.param, c.body);
  }
  for (const Case& c : std::vector<Case>{
           {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
            "tools"},
           {R"({"messages":[{"role":"user","content":"x"}],
                "response_format":{"type":"json_object"}})",
            "response_format"},
       }) {
    ExpectBadRequest(ParseChat(c.body), c.param, c.body);
  }
  // Their neutral values are accepted (clients send them by default).
  EXPECT_TRUE(ParseCompletion(R"({"prompt":"x","echo":false,"suffix":"","best_of":1,
                                  "logit_bias":{},"presence_penalty":0,"frequency_penalty":0})")
                  .ok());
  EXPECT_TRUE(ParseChat(R"({"messages":[{"role":"user","content":"x"}],"tools":[],
                            "response_format":{"type":"text"},"tool_choice":"none"})")
                  .ok());
}

TEST(OpenAiErrors, BodyHasOpenAiShape) {
  ApiError e = ApiError::Invalid("temperature must be between 0 and 2", "temperature");
  json j = json::parse(OpenAiErrorBody(e));
  EXPECT_EQ(j["error"]["message"], "temperature must be between 0 and 2");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["code"].is_null());

  ApiError busy = ApiError::FromStatus(UnavailableError("server busy"));
  busy.error_code = "server_busy";
  EXPECT_EQ(busy.HttpStatus(), 503);
  j = json::parse(OpenAiErrorBody(busy));
  EXPECT_EQ(j["error"]["type"], "server_error");
  EXPECT_EQ(j["error"]["code"], "server_busy");
  EXPECT_TRUE(j["error"]["param"].is_null());

  ApiError big = ApiError::Invalid("too large");
  big.http_status = 413;
  EXPECT_EQ(big.HttpStatus(), 413);
  EXPECT_EQ(ApiError::FromStatus(Status(StatusCode::kUnauthenticated, "no")).HttpStatus(), 401);
  EXPECT_EQ(ApiError::FromStatus(NotFoundError("no")).HttpStatus(), 404);
}

TEST(Sse, Framing) {
  EXPECT_EQ(SseData("{\"a\":1}"), "data: {\"a\":1}\n\n");
  // Multi-line data becomes one data line per line (JSON from dump() never has newlines, but the
  // framing must not break if it did).
  EXPECT_EQ(SseData("a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(SseData("a\r\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_EQ(kSseKeepAlive.front(), ':');  // a comment: clients ignore it
}

// A two-choice request's events rendered both ways.
class ResponseWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testing::Stories260KEngine();
    ASSERT_TRUE(engine_);
    prepared_.prompt_tokens = 3;
    for (int i = 0; i < 2; ++i) {
      SequenceJob j;
      j.index = i;
      j.generate.prompt_tokens = {1, 400, 401};
      prepared_.jobs.push_back(j);
    }
  }

  std::vector<StreamEvent> Events(bool with_logprobs) const {
    std::vector<StreamEvent> ev;
    auto delta = [&](int index, std::string text, int32_t token) {
      StreamEvent e;
      e.index = index;
      e.text = std::move(text);
      e.tokens = {token};
      if (with_logprobs) e.logprobs = {TokenLogprob{token, -0.5f, {{token, -0.5f}, {7, -1.5f}}}};
      return e;
    };
    ev.push_back(delta(0, "He", 300));
    ev.push_back(delta(1, "", 301));  // held-back text: no content, still its logprob
    ev.push_back(delta(0, "llo", 302));
    StreamEvent f0;
    f0.type = StreamEvent::Type::kFinished;
    f0.index = 0;
    f0.finish_reason = FinishReason::kStop;
    f0.prompt_tokens = 3;
    f0.completion_tokens = 2;
    ev.push_back(f0);
    StreamEvent f1 = f0;
    f1.index = 1;
    f1.text = "tail";
    f1.finish_reason = FinishReason::kLength;
    f1.completion_tokens = 1;
    ev.push_back(f1);
    return ev;
  }

  std::unique_ptr<Engine> engine_;
  PreparedRequest prepared_;
};

TEST_F(ResponseWriterTest, CompletionResponse) {
  OpenAiResponseWriter w(OpenAiEndpoint::kCompletions, engine_->tokenizer(), prepared_, "m", -1,
                         "cmpl-1", 1234);
  for (const StreamEvent& e : Events(false)) w.Add(e);
  json j = json::parse(w.Response());
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1234);
  EXPECT_EQ(j["model"], "m");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["text"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][1]["text"], "tail");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 6);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST_F(ResponseWriterTest, ChatStreamChunksConcatenateToTheResponse) {
  OpenAiResponseWriter stream(OpenAiEndpoint::kChat, engine_->tokenizer(), prepared_, "m", 1,
                              "chatcmpl-1", 1);
  OpenAiResponseWriter whole(OpenAiEndpoint::kChat, engine_->tokenizer(), prepared_, "m", 1,
                             "chatcmpl-1", 1);
  std::vector<std::string> chunks = stream.StreamStart();
  ASSERT_EQ(chunks.size(), 2u);  // one role chunk per choice
  json first = json::parse(chunks[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  for (const StreamEvent& e : Events(true)) {
    for (std::string& c : stream.StreamChunks(e)) chunks.push_back(std::move(c));
    whole.Add(e);
  }
  std::string text[2];
  std::string finish[2];
  size_t logprob_entries[2] = {0, 0};
  for (const std::string& c : chunks) {
    json j = json::parse(c);
    const json& ch = j["choices"][0];
    const int i = ch["index"];
    if (ch["delta"].contains("content")) text[i] += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish[i] = ch["finish_reason"];
    if (!ch["logprobs"].is_null()) logprob_entries[i] += ch["logprobs"]["content"].size();
  }
  json resp = json::parse(whole.Response());
  EXPECT_EQ(resp["object"], "chat.completion");
  for (int i = 0; i < 2; ++i) {
    const json& c = resp["choices"][i];
    EXPECT_EQ(c["message"]["role"], "assistant");
    EXPECT_EQ(text[i], c["message"]["content"].get<std::string>()) << i;
    EXPECT_EQ(finish[i], c["finish_reason"].get<std::string>()) << i;
    EXPECT_EQ(logprob_entries[i], c["logprobs"]["content"].size()) << i;
  }
  EXPECT_EQ(text[0], "Hello");
  // Logprob entries: the token's text and bytes, its logprob, and the alternatives.
  const json& lp = resp["choices"][0]["logprobs"]["content"][0];
  const std::string piece = engine_->tokenizer().TokenBytes(401, 300);
  EXPECT_EQ(lp["token"], piece);
  EXPECT_EQ(lp["bytes"].size(), piece.size());
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);
  ASSERT_EQ(lp["top_logprobs"].size(), 2u);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][1]["logprob"].get<float>(), -1.5f);

  json usage = json::parse(stream.UsageChunk());
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
}

TEST_F(ResponseWriterTest, CompletionLogprobsFields) {
  OpenAiResponseWriter w(OpenAiEndpoint::kCompletions, engine_->tokenizer(), prepared_, "m", 1,
                         "cmpl-1", 1);
  for (const StreamEvent& e : Events(true)) w.Add(e);
  json lp = json::parse(w.Response())["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 2u);
  ASSERT_EQ(lp["token_logprobs"].size(), 2u);
  ASSERT_EQ(lp["top_logprobs"].size(), 2u);
  ASSERT_EQ(lp["text_offset"].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][1], CountCodePoints(engine_->tokenizer().TokenBytes(401, 300)));
  EXPECT_TRUE(lp["top_logprobs"][0].is_object());
}

// usage.prompt_tokens_details.cached_tokens: the prefix-cache hits of each prompt, counted once
// per prompt as prompt_tokens is (the least over its n choices), streamed and not.
TEST_F(ResponseWriterTest, CachedTokensCountEachPromptOnce) {
  auto usage_of = [&](const PreparedRequest& prepared, int32_t cached0, int32_t cached1) {
    OpenAiResponseWriter whole(OpenAiEndpoint::kChat, engine_->tokenizer(), prepared, "m", -1,
                               "chatcmpl-1", 1);
    OpenAiResponseWriter stream(OpenAiEndpoint::kChat, engine_->tokenizer(), prepared, "m", -1,
                                "chatcmpl-1", 1);
    for (StreamEvent e : Events(false)) {
      if (e.type == StreamEvent::Type::kFinished)
        e.cached_prompt_tokens = e.index == 0 ? cached0 : cached1;
      whole.Add(e);
      stream.StreamChunks(e);
    }
    const json u = json::parse(whole.Response())["usage"];
    EXPECT_EQ(u, json::parse(stream.UsageChunk())["usage"]);
    return u;
  };
  // One prompt, n = 2: the second sample found the first one's KV; the prompt was computed once.
  PreparedRequest one_prompt = prepared_;
  one_prompt.choices_per_prompt = 2;
  EXPECT_EQ(usage_of(one_prompt, 0, 2)["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(usage_of(one_prompt, 2, 1)["prompt_tokens_details"]["cached_tokens"], 1);
  // Two prompts, n = 1: their hits add up.
  PreparedRequest two_prompts = prepared_;
  two_prompts.prompt_tokens = 6;
  const json u = usage_of(two_prompts, 2, 1);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 3);
  EXPECT_EQ(u["prompt_tokens"], 6);
  EXPECT_EQ(u["total_tokens"], 9);
}

TEST(OpenAiModels, List) {
  json j = json::parse(OpenAiModelList("tiny", 5, 512));
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 512);
}

}  // namespace
}  // namespace specinfer
