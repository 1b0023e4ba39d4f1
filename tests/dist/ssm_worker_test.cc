// SSM workers and the data-parallel RemoteSpeculator: token trees cross the wire exactly (sparse
// q included), malformed messages are rejected in both directions, a worker with another
// vocabulary is refused at registration, and killing replicas mid-generation falls back to the
// other replica and then to plain decoding with greedy output unchanged.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "dist/model_identity.h"
#include "dist/ssm_client.h"
#include "dist/ssm_wire.h"
#include "dist/ssm_worker.h"
#include "engine/engine_core.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "proto/ssm_worker.grpc.pb.h"
#include "server/grpc_listen.h"
#include "test_util.h"

namespace specinfer {
namespace {

SsmWorkerOptions WorkerOptions(const std::string& spec = "layers:2") {
  SsmWorkerOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.speculator = spec;
  o.num_threads = 1;
  o.max_sessions = 4;
  return o;
}

std::string Address(const SsmWorkerServer& w) { return "127.0.0.1:" + std::to_string(w.port()); }

struct Llm {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  uint64_t fingerprint = 0;
};

Llm LoadLlm() {
  auto loaded = LoadModelAndTokenizer(testing::Stories260KModel(), testing::Stories260KTokenizer());
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  Llm l;
  l.model = std::shared_ptr<const Model>(std::move(loaded->model));
  l.tokenizer = std::move(loaded->tokenizer);
  l.fingerprint = VocabFingerprint(*l.tokenizer);
  return l;
}

RemoteSpeculatorOptions ClientOptions(const Llm& llm, std::vector<std::string> replicas) {
  RemoteSpeculatorOptions o;
  o.replicas = std::move(replicas);
  o.name = "layers:2";
  o.vocab_size = llm.model->config().vocab_size;
  o.vocab_fingerprint = llm.fingerprint;
  o.rpc_timeout = std::chrono::milliseconds(3000);
  o.probe_interval = std::chrono::milliseconds(100);
  return o;
}

// Everything a tree holds, compared exactly (distributions bit for bit).
void ExpectSameTree(const TokenTree& a, const TokenTree& b) {
  ASSERT_EQ(a.size(), b.size());
  int32_t dists = 0;
  for (int32_t v = 0; v < a.size(); ++v) {
    const TreeNode& x = a.node(v);
    const TreeNode& y = b.node(v);
    EXPECT_EQ(x.token, y.token) << v;
    EXPECT_EQ(x.parent, y.parent) << v;
    EXPECT_EQ(x.depth, y.depth) << v;
    EXPECT_EQ(x.proposers, y.proposers) << v;
    EXPECT_EQ(x.children, y.children) << v;
    ASSERT_EQ(x.trials.size(), y.trials.size()) << v;
    for (size_t t = 0; t < x.trials.size(); ++t) {
      EXPECT_EQ(x.trials[t].child, y.trials[t].child);
      EXPECT_EQ(x.trials[t].speculator, y.trials[t].speculator);
      EXPECT_EQ(x.trials[t].dist, y.trials[t].dist);
      dists = std::max(dists, x.trials[t].dist + 1);
    }
  }
  for (int32_t d = 0; d < dists; ++d) {
    const auto p = a.distribution(d), q = b.distribution(d);
    ASSERT_EQ(p.size(), q.size());
    EXPECT_EQ(0, std::memcmp(p.data(), q.data(), p.size() * sizeof(float))) << "dist " << d;
  }
}

std::vector<int32_t> Prompt(const Tokenizer& tok) {
  auto ids = tok.Encode("Once upon a time, there was a little girl", true);
  EXPECT_TRUE(ids.ok());
  return *ids;
}

TEST(SsmWire, SampledTreeRoundTripsExactlyWithSparseQ) {
  Llm llm = LoadLlm();
  SpeculatorOptions so;
  so.num_threads = 1;
  auto spec = CreateSpeculator("layers:2", llm.model, so);
  ASSERT_TRUE(spec.ok());
  auto session = (*spec)->StartSession();
  ASSERT_TRUE(session.ok());
  const std::vector<int32_t> tokens = Prompt(*llm.tokenizer);
  TreeShape shape{{2, 2, 1}};
  SamplingParams sampling;
  sampling.temperature = 0.9f;
  sampling.top_k = 20;  // q has exact zeros: the sparse form must keep them
  Rng rng(7);
  DraftContext ctx{tokens, &shape, 3, &sampling, &rng, 5};
  auto tree = (*session)->Propose(ctx);
  ASSERT_TRUE(tree.ok());
  ASSERT_GT(tree->size(), 3);
  worker::TokenTreeProto proto;
  TreeToProto(*tree, &proto);
  ASSERT_GT(proto.dists_size(), 0);
  EXPECT_LE(proto.dists(0).ids_size(), 20);  // sparse: top-k entries only
  auto back = TreeFromProto(proto, llm.model->config().vocab_size, tokens.back(), 3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameTree(*tree, *back);
}

TEST(SsmWire, MalformedTreesAreRejected) {
  Llm llm = LoadLlm();
  const int32_t vocab = llm.model->config().vocab_size;
  TokenTree tree(5);
  std::vector<float> q(static_cast<size_t>(vocab), 0.0f);
  q[7] = 0.75f;
  q[9] = 0.25f;
  const int32_t d = tree.AddDistribution(q);
  tree.Propose(0, 7, 0, d);
  tree.Propose(0, 9, 0, d);
  tree.Propose(1, 11, 0);
  worker::TokenTreeProto good;
  TreeToProto(tree, &good);
  ASSERT_TRUE(TreeFromProto(good, vocab, 5, 4).ok());

  struct Case {
    const char* what;
    std::function<void(worker::TokenTreeProto&)> corrupt;
  };
  const std::vector<Case> cases = {
      {"no nodes", [](auto& p) { p.clear_nodes(); }},
      {"root token", [](auto& p) { p.mutable_nodes(0)->set_token(6); }},
      {"parent after child", [](auto& p) { p.mutable_nodes(1)->set_parent(3); }},
      {"negative parent", [](auto& p) { p.mutable_nodes(2)->set_parent(-1); }},
      {"token outside vocab", [&](auto& p) { p.mutable_nodes(3)->set_token(vocab); }},
      {"trial of a non-child", [](auto& p) { p.mutable_nodes(0)->mutable_trials(0)->set_child(3); }},
      {"speculator 64", [](auto& p) { p.mutable_nodes(0)->mutable_trials(0)->set_speculator(64); }},
      {"missing distribution", [](auto& p) { p.mutable_nodes(0)->mutable_trials(0)->set_dist(1); }},
      {"q not summing to 1", [](auto& p) { p.mutable_dists(0)->set_probs(0, 0.5f); }},
      {"NaN q", [](auto& p) {
         p.mutable_dists(0)->set_probs(0, std::numeric_limits<float>::quiet_NaN());
       }},
      {"ids not ascending", [](auto& p) { p.mutable_dists(0)->set_ids(1, 7); }},
      {"sampled token with q 0", [](auto& p) { p.mutable_nodes(1)->set_token(8); }},
      {"proposer bits", [](auto& p) { p.mutable_nodes(1)->set_proposers(3); }},
      {"node never proposed", [](auto& p) { p.mutable_nodes(1)->mutable_trials()->Clear(); }},
      {"duplicate child token", [](auto& p) { p.mutable_nodes(2)->set_token(7); }},
      {"too deep", [](auto& p) { p.mutable_nodes(3)->set_parent(3); }},
  };
  for (const Case& c : cases) {
    worker::TokenTreeProto bad = good;
    c.corrupt(bad);
    auto r = TreeFromProto(bad, vocab, 5, 4);
    EXPECT_FALSE(r.ok()) << c.what;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.what;
    }
  }
  EXPECT_FALSE(TreeFromProto(good, vocab, 5, 1).ok()) << "deeper than max_depth";
}

TEST(SsmWorker, RemoteTreeEqualsLocalDraftForTheSameSeed) {
  auto worker = SsmWorkerServer::Start(WorkerOptions());
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  Llm llm = LoadLlm();
  auto remote = RemoteSpeculator::Connect(ClientOptions(llm, {Address(**worker)}));
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  SpeculatorOptions so;
  so.num_threads = 1;
  auto local = CreateSpeculator("layers:2", llm.model, so);
  ASSERT_TRUE(local.ok());
  auto rs = (*remote)->StartSession();
  auto ls = (*local)->StartSession();
  ASSERT_TRUE(rs.ok() && ls.ok());

  std::vector<int32_t> tokens = Prompt(*llm.tokenizer);
  TreeShape shape{{2, 2, 1}};
  for (const float temperature : {0.0f, 0.8f}) {
    SamplingParams sampling;
    sampling.temperature = temperature;
    sampling.top_k = temperature > 0 ? 30 : 0;
    for (int step = 0; step < 4; ++step) {
      Rng remote_rng(100 + step);
      Rng seed_rng(100 + step);
      DraftContext ctx{tokens, &shape, 3, &sampling, &remote_rng, 2};
      auto rt = (*rs)->Propose(ctx);
      ASSERT_TRUE(rt.ok()) << rt.status().ToString();
      // The worker draws from Rng(seed), the seed drawn from the request's stream.
      Rng local_rng(sampling.greedy() ? 0 : DrawSpeculationSeed(seed_rng));
      DraftContext lctx{tokens, &shape, 3, &sampling, &local_rng, 2};
      auto lt = (*ls)->Propose(lctx);
      ASSERT_TRUE(lt.ok());
      ASSERT_GT(rt->size(), 1);
      ExpectSameTree(*lt, *rt);
      tokens.push_back(rt->node(1).token);  // the sequence grows: deltas are sent from now on
    }
  }
}

TEST(SsmWorker, MalformedRequestsAreRejectedAndTheWorkerKeepsServing) {
  auto worker = SsmWorkerServer::Start(WorkerOptions());
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  auto stub = worker::SsmWorker::NewStub(
      grpc::CreateChannel(Address(**worker), grpc::InsecureChannelCredentials()));
  auto valid = [] {
    worker::SpeculateItem item;
    item.set_session("s1");
    for (int32_t t : {1, 403, 407, 261}) item.add_tokens(t);
    for (int32_t w : {1, 2}) item.add_widths(w);
    item.set_max_depth(2);
    item.mutable_sampling()->set_temperature(0);
    item.mutable_sampling()->set_top_p(1);
    return item;
  };
  auto call = [&](const worker::SpeculateRequest& req, worker::SpeculateResponse* resp) {
    grpc::ClientContext ctx;
    return stub->Speculate(&ctx, req, resp);
  };
  struct Case {
    const char* what;
    std::function<void(worker::SpeculateItem&)> corrupt;
  };
  const std::vector<Case> cases = {
      {"empty session", [](auto& i) { i.set_session(""); }},
      {"long session", [](auto& i) { i.set_session(std::string(200, 'x')); }},
      {"token outside vocab", [](auto& i) { i.set_tokens(1, 512); }},
      {"negative token", [](auto& i) { i.set_tokens(0, -3); }},
      {"no tokens", [](auto& i) { i.clear_tokens(); }},
      {"beyond the context", [](auto& i) { i.set_base(600); }},
      {"width 0", [](auto& i) { i.set_widths(0, 0); }},
      {"width 17", [](auto& i) { i.set_widths(0, 17); }},
      {"no widths", [](auto& i) { i.clear_widths(); }},
      {"negative max_depth", [](auto& i) { i.set_max_depth(-1); }},
      {"NaN temperature", [](auto& i) {
         i.mutable_sampling()->set_temperature(std::numeric_limits<float>::quiet_NaN());
       }},
      {"top_p 0", [](auto& i) { i.mutable_sampling()->set_top_p(0); }},
      {"speculator index 64", [](auto& i) { i.set_speculator_index(64); }},
      {"speculator not offered", [](auto& i) { i.set_speculator("ngram:3"); }},
  };
  for (const Case& c : cases) {
    worker::SpeculateRequest req;
    *req.add_items() = valid();
    c.corrupt(*req.mutable_items(0));
    worker::SpeculateResponse resp;
    const grpc::Status s = call(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
  }
  {
    worker::SpeculateRequest req;
    for (int i = 0; i < kMaxSpeculateItems + 1; ++i) *req.add_items() = valid();
    worker::SpeculateResponse resp;
    EXPECT_EQ(call(req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "too many";
  }
  // Still serving, and a delta against what the session does not hold asks for a resend.
  worker::SpeculateRequest req;
  *req.add_items() = valid();
  worker::SpeculateResponse resp;
  ASSERT_TRUE(call(req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0).outcome(), worker::SpeculateResult::OK);
  EXPECT_GT(resp.results(0).tree().nodes_size(), 1);
  req.mutable_items(0)->set_base(9);
  resp.Clear();
  ASSERT_TRUE(call(req, &resp).ok());
  EXPECT_EQ(resp.results(0).outcome(), worker::SpeculateResult::RESYNC);
}

// One call with several sequences' items (drafted together, one pass per tree level) answers
// exactly what one call per item does, over steps that send deltas; an item repeating a session
// of the same call is served after the earlier one.
TEST(SsmWorker, MultiItemSpeculateAnswersEqualSingleItemOnes) {
  auto together = SsmWorkerServer::Start(WorkerOptions());
  auto alone = SsmWorkerServer::Start(WorkerOptions());
  ASSERT_TRUE(together.ok() && alone.ok());
  auto stub = [](const SsmWorkerServer& w) {
    return worker::SsmWorker::NewStub(
        grpc::CreateChannel(Address(w), grpc::InsecureChannelCredentials()));
  };
  auto t_stub = stub(**together), a_stub = stub(**alone);
  auto call = [](worker::SsmWorker::Stub& st, const worker::SpeculateRequest& req) {
    grpc::ClientContext ctx;
    worker::SpeculateResponse resp;
    EXPECT_TRUE(st.Speculate(&ctx, req, &resp).ok());
    return resp;
  };
  // Three sequences of different lengths, greedy and sampled, different shapes.
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 403, 407, 261}, {1, 9, 30, 99, 250, 7, 400, 12, 18, 77, 301, 45, 3, 5, 6, 8, 11, 14, 20},
      {1, 33}};
  const std::vector<std::vector<int32_t>> shapes = {{2, 2, 1}, {1, 1, 1, 1}, {3, 2}};
  std::vector<std::vector<int32_t>> tokens = prompts;
  std::vector<uint32_t> held(prompts.size(), 0);
  auto item_for = [&](size_t i, int step) {
    worker::SpeculateItem item;
    item.set_session("s" + std::to_string(i));
    item.set_base(held[i]);
    for (size_t t = held[i]; t < tokens[i].size(); ++t) item.add_tokens(tokens[i][t]);
    for (int32_t w : shapes[i]) item.add_widths(w);
    item.set_max_depth(static_cast<int32_t>(shapes[i].size()));
    item.mutable_sampling()->set_temperature(i == 1 ? 0.0f : 0.8f);
    item.mutable_sampling()->set_top_p(1);
    item.set_seed(1000 + 10 * i + static_cast<uint64_t>(step));
    item.set_speculator_index(static_cast<int32_t>(i));
    return item;
  };
  for (int step = 0; step < 4; ++step) {
    worker::SpeculateRequest many;
    std::vector<worker::SpeculateResponse> singles;
    for (size_t i = 0; i < prompts.size(); ++i) {
      *many.add_items() = item_for(i, step);
      worker::SpeculateRequest one;
      *one.add_items() = item_for(i, step);
      singles.push_back(call(*a_stub, one));
    }
    const worker::SpeculateResponse resp = call(*t_stub, many);
    ASSERT_EQ(resp.results_size(), static_cast<int>(prompts.size()));
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(singles[i].results_size(), 1);
      EXPECT_EQ(resp.results(static_cast<int>(i)).outcome(), worker::SpeculateResult::OK);
      EXPECT_GT(resp.results(static_cast<int>(i)).tree().nodes_size(), 1);
      EXPECT_EQ(resp.results(static_cast<int>(i)).SerializeAsString(),
                singles[i].results(0).SerializeAsString())
          << "step " << step << " item " << i;
      // The sequence grows by the tree's first child and a token of "the LLM".
      held[i] = static_cast<uint32_t>(tokens[i].size());
      tokens[i].push_back(resp.results(static_cast<int>(i)).tree().nodes(1).token());
      tokens[i].push_back(static_cast<int32_t>(50 + 7 * step + i));
    }
  }
  // A session twice in one call: the second item is a delta on the first.
  worker::SpeculateRequest twice;
  *twice.add_items() = item_for(0, 9);
  held[0] = static_cast<uint32_t>(tokens[0].size());
  tokens[0].push_back(77);
  *twice.add_items() = item_for(0, 10);
  *twice.add_items() = item_for(2, 10);
  const worker::SpeculateResponse resp = call(*t_stub, twice);
  ASSERT_EQ(resp.results_size(), 3);
  for (int i = 0; i < 3; ++i) {
    worker::SpeculateRequest one;
    *one.add_items() = twice.items(i);
    const worker::SpeculateResponse single = call(*a_stub, one);
    EXPECT_EQ(resp.results(i).outcome(), worker::SpeculateResult::OK) << i;
    EXPECT_EQ(resp.results(i).SerializeAsString(), single.results(0).SerializeAsString()) << i;
  }
}

TEST(SsmWorker, WorkerWithAnotherVocabularyIsRefusedAtRegistration) {
  // The same model with one vocabulary piece changed ("<unk>" -> "<Unk>").
  std::ifstream in(testing::Stories260KTokenizer(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 16u);
  ASSERT_EQ(bytes.substr(12, 5), "<unk>");
  bytes[13] = 'U';
  const auto path = testing::ScratchDir("other_vocab") / "tok512.bin";
  testing::WriteFile(path, bytes);
  SsmWorkerOptions other = WorkerOptions();
  other.tokenizer_path = path.string();
  auto bad = SsmWorkerServer::Start(other);
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  auto good = SsmWorkerServer::Start(WorkerOptions());
  ASSERT_TRUE(good.ok());
  Llm llm = LoadLlm();

  auto alone = RemoteSpeculator::Connect(ClientOptions(llm, {Address(**bad)}));
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(alone.status().message().find("fingerprint"), std::string::npos)
      << alone.status().message();

  auto mixed = RemoteSpeculator::Connect(ClientOptions(llm, {Address(**good), Address(**bad)}));
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  using S = RemoteSpeculator::ReplicaState;
  EXPECT_EQ((*mixed)->replica_states(), (std::vector<S>{S::kLive, S::kRefused}));
  // Re-probing keeps it refused; sessions only ever go to the good one.
  (*mixed)->ProbeNow();
  EXPECT_EQ((*mixed)->replica_states()[1], S::kRefused);

  // A worker offering another speculator is refused too.
  auto ngram = SsmWorkerServer::Start(WorkerOptions("ngram:3"));
  ASSERT_TRUE(ngram.ok());
  auto wrong = RemoteSpeculator::Connect(ClientOptions(llm, {Address(**ngram)}));
  EXPECT_FALSE(wrong.ok());
}

// An engine whose only speculator is a RemoteSpeculator over `replicas`.
std::unique_ptr<Engine> EngineWithRemote(const std::vector<std::string>& replicas,
                                         RemoteSpeculator** remote, int32_t max_sequences = 1) {
  EngineOptions o;
  o.max_sequences = max_sequences;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  // Full trees every step: these tests are about the remote path, which the adaptive controller
  // rightly stops using once layers:2's drafts on stories260K keep failing.
  o.spec_budget = SpecBudgetMode::kStatic;
  o.speculator_factory = [&](std::shared_ptr<const Model> model, const Tokenizer& tok)
      -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
    RemoteSpeculatorOptions ro;
    ro.replicas = replicas;
    ro.name = "layers:2";
    ro.vocab_size = model->config().vocab_size;
    ro.vocab_fingerprint = VocabFingerprint(tok);
    ro.probe_interval = std::chrono::seconds(60);  // no re-probe during the test
    SI_ASSIGN_OR_RETURN(auto s, RemoteSpeculator::Connect(ro));
    *remote = s.get();
    std::vector<std::unique_ptr<Speculator>> out;
    out.push_back(std::move(s));
    return out;
  };
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? std::move(*engine) : nullptr;
}

TEST(RemoteSpeculator, KillingReplicasMidStreamFallsBackThenDecodesPlainlyWithSameOutput) {
  auto w0 = SsmWorkerServer::Start(WorkerOptions());
  auto w1 = SsmWorkerServer::Start(WorkerOptions());
  ASSERT_TRUE(w0.ok() && w1.ok());
  RemoteSpeculator* remote = nullptr;
  auto engine = EngineWithRemote({Address(**w0), Address(**w1)}, &remote);
  ASSERT_TRUE(engine && remote);
  auto spec = engine->GetSpeculator("layers:2");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(*spec, remote) << "requests naming layers:2 get the remote speculator";

  GenerateRequest req;
  req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
  req.max_new_tokens = 240;
  req.sampling.temperature = 0;
  auto plain = engine->Generate(req);
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->tokens.size(), 240u);

