// An LLM split tensor-parallel x pipeline-parallel over in-process LlmWorkerServers (Gloo over
// loopback) must give logits bit-identical to the single-process CpuModelRunner, pass for pass
// (prefill, decode, several sequences, token trees, masked KV, MoveKv), and greedy generation
// through EngineCore (with and without speculators) must equal the local engine's token for
// token. Workers of another model or vocabulary, or in the wrong place, are refused by Connect.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <tuple>

#include "backend/cpu/shard_runner.h"
#include "dist/model_identity.h"
#include "engine/engine_core.h"
#include "llm_test_util.h"
#include "model/loader.h"
#include "model/random_model.h"
#include "spec/speculator.h"
#include "spec/token_tree.h"
#include "test_util.h"

namespace specinfer {
namespace {

using testing::LlmTestGroup;

using testing::GenerateAll;
using testing::LoadStories;
using testing::Stories;

// Grouped-query attention (6 query heads on 2 KV heads), odd hidden size and vocabulary (uneven
// TP shares of the feed-forward and the output matrix), untied output, 3 layers.
std::shared_ptr<const Model> RandomGqaModel() {
  static std::shared_ptr<const Model> m = [] {
    ModelConfig c;
    c.dim = 96, c.hidden_dim = 101, c.n_layers = 3, c.n_heads = 6, c.n_kv_heads = 2;
    c.head_dim = 16, c.vocab_size = 97, c.max_seq_len = 128, c.tied_output = false;
    auto r = MakeRandomModel(c, 42);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::shared_ptr<const Model>(std::move(*r));
  }();
  return m;
}

void ExpectSameLogits(const std::vector<std::vector<float>>& want,
                      const std::vector<std::vector<float>>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t p = 0; p < want.size(); ++p) {
    ASSERT_EQ(want[p].size(), got[p].size()) << "pass " << p;
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < want[p].size(); ++i)
      if (std::memcmp(&want[p][i], &got[p][i], sizeof(float)) != 0 && diff++ == 0) first = i;
    EXPECT_EQ(diff, 0u) << "pass " << p << ": " << diff << " of " << want[p].size()
                        << " logits differ; first at " << first << ": " << want[p][first]
                        << " vs " << got[p][first];
  }
}

class LlmGroupExactness
    : public ::testing::TestWithParam<std::tuple<std::string, int32_t, int32_t>> {};

TEST_P(LlmGroupExactness, LogitsBitIdenticalToCpuRunner) {
  const auto& [which, tp, pp] = GetParam();
  std::shared_ptr<const Model> model =
      which == "stories260K" ? LoadStories().model : RandomGqaModel();
  const uint64_t fp = which == "stories260K" ? LoadStories().fingerprint : 1234;
  auto group = testing::StartLlmGroup(model, fp, tp, pp);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), model, fp);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  auto local = testing::MakeLocalRunner(model, (*remote)->num_kv_blocks());
  KvCacheManager remote_kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());

  const auto want = testing::RunScenario(*local.runner, *local.kv);
  const auto got = testing::RunScenario(**remote, remote_kv);
  ExpectSameLogits(want, got);
  // Nothing but ids, ranges, tables and logits went through gRPC.
  const auto traffic = (*remote)->traffic();
  EXPECT_EQ(traffic.passes, 6);
  EXPECT_GT(traffic.response_bytes, 0);
  // Argmax rows: each last-stage rank's argmax over its columns, combined by the client.
  testing::ExpectArgmaxRowsMatchLogits(
      **remote, remote_kv, {1, 20, 31, 45, 7, 60, 13, 21, 90 % model->config().vocab_size});
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, LlmGroupExactness,
    ::testing::Values(std::make_tuple("stories260K", 1, 1), std::make_tuple("stories260K", 2, 1),
                      std::make_tuple("stories260K", 1, 2), std::make_tuple("stories260K", 2, 2),
                      std::make_tuple("stories260K", 4, 1), std::make_tuple("gqa", 2, 1),
                      std::make_tuple("gqa", 1, 3), std::make_tuple("gqa", 2, 2)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param)) + "_pp" +
             std::to_string(std::get<2>(info.param));
    });

