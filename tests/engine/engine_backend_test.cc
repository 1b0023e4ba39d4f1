// How the engine uses the backend registry: its KV cache takes the runner's geometry, custom and
// registered backends serve the LLM and the drafts, bad backend names fail before loading.
#include <gtest/gtest.h>

#include <atomic>

#include "backend/registry.h"
#include "engine/engine.h"
#include "test_util.h"

namespace specinfer {
namespace {

EngineOptions StoriesOptions() {
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 2;
  return o;
}

// The CPU backend under another name, with KV blocks of 32 positions whatever was asked, and
// counting the runners it creates.
Backend CountingCpuBackend(const std::string& name, std::atomic<int>* created) {
  Backend b;
  b.name = name;
  b.create = [created](std::shared_ptr<const Model> model,
                       const RunnerOptions& o) -> StatusOr<std::unique_ptr<ModelRunner>> {
    RunnerOptions mine = o;
    mine.kv_block_size = 32;
    mine.num_kv_blocks = (o.num_kv_blocks * o.kv_block_size + 31) / 32;
    ++*created;
    return CreateRunner("cpu", std::move(model), mine);
  };
  return b;
}

std::vector<int32_t> Greedy(Engine& engine, const std::vector<Speculator*>& drafts = {}) {
  GenerateRequest req;
  req.prompt_tokens = *engine.EncodePrompt("Once upon a time");
  req.max_new_tokens = 40;
  req.sampling.temperature = 0;
  req.speculators = drafts;
  req.tree_shape = *TreeShape::Parse("1,1,3,1");
  auto r = engine.Generate(req);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

TEST(EngineBackend, TheKvCacheTakesTheRunnersGeometry) {
  auto want = Engine::Create(StoriesOptions());
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  EXPECT_EQ((*want)->kv().block_size(), 16);
  EXPECT_EQ((*want)->kv().num_blocks(), (*want)->runner().num_kv_blocks());

  std::atomic<int> created{0};
  EngineOptions o = StoriesOptions();
  o.custom_backend = CountingCpuBackend("test-cpu32", &created);
  auto got = Engine::Create(o);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(created.load(), 1);
  EXPECT_EQ((*got)->kv().block_size(), 32);
  EXPECT_EQ((*got)->kv().num_blocks(), (*got)->runner().num_kv_blocks());
  EXPECT_EQ(Greedy(**got), Greedy(**want));
}

TEST(EngineBackend, DraftsCreateTheirRunnersThroughTheRegistry) {
  std::atomic<int> created{0};
  RegisterBackend(CountingCpuBackend("test-draft-cpu", &created));
  EngineOptions o = StoriesOptions();
  o.draft_backend = "test-draft-cpu";
  o.drafts = {"layers:2", "ngram"};
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(created.load(), 1) << "the layers draft's runner; ngram needs none";
  const std::vector<int32_t> base = Greedy(**engine);
  auto layers = (*engine)->GetSpeculator("layers:2");
  ASSERT_TRUE(layers.ok());
  EXPECT_EQ(Greedy(**engine, {*layers}), base);
  auto more = (*engine)->GetSpeculator("layers:3");  // created on request, same backend
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  EXPECT_EQ(created.load(), 2);
  EXPECT_EQ(Greedy(**engine, {*more}), base);
}

// draft_backends (the CLI's --draft-backend a,b): one backend per draft in order, or one for
// all; drafts created later by name run on the default. Any other count is refused.
TEST(EngineBackend, EachDraftOnItsOwnBackend) {
  std::atomic<int> created{0};
  RegisterBackend(CountingCpuBackend("test-per-draft-cpu", &created));
  EngineOptions o = StoriesOptions();
  o.drafts = {"layers:2", "layers:3", "ngram"};
  o.draft_backends = {"cpu", "test-per-draft-cpu", "cpu"};
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(created.load(), 1) << "layers:3 alone runs on the counting backend";
  const std::vector<int32_t> base = Greedy(**engine);
  EXPECT_EQ(Greedy(**engine, (*engine)->speculators()), base);
  ASSERT_TRUE((*engine)->GetSpeculator("layers:4").ok());  // later: the default, cpu
  EXPECT_EQ(created.load(), 1);

  o.draft_backends = {"test-per-draft-cpu"};  // one for all, and for later ones
  created = 0;
  engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(created.load(), 2);
  ASSERT_TRUE((*engine)->GetSpeculator("layers:4").ok());
  EXPECT_EQ(created.load(), 3);

  o.draft_backends = {"cpu", "cpu"};
  Status s = Engine::Create(o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("2 given for 3 drafts"), std::string::npos) << s.ToString();
  o.draft_backends = {"cpu", "nope", "cpu"};
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(EngineBackend, BadBackendNamesFailAtCreate) {
  EngineOptions o = StoriesOptions();
  o.backend = "nope";
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = StoriesOptions();
  o.draft_backend = "nope";
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kInvalidArgument);
  // No CUDA library in this test binary.
  o = StoriesOptions();
  o.backend = "cuda";
  auto cuda = Engine::Create(o);
  EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda.status().message().find("no CUDA backend"), std::string::npos);
  o = StoriesOptions();
  o.draft_backend = "cuda";
  EXPECT_EQ(Engine::Create(o).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace specinfer
