// Serving with more concurrent requests than a model draft has sessions (issue #18): every
// request naming the draft succeeds, the ones beyond its sessions run without it, and greedy
// outputs equal those without speculation.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <thread>

#include "proto/specinfer.grpc.pb.h"
#include "server/inference_server.h"
#include "server_test_util.h"
#include "spec/speculator.h"

namespace specinfer {
namespace {

using namespace std::chrono_literals;

struct Reply {
  grpc::Status status;
  std::vector<int32_t> tokens;
};

Reply Generate(v1::SpecInfer::Stub& stub, const v1::GenerateRequest& req) {
  Reply r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 120s);
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg))
    r.tokens.insert(r.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
  r.status = reader->Finish();
  return r;
}

TEST(DraftSessionsServer, ConcurrentRequestsBeyondTheDraftsSessionsAllSucceed) {
  const std::string draft = "model:" + testing::Stories260KModel();
  // The engine runs 3 sequences; the draft (stories260K as its own draft) keeps KV for one.
  EngineOptions eo;
  eo.model_path = testing::Stories260KModel();
  eo.tokenizer_path = testing::Stories260KTokenizer();
  eo.num_threads = 1;
  eo.max_sequences = 3;
  eo.speculator_factory =
      [&draft](std::shared_ptr<const Model> model,
               const Tokenizer& tok) -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
    SpeculatorOptions so;
    so.max_sequences = 1;
    so.num_threads = 1;
    so.llm_tokenizer = &tok;
    SI_ASSIGN_OR_RETURN(auto s, CreateSpeculator(draft, model, so));
    std::vector<std::unique_ptr<Speculator>> out;
    out.push_back(std::move(s));
    return out;
  };
  auto engine = Engine::Create(eo);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  InferenceServerOptions o;
  o.served_model_name = "stories";
  o.http.port = 0;
  o.grpc.port = 0;
  o.queue.batch.max_sequences = 3;
  auto server = InferenceServer::Start(std::move(engine).value(), std::move(o));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto stub = v1::SpecInfer::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*server)->grpc_port()), grpc::InsecureChannelCredentials()));

  const char* texts[] = {"Once upon a time", "The cat sat on the mat", "Lily and Ben"};
  constexpr int kN = 3;
  std::vector<v1::GenerateRequest> reqs(kN);
  std::vector<Reply> plain(kN), spec(kN);
  for (int i = 0; i < kN; ++i) {
    reqs[i].set_text(texts[i]);
    reqs[i].mutable_sampling()->set_temperature(0);
    reqs[i].set_max_tokens(480);  // together more than the draft's one context
    reqs[i].set_ignore_eos(true);
    plain[i] = Generate(*stub, reqs[i]);
    ASSERT_TRUE(plain[i].status.ok()) << plain[i].status.error_message();
    auto* s = reqs[i].mutable_speculation();
    s->set_enabled(true);
    if (i == 2) s->add_draft("ngram:2");  // `ngram + model`
    s->add_draft(draft);
    for (int w : {2, 2, 1}) s->add_tree(w);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) threads.emplace_back([&, i] { spec[i] = Generate(*stub, reqs[i]); });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(spec[i].status.ok()) << i << ": " << spec[i].status.error_message();
    EXPECT_EQ(spec[i].tokens, plain[i].tokens) << i;
  }
}

}  // namespace
}  // namespace specinfer