  using S = RemoteSpeculator::ReplicaState;
  req.speculators = {remote};
  req.tree_shape = TreeShape{{1, 1, 2, 1}};
  int emitted = 0;
  std::vector<S> after_first;
  auto result = engine->Generate(req, [&](int32_t, std::span<const float>) {
    ++emitted;
    // The session is pinned to replica 0 (least loaded, first).
    if (emitted == 60) (*w0)->Shutdown();
    if (emitted == 150) {
      after_first = remote->replica_states();
      (*w1)->Shutdown();
    }
    return true;
  });
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->tokens, plain->tokens) << "greedy output must not change";
  EXPECT_EQ(after_first, (std::vector<S>{S::kDown, S::kLive}))
      << "replica 0 marked down, its session moved to replica 1";
  EXPECT_EQ(remote->replica_states(), (std::vector<S>{S::kDown, S::kDown}));
  EXPECT_EQ(remote->live_replicas(), 0);
  // Speculation ran (trees beyond the root were verified) before the replicas went.
  EXPECT_GT(result->stats.spec.tree_nodes, 0);
  std::printf("speculated %lld nodes, accepted %lld tokens, %d passes for 240 tokens\n",
              static_cast<long long>(result->stats.spec.tree_nodes),
              static_cast<long long>(result->stats.spec.accepted_tokens),
              result->stats.decode_passes);
}