// The default model, Q4_1 weights (row shares of quantized matrices) with 3 KV heads: TP=3 x PP=2
// over 6 workers sharing the one mapped model in this process.
TEST(LlmGroupQuantized, SmolLM2Q41Tp3Pp2BitIdentical) {
  if (testing::DefaultModel().empty()) GTEST_SKIP() << "models/SmolLM2-135M-Instruct.Q4_1.gguf absent";
  auto loaded = LoadModelAndTokenizer(testing::DefaultModel(), "");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  loaded->model->set_context_length(256);
  const uint64_t fp = VocabFingerprint(*loaded->tokenizer);
  std::shared_ptr<const Model> model(std::move(loaded->model));
  ASSERT_EQ(model->weights().layers[0].wq.type, DType::kQ4_1);
  auto group = testing::StartLlmGroup(model, fp, 3, 2);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), model, fp);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  auto local = testing::MakeLocalRunner(model, (*remote)->num_kv_blocks());
  KvCacheManager remote_kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());
  const auto t0 = std::chrono::steady_clock::now();
  const auto want = testing::RunScenario(*local.runner, *local.kv);
  const auto t1 = std::chrono::steady_clock::now();
  const auto got = testing::RunScenario(**remote, remote_kv);
  const auto t2 = std::chrono::steady_clock::now();
  ExpectSameLogits(want, got);
  const auto t = (*remote)->traffic();
  std::printf("[SmolLM2 Q4_1 tp=3 pp=2] scenario: local %.0f ms, group %.0f ms; per pass %.0f "
              "request bytes (6 workers), %.0f response bytes\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count(),
              double(t.request_bytes) / t.passes, double(t.response_bytes) / t.passes);
}

TEST(LlmShard, SplitsAreEvenAndCoverEverything) {
  EXPECT_EQ(SplitEvenly(5, 2, 0).begin, 0);
  EXPECT_EQ(SplitEvenly(5, 2, 0).count, 3);
  EXPECT_EQ(SplitEvenly(5, 2, 1).begin, 3);
  EXPECT_EQ(SplitEvenly(5, 2, 1).count, 2);
  EXPECT_EQ(SplitEvenly(97, 4, 3).end(), 97);
  ModelConfig c = LoadStories().model->config();  // 4 KV heads, 5 layers
  EXPECT_TRUE(CheckShardable(c, {0, 5, 0, 4}).ok());
  Status s = CheckShardable(c, {0, 1, 0, 3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not divide"), std::string::npos) << s.message();
  EXPECT_EQ(CheckShardable(c, {0, 6, 0, 1}).code(), StatusCode::kInvalidArgument);
  // A worker refuses to start with such a layout.
  LlmWorkerOptions o;
  o.tp_size = 3;
  o.num_threads = 1;
  EXPECT_EQ(LlmWorkerServer::Start(o, LoadStories().model, 1).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LlmGroupGeneration, GreedyTp2Pp2EqualsLocalEngineWithAndWithoutSpeculation) {
  const Stories& st = LoadStories();
  auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 2);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  auto local = testing::MakeLocalRunner(st.model, (*remote)->num_kv_blocks());
  KvCacheManager remote_kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());

  SpeculatorOptions so;
  so.num_threads = 1;
  auto ngram = CreateSpeculator("ngram", st.model, so);
  ASSERT_TRUE(ngram.ok()) << ngram.status().ToString();
  auto layers = CreateSpeculator("layers:2", st.model, so);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();

  std::vector<GenerateRequest> reqs;
  const char* prompts[] = {"Once upon a time", "Lily and Ben went to the park. They saw",
                           "The cat", "One day, a little girl named Lily found a needle"};
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r;
    r.prompt_tokens = st.Encode(prompts[i]);
    r.max_new_tokens = 40;
    r.prefill_chunk = 7;
    if (i == 1) {
      r.speculators = {ngram->get()};
      r.tree_shape = *TreeShape::Parse("1,1,1");
    } else if (i == 2) {
      r.speculators = {layers->get(), ngram->get()};
      r.tree_shape = *TreeShape::Parse("2,1,2");
    }
    reqs.push_back(r);
  }
  const auto want = GenerateAll(*local.runner, *local.kv, reqs);
  const auto got = GenerateAll(**remote, remote_kv, reqs);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].size(), 40u) << i;
    EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
  const auto t = (*remote)->traffic();
  std::printf("[llm group tp=2 pp=2] %lld passes, %.0f request bytes and %.0f response bytes "
              "per pass (4 workers), worker compute %.1f ms, collectives %.1f ms per pass\n",
              static_cast<long long>(t.passes), double(t.request_bytes) / t.passes,
              double(t.response_bytes) / t.passes, 1e3 * t.worker_compute_seconds / t.passes,
              1e3 * t.worker_collective_seconds / t.passes);
}

