// The gRPC service end to end: a generated-stub client against an in-process daemon on
// stories260K (ephemeral loopback ports): streaming Generate (text equals the HTTP gateway's for
// the same request), cancellation, errors, Tokenize/Detokenize, ListModels, Health, API keys.
#include "server/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "proto/specinfer.grpc.pb.h"
#include "server/inference_server.h"
#include "server/sse_client.h"
#include "server_test_util.h"

namespace specinfer {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<InferenceServer> StartServer(const std::string& api_key = "") {
  auto engine = testing::Stories260KEngine();
  if (!engine) return nullptr;
  InferenceServerOptions o;
  o.served_model_name = "stories";
  o.chat_template = "chatml";
  o.http.port = 0;
  o.grpc.port = 0;
  o.http.api_key = o.grpc.api_key = api_key;
  auto s = InferenceServer::Start(std::move(engine), std::move(o));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

std::unique_ptr<v1::SpecInfer::Stub> Connect(const InferenceServer& s) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(s.grpc_port()),
                                     grpc::InsecureChannelCredentials());
  return v1::SpecInfer::NewStub(channel);
}

struct Generated {
  grpc::Status status;
  std::map<int, std::string> text;
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, v1::GenerateResponse> last;  // each sequence's final message
  int messages = 0;
};

Generated Generate(v1::SpecInfer::Stub& stub, const v1::GenerateRequest& req,
                   const std::string& api_key = "") {
  Generated g;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    ++g.messages;
    g.text[msg.index()] += msg.text();
    g.tokens[msg.index()].insert(g.tokens[msg.index()].end(), msg.token_ids().begin(),
                                 msg.token_ids().end());
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) g.last[msg.index()] = msg;
  }
  g.status = reader->Finish();
  return g;
}

class GrpcServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = StartServer().release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(server_->grpc_port(), 0);
    stub_ = Connect(*server_);
  }
  static InferenceServer* server_;
  std::unique_ptr<v1::SpecInfer::Stub> stub_;
};
InferenceServer* GrpcServerTest::server_ = nullptr;