TEST(RemoteSpeculator, BatchedSequencesSpreadOverReplicasWithOutputsUnchanged) {
  auto w0 = SsmWorkerServer::Start(WorkerOptions());
  auto w1 = SsmWorkerServer::Start(WorkerOptions());
  ASSERT_TRUE(w0.ok() && w1.ok());
  RemoteSpeculator* remote = nullptr;
  auto engine = EngineWithRemote({Address(**w0), Address(**w1)}, &remote, 4);
  ASSERT_TRUE(engine && remote);
  const std::vector<std::string> prompts = {"Once upon a time", "The cat", "Lily and Tom",
                                            "One day"};
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> plain;
  for (const std::string& p : prompts) {
    GenerateRequest req;
    req.prompt_tokens = *engine->EncodePrompt(p);
    req.max_new_tokens = 60;
    req.sampling.temperature = 0;
    auto r = engine->Generate(req);
    ASSERT_TRUE(r.ok());
    plain.push_back(r->tokens);
    req.speculators = {remote};
    req.tree_shape = TreeShape{{1, 2, 1}};
    reqs.push_back(req);
  }
  // Engine::Generate runs one sequence; here four share every step, as in the server.
  BatchOptions bo;
  bo.max_sequences = 4;
  bo.spec_budget = SpecBudgetMode::kStatic;  // every step drafts: the sessions counted below
  EngineCore batch(engine->runner(), engine->kv(), bo);
  std::vector<std::vector<int32_t>> got(prompts.size());
  int done = 0;
  std::vector<int32_t> most(2, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto a = batch.Add(
        reqs[i], nullptr, [&, i](StatusOr<GenerateResult> r) {
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          got[i] = r->tokens;
          ++done;
        });
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(*a, EngineCore::Admission::kAdmitted);
  }
  while (!batch.idle()) {
    batch.Step();
    const auto now = remote->replica_sessions();
    for (size_t r = 0; r < 2; ++r) most[r] = std::max(most[r], now[r]);
  }
  EXPECT_EQ(done, 4);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], plain[i]) << prompts[i];
  EXPECT_EQ(most, (std::vector<int32_t>{2, 2})) << "sessions spread over both replicas";
  EXPECT_EQ(remote->replica_sessions(), (std::vector<int32_t>{0, 0})) << "all released";
}