// Greedy sequences whose callback reads no logits (GenerateRequest::callback_logits false) get
// argmax rows: the last stage's workers answer one id and value per row and rank instead of the
// row's logits. Same tokens as with logits, token for token, and far fewer response bytes.
TEST(LlmGroupGeneration, GreedyArgmaxRowsCrossTheNetworkInsteadOfLogits) {
  const Stories& st = LoadStories();
  auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 1);
  ASSERT_TRUE(group);
  SpeculatorOptions so;
  so.num_threads = 1;
  auto layers = CreateSpeculator("layers:2", st.model, so);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  std::vector<GenerateRequest> reqs;
  for (const char* p : {"Once upon a time", "The cat sat on the mat", "One day, Lily"}) {
    GenerateRequest r;
    r.prompt_tokens = st.Encode(p);
    r.max_new_tokens = 30;
    r.sampling.temperature = 0;
    r.speculators = {layers->get()};
    r.tree_shape = *TreeShape::Parse("2,1,1");
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> tokens[2];
  double bytes_per_pass[2];
  for (bool logits : {true, false}) {
    auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    KvCacheManager kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());
    for (GenerateRequest& r : reqs) r.callback_logits = logits;
    tokens[logits] = GenerateAll(**remote, kv, reqs, /*prefix_cache=*/false);
    const auto t = (*remote)->traffic();
    bytes_per_pass[logits] = double(t.response_bytes) / t.passes;
  }
  EXPECT_EQ(tokens[false], tokens[true]);
  for (const auto& t : tokens[false]) EXPECT_EQ(t.size(), 30u);
  std::printf(
      "[llm group tp=2, greedy trees 2,1,1] response bytes per pass: logits %.0f, argmax "
      "rows %.0f\n",
      bytes_per_pass[true], bytes_per_pass[false]);
  // A pass's rows cost 2 x 256 floats each with logits, 2 x (id + value) with argmax rows.
  EXPECT_LT(bytes_per_pass[false] * 10, bytes_per_pass[true]);
}

// Sampled requests that read no logits, over CPU groups (TP 1 with one stage or two; TP 2,
// whose last-stage ranks gather those rows' columns over Gloo first): a token tree's nodes and a
// plain decode step's draw come back as distributions (what top-k/top-p keep), the draw is made
// in the manager at the sequence's uniform, and the tokens equal the local engine's (logits rows
// for trees, draws on the host), token for token. The same requests reading logits take several
// times the bytes back.
TEST(LlmGroupGeneration, SampledTreesAndDrawsComeBackAsDistributionsFromCpuGroups) {
  const Stories& st = LoadStories();
  SpeculatorOptions so;
  so.num_threads = 1;
  auto layers = CreateSpeculator("layers:2", st.model, so);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  const auto reqs =
      testing::SampledRequests(st, layers->get(), 16, /*seed=*/11, /*prefill_chunk=*/7);
  for (const auto& [tp, pp] : {std::make_pair(1, 1), std::make_pair(1, 2), std::make_pair(2, 1)}) {
    const std::string what = "tp " + std::to_string(tp) + " pp " + std::to_string(pp);
    auto group = testing::StartLlmGroup(st.model, st.fingerprint, tp, pp);
    ASSERT_TRUE(group) << what;
    auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    auto local = testing::MakeLocalRunner(st.model, (*remote)->num_kv_blocks());
    KvCacheManager remote_kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());
    const auto want = GenerateAll(*local.runner, *local.kv, reqs);
    testing::ExpectDistributionRowsGiveTokensForFewerBytes(**remote, remote_kv, reqs, want, what);
  }
}

// Prefix caching in the manager: the workers only see block tables in which blocks are shared
// between sequences (and MoveKv of a tree next to shared blocks). Greedy output over the group
// with the cache on equals the local engine with it off, in a first round (concurrent sequences
// sharing a prompt prefix) and a second one that reuses the cached blocks.
TEST(LlmGroupGeneration, PrefixCachingOverTheGroupEqualsTheLocalEngineWithout) {
  const Stories& st = LoadStories();
  auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 1);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  auto local = testing::MakeLocalRunner(st.model, (*remote)->num_kv_blocks());
  KvCacheManager remote_kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());
  SpeculatorOptions so;
  so.num_threads = 1;
  auto ngram = CreateSpeculator("ngram", st.model, so);
  ASSERT_TRUE(ngram.ok()) << ngram.status().ToString();

  const std::vector<int32_t> system = st.Encode(
      "Lily and Ben went to the park. They saw a big dog. The dog was happy and ran to them. "
      "They played all day.");
  std::vector<GenerateRequest> reqs;
  const char* questions[] = {" Once upon a time", " The cat", " One day", " Tom"};
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r;
    r.prompt_tokens = system;
    const auto q = st.Encode(questions[i]);
    r.prompt_tokens.insert(r.prompt_tokens.end(), q.begin() + 1, q.end());
    r.max_new_tokens = 24;
    r.prefill_chunk = 7;
    if (i % 2) {
      r.speculators = {ngram->get()};
      r.tree_shape = *TreeShape::Parse("2,1,1");
    }
    reqs.push_back(r);
  }
  const auto want = GenerateAll(*local.runner, *local.kv, reqs, /*prefix_cache=*/false);
  for (int round = 0; round < 2; ++round) {
    int32_t cached = 0;
    const auto got = GenerateAll(**remote, remote_kv, reqs, /*prefix_cache=*/true, &cached);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got[i], want[i]) << "round " << round << ", request " << i;
    if (round == 1) {
      EXPECT_GE(cached, 4 * 16) << "the second round reuses the cached prompts";
    }
  }
  EXPECT_GT(remote_kv.prefix_stats().hit_tokens, 0);
}