TEST_F(GrpcServerTest, StreamingGenerateMatchesTheHttpGateway) {
  v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.mutable_sampling()->set_temperature(0.8f);
  req.mutable_sampling()->set_seed(99);
  req.set_max_tokens(60);
  Generated g = Generate(*stub_, req);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_GT(g.messages, 10);  // streamed token by token
  ASSERT_EQ(g.last.count(0), 1u);
  const v1::GenerateResponse& last = g.last[0];
  EXPECT_TRUE(last.finish_reason() == v1::FINISH_REASON_LENGTH ||
              last.finish_reason() == v1::FINISH_REASON_STOP);
  EXPECT_EQ(last.usage().completion_tokens(), static_cast<int>(g.tokens[0].size()));
  EXPECT_EQ(last.usage().total_tokens(),
            last.usage().prompt_tokens() + last.usage().completion_tokens());

  // The same request through the OpenAI gateway gives the same text.
  nlohmann::json http_req = {
      {"prompt", "Once upon a time"}, {"temperature", 0.8}, {"seed", 99}, {"max_tokens", 60}};
  SseReply r =
      PostSse("127.0.0.1", server_->http_port(), "/v1/completions", http_req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  nlohmann::json j = nlohmann::json::parse(r.body);
  EXPECT_EQ(g.text[0], j["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(last.usage().completion_tokens(), j["usage"]["completion_tokens"].get<int>());
}

// Usage.cached_tokens: a repeated long prompt finds its KV in the prefix cache.
TEST_F(GrpcServerTest, UsageReportsCachedTokens) {
  std::string story = "The gRPC cached tokens test";
  for (int i = 0; i < 6; ++i) story += ". Lily and Ben went to the park to play with a red ball";
  v1::GenerateRequest req;
  req.set_text(story);
  req.mutable_sampling()->set_temperature(0);
  req.set_max_tokens(4);
  Generated first = Generate(*stub_, req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.last[0].usage().cached_tokens(), 0);
  EXPECT_GT(first.last[0].usage().prompt_tokens(), 64);
  Generated second = Generate(*stub_, req);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_GT(second.last[0].usage().cached_tokens(), 0);
  EXPECT_LT(second.last[0].usage().cached_tokens(), second.last[0].usage().prompt_tokens());
}

TEST_F(GrpcServerTest, SpeculativeGenerateGivesTheSameGreedyText) {
  v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.mutable_sampling()->set_temperature(0);
  req.set_max_tokens(60);
  Generated plain = Generate(*stub_, req);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  req.mutable_speculation()->set_enabled(true);
  req.mutable_speculation()->add_draft("ngram:3");
  req.mutable_speculation()->add_draft("layers:4");
  for (int w : {1, 2, 1}) req.mutable_speculation()->add_tree(w);
  Generated spec = Generate(*stub_, req);
  ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
  EXPECT_EQ(spec.text[0], plain.text[0]);
  EXPECT_EQ(spec.tokens[0], plain.tokens[0]);
}

TEST_F(GrpcServerTest, ChatTokensStopsLogprobsAndSeveralSequences) {
  v1::GenerateRequest req;
  auto* m = req.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Tell me a story.");
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_seed(5);
  req.set_max_tokens(40);
  req.add_stop(".");
  req.set_logprobs(2);
  req.set_n(2);
  Generated g = Generate(*stub_, req);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(g.last.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(g.text[i].find('.'), std::string::npos);
    EXPECT_EQ(g.last[i].usage().completion_tokens(), static_cast<int>(g.tokens[i].size()));
  }
  // Token-id prompts are used as they are.
  v1::GenerateRequest ids;
  for (int32_t t : {1, 400, 401}) ids.mutable_tokens()->add_ids(t);
  ids.set_max_tokens(5);
  ids.set_ignore_eos(true);
  Generated gi = Generate(*stub_, ids);
  ASSERT_TRUE(gi.status.ok()) << gi.status.error_message();
  EXPECT_EQ(gi.last[0].usage().prompt_tokens(), 3);
  EXPECT_EQ(gi.tokens[0].size(), 5u);
  EXPECT_EQ(gi.last[0].finish_reason(), v1::FINISH_REASON_LENGTH);
}

TEST_F(GrpcServerTest, LogprobsArriveWithTheirTokens) {
  v1::GenerateRequest req;
  req.set_text("Lily");
  req.mutable_sampling()->set_temperature(0);
  req.set_max_tokens(12);
  req.set_ignore_eos(true);
  req.set_logprobs(3);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  int tokens = 0;
  while (reader->Read(&msg)) {
    ASSERT_EQ(msg.logprobs_size(), msg.token_ids_size());
    for (int i = 0; i < msg.logprobs_size(); ++i) {
      EXPECT_EQ(msg.logprobs(i).token_id(), msg.token_ids(i));
      EXPECT_LE(msg.logprobs(i).logprob(), 0.0f);
      EXPECT_EQ(msg.logprobs(i).top_size(), 3);
      // Greedy: the chosen token is the most likely one.
      EXPECT_EQ(msg.logprobs(i).top(0).token_id(), msg.token_ids(i));
      ++tokens;
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 12);
}

TEST_F(GrpcServerTest, BadRequestsGetStatusCodes) {
  struct Case {
    std::function<void(v1::GenerateRequest&)> edit;
    grpc::StatusCode code;
  };
  std::vector<Case> cases = {
      {[](v1::GenerateRequest& r) { r.clear_text(); }, grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) { r.set_model("gpt-4"); }, grpc::StatusCode::NOT_FOUND},
      {[](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(3); },
       grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(0); },
       grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) { r.set_max_tokens(-1); }, grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) { r.set_max_tokens(100000); },
       grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) { r.set_logprobs(-1); }, grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) { r.set_text(std::string(20000, 'a')); },
       grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) { r.mutable_speculation()->add_draft("nonsense"); },
       grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) { r.mutable_speculation()->add_tree(17); },
       grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) {
         r.mutable_speculation()->set_enabled(true);
         r.mutable_speculation()->add_draft("model:/etc/passwd");  // not loaded at start
       },
       grpc::StatusCode::INVALID_ARGUMENT},
      {[](v1::GenerateRequest& r) {
         r.clear_text();
         r.mutable_tokens()->add_ids(100000);
       },
       grpc::StatusCode::INVALID_ARGUMENT},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::GenerateRequest req;
    req.set_text("hi");
    req.set_max_tokens(3);
    cases[i].edit(req);
    Generated g = Generate(*stub_, req);
    EXPECT_EQ(g.status.error_code(), cases[i].code) << i << ": " << g.status.error_message();
    EXPECT_EQ(g.messages, 0) << i;
  }
  // Still serving.
  v1::GenerateRequest ok;
  ok.set_text("hi");
  ok.set_max_tokens(2);
  EXPECT_TRUE(Generate(*stub_, ok).status.ok());
}