// A worker's front that records how many items each Speculate call carries and forwards
// every call to the real worker behind it.
class RecordingProxy final : public worker::SsmWorker::Service {
 public:
  explicit RecordingProxy(const std::string& target)
      : stub_(worker::SsmWorker::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}
  grpc::Status Info(grpc::ServerContext*, const worker::InfoRequest* req,
                    worker::InfoResponse* out) override {
    grpc::ClientContext ctx;
    return stub_->Info(&ctx, *req, out);
  }
  grpc::Status Health(grpc::ServerContext*, const worker::HealthRequest* req,
                      worker::HealthResponse* out) override {
    grpc::ClientContext ctx;
    return stub_->Health(&ctx, *req, out);
  }
  grpc::Status Speculate(grpc::ServerContext*, const worker::SpeculateRequest* req,
                         worker::SpeculateResponse* out) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(req->items_size());
    }
    grpc::ClientContext ctx;
    return stub_->Speculate(&ctx, *req, out);
  }
  grpc::Status Release(grpc::ServerContext*, const worker::ReleaseRequest* req,
                       worker::ReleaseResponse* out) override {
    grpc::ClientContext ctx;
    return stub_->Release(&ctx, *req, out);
  }
  std::vector<int> items() {
    std::lock_guard<std::mutex> lock(mu_);
    return items_;
  }

 private:
  std::unique_ptr<worker::SsmWorker::Stub> stub_;
  std::mutex mu_;
  std::vector<int> items_;  // items of each Speculate call
};