// Workers as the CLI starts them: from the model files, with a shorter context.
TEST(LlmGroupRegistration, WorkersStartFromModelFiles) {
  const Stories& st = LoadStories();
  std::vector<std::unique_ptr<LlmWorkerServer>> workers;
  LlmGroupOptions g;
  g.num_stages = 2;
  for (int32_t stage = 0; stage < 2; ++stage) {
    LlmWorkerOptions o;
    o.model_path = testing::Stories260KModel();
    o.tokenizer_path = testing::Stories260KTokenizer();
    o.stage = stage;
    o.num_stages = 2;
    o.num_threads = 1;
    o.context_length = 64;
    o.max_sequences = 2;
    auto w = LlmWorkerServer::Start(o);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    g.workers.push_back((*w)->address());
    workers.push_back(std::move(*w));
  }
  auto remote = RemoteLlmRunner::Connect(g, st.model, st.fingerprint);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EXPECT_EQ((*remote)->num_kv_blocks(), KvBlocksPerSequence(64, 16) * 2);
  auto local = testing::MakeLocalRunner(st.model, (*remote)->num_kv_blocks());
  KvCacheManager kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());
  ExpectSameLogits(testing::RunScenario(*local.runner, *local.kv),
                   testing::RunScenario(**remote, kv));
  // More KV than the workers hold is refused.
  g.kv_blocks = (*remote)->num_kv_blocks() + 1;
  EXPECT_EQ(RemoteLlmRunner::Connect(g, st.model, st.fingerprint).status().code(),
            StatusCode::kInvalidArgument);
  // ... and leaves the connected group serving.
  const auto again = testing::RunScenario(**remote, kv);
  EXPECT_EQ(again, testing::RunScenario(*local.runner, *local.kv));
  EXPECT_EQ((*remote)->epoch(), 1u);
  LlmWorkerOptions missing;
  missing.model_path = "/nonexistent/model.bin";
  EXPECT_FALSE(LlmWorkerServer::Start(missing).ok());
}

TEST(LlmGroupRegistration, RefusesAnotherModelVocabularyOrPlace) {
  const Stories& st = LoadStories();
  // Another model (the random GQA one) as stage 1.
  {
    auto group = testing::StartLlmGroup(st.model, st.fingerprint, 1, 2);
    ASSERT_TRUE(group);
    auto other = std::make_unique<LlmTestGroup>();
    other->model = RandomGqaModel();
    other->fingerprint = st.fingerprint;
    other->tp = 1;
    other->pp = 2;
    ASSERT_TRUE(other->StartWorker(1).ok());
    LlmGroupOptions o = group->GroupOptions();
    o.workers[1] = other->addresses[1];
    auto r = RemoteLlmRunner::Connect(o, st.model, st.fingerprint);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("LLM worker " + other->addresses[1] + " (stage 1, tp 0)"),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("dim=96"), std::string::npos) << r.status().message();
  }
  // The same model with another vocabulary.
  {
    auto group = testing::StartLlmGroup(st.model, st.fingerprint ^ 1, 2, 1);
    ASSERT_TRUE(group);
    auto r = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("vocabulary"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(group->addresses[0]), std::string::npos);
  }
  // Right model, workers listed in the wrong order.
  {
    auto group = testing::StartLlmGroup(st.model, st.fingerprint, 2, 1);
    ASSERT_TRUE(group);
    LlmGroupOptions o = group->GroupOptions();
    std::swap(o.workers[0], o.workers[1]);
    auto r = RemoteLlmRunner::Connect(o, st.model, st.fingerprint);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("tp 1"), std::string::npos) << r.status().message();
  }
  // Nobody listening.
  {
    LlmGroupOptions o;
    o.workers = {"127.0.0.1:1"};
    o.rpc_timeout = std::chrono::milliseconds(2000);
    auto r = RemoteLlmRunner::Connect(o, st.model, st.fingerprint);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find("LLM worker 127.0.0.1:1 (stage 0, tp 0) unavailable"),
              std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace specinfer