TEST_F(GrpcServerTest, CancellingTheCallStopsGenerationAndFreesKv) {
  v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.set_max_tokens(450);
  req.set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse msg;
  int read = 0;
  while (read < 3 && reader->Read(&msg)) ++read;
  ASSERT_EQ(read, 3);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  bool idle = false;
  for (int i = 0; i < 500 && !idle; ++i) {
    const ServingGauges g = server_->queue().gauges();
    idle = g.running == 0 && g.queued == 0;
    if (!idle) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(idle);
  EXPECT_EQ(server_->queue().gauges().kv_blocks_used, 0);
  const std::string metrics = server_->metrics().Render(server_->queue().gauges());
  EXPECT_NE(metrics.find("specinfer_sequences_finished_total{reason=\"cancelled\"}"),
            std::string::npos);
}

TEST_F(GrpcServerTest, TokenizeDetokenizeModelsHealth) {
  grpc::ClientContext c1;
  v1::TokenizeRequest treq;
  treq.set_text("Once upon a time");
  treq.set_add_bos(true);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub_->Tokenize(&c1, treq, &tresp).ok());
  ASSERT_GT(tresp.token_ids_size(), 1);
  EXPECT_EQ(tresp.token_ids(0), 1);  // llama2.c BOS

  grpc::ClientContext c2;
  v1::DetokenizeRequest dreq;
  dreq.mutable_token_ids()->CopyFrom(tresp.token_ids());
  v1::DetokenizeResponse dresp;
  ASSERT_TRUE(stub_->Detokenize(&c2, dreq, &dresp).ok());
  EXPECT_NE(dresp.text().find("Once upon a time"), std::string::npos) << dresp.text();

  grpc::ClientContext c3;
  dreq.add_token_ids(-5);
  EXPECT_EQ(stub_->Detokenize(&c3, dreq, &dresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  grpc::ClientContext c4;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub_->ListModels(&c4, v1::ListModelsRequest(), &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), "stories");
  EXPECT_EQ(models.models(0).context_length(), 512);
  EXPECT_EQ(models.models(0).vocab_size(), 512);

  grpc::ClientContext c5;
  v1::HealthResponse health;
  ASSERT_TRUE(stub_->Health(&c5, v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.status(), v1::HealthResponse::SERVING);

  grpc::ClientContext c6;
  v1::TokenizeRequest other = treq;
  other.set_model("other");
  EXPECT_EQ(stub_->Tokenize(&c6, other, &tresp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(GrpcServerAuth, ApiKeyInMetadata) {
  auto server = StartServer("secret");
  ASSERT_TRUE(server);
  auto stub = Connect(*server);
  v1::GenerateRequest req;
  req.set_text("hi");
  req.set_max_tokens(2);
  EXPECT_EQ(Generate(*stub, req).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Wrong keys: another key, one byte differing, a prefix of the key, the key and more.
  for (const char* wrong : {"wrong", "secreT", "secre", "secret1"}) {
    EXPECT_EQ(Generate(*stub, req, wrong).status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << wrong;
  }
  EXPECT_TRUE(Generate(*stub, req, "secret").status.ok());
  // The key without "Bearer ", and the unary calls, are checked the same way.
  auto tokenize = [&](const std::string& authorization) {
    grpc::ClientContext c;
    if (!authorization.empty()) c.AddMetadata("authorization", authorization);
    v1::TokenizeRequest t;
    t.set_text("hi");
    v1::TokenizeResponse r;
    return stub->Tokenize(&c, t, &r).error_code();
  };
  EXPECT_EQ(tokenize(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(tokenize("secret"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(tokenize("Bearer secreT"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(tokenize("Bearer secret"), grpc::StatusCode::OK);
  grpc::ClientContext ctx;  // health needs no key (probes)
  v1::HealthResponse health;
  EXPECT_TRUE(stub->Health(&ctx, v1::HealthRequest(), &health).ok());
}

}  // namespace
}  // namespace specinfer