// The manager sends the items of all the sequences of a step pinned to one worker in one
// Speculate call, and greedy outputs stay those of plain decoding.
TEST(RemoteSpeculator, AStepsSequencesShareOneSpeculateCallPerWorker) {
  auto w = SsmWorkerServer::Start(WorkerOptions());
  ASSERT_TRUE(w.ok());
  RecordingProxy proxy(Address(**w));
  grpc::Service* const services[] = {&proxy};
  auto bound = BindGrpcServer(services, {.address = "127.0.0.1:0"});
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  RemoteSpeculator* remote = nullptr;
  auto engine =
      EngineWithRemote({"127.0.0.1:" + std::to_string(bound->port)}, &remote, 4);
  ASSERT_TRUE(engine && remote);
  const char* texts[] = {"Once upon a time", "The cat", "Lily and Ben", "One day"};
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> plain;
  for (const char* text : texts) {
    GenerateRequest r;
    r.prompt_tokens = *engine->EncodePrompt(text);
    r.max_new_tokens = 40;
    r.sampling.temperature = 0;
    auto g = engine->Generate(r);
    ASSERT_TRUE(g.ok());
    plain.push_back(g->tokens);
    r.speculators = {remote};
    r.tree_shape = *TreeShape::Parse("2,1,1");
    reqs.push_back(r);
  }
  BatchOptions o;
  o.max_sequences = 4;
  o.spec_budget = SpecBudgetMode::kStatic;
  EngineCore core(engine->runner(), engine->kv(), o);
  std::vector<std::optional<StatusOr<GenerateResult>>> done(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto a = core.Add(reqs[i], nullptr,
                      [&done, i](StatusOr<GenerateResult> r) { done[i] = std::move(r); });
    ASSERT_TRUE(a.ok() && *a == EngineCore::Admission::kAdmitted);
  }
  for (int steps = 0; !core.idle() && steps < 1000; ++steps) core.Step();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(done[i].has_value() && done[i]->ok()) << i;
    EXPECT_EQ((*done[i])->tokens, plain[i]) << "sequence " << i;
    EXPECT_GT((*done[i])->stats.spec.accepted_tokens, 0) << "sequence " << i;
  }
  const std::vector<int> items = proxy.items();
  ASSERT_FALSE(items.empty());
  EXPECT_EQ(*std::max_element(items.begin(), items.end()), 4)
      << "the four sequences' items never shared a call";
  bound->server->Shutdown();
}

TEST(RemoteSpeculator, ReplicaThatComesBackIsReprobedAndUsedAgain) {
  auto w0 = SsmWorkerServer::Start(WorkerOptions());
  ASSERT_TRUE(w0.ok());
  const std::string address = Address(**w0);
  Llm llm = LoadLlm();
  auto remote = RemoteSpeculator::Connect(ClientOptions(llm, {address}));
  ASSERT_TRUE(remote.ok());
  auto session = (*remote)->StartSession();
  ASSERT_TRUE(session.ok());
  std::vector<int32_t> tokens = Prompt(*llm.tokenizer);
  TreeShape shape{{1, 1}};
  SamplingParams greedy;
  greedy.temperature = 0;
  Rng rng(1);
  DraftContext ctx{tokens, &shape, 2, &greedy, &rng, 0};
  auto t1 = (*session)->Propose(ctx);
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(t1->size(), 3);

  (*w0)->Shutdown();
  w0->reset();
  // The probe thread's health check notices before any request does.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*remote)->live_replicas() == 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ((*remote)->live_replicas(), 0) << "a dead live replica is found by its health check";
  auto t2 = (*session)->Propose(ctx);
  ASSERT_TRUE(t2.ok()) << "a dead replica never fails the step";
  EXPECT_EQ(t2->size(), 1) << "no live replica: the root alone";

  SsmWorkerOptions again = WorkerOptions();
  again.listen = address;
  auto w0b = SsmWorkerServer::Start(again);
  ASSERT_TRUE(w0b.ok()) << w0b.status().ToString();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*remote)->live_replicas() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ((*remote)->live_replicas(), 1) << "re-probed and registered again";
  // The new worker holds nothing of the session: the client resends the whole sequence.
  tokens.push_back(t1->node(1).token);
  DraftContext ctx2{tokens, &shape, 2, &greedy, &rng, 0};
  auto t3 = (*session)->Propose(ctx2);
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(t3->size(), 3);
}

}  // namespace
}  // namespace specinfer
