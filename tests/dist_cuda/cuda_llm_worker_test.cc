// LLM workers with backend "cuda" (dist/cuda/cuda_worker_shard.h) in a TP x PP group behind
// RemoteLlmRunner, as a cluster runs them: every worker an LlmWorkerServer of this process on its
// own device (dist_cuda_emu_tests: emulated devices, the group the in-process collective met
// through the worker's rendezvous store; dist_cuda_tests: real GPUs over NCCL where built, one per
// worker, else skipped). The group's logits of the LLM-worker scenario (prefill, several
// sequences, trees, masked KV, MoveKv; all batch-invariant) equal the whole-model GPU runner's bit
// for bit and the CPU runner's within 1e-4; greedy generation through EngineCore over the group,
// with and without speculation, equals one GPU's token for token; a worker that goes away fails
// the group's next pass with an error, within the collective timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_runner.h"
#include "cuda/cuda_test_util.h"
#include "dist/cluster_config.h"
#include "dist/cuda/cuda_worker_shard.h"
#include "dist/llm_test_util.h"
#include "dist/model_identity.h"
#include "engine/engine_core.h"
#include "model/loader.h"
#include "spec/speculator.h"
#include "test_util.h"

namespace specinfer {
namespace {

using testing::GenerateAll;
using testing::LoadStories;
using testing::Stories;

// Starts cuda worker i of `g` on device i (again on its old address, if it had one).
Status StartCudaWorker(testing::LlmTestGroup& g, size_t i) {
  const std::string listen = g.addresses.size() > i ? g.addresses[i] : "127.0.0.1:0";
  LlmWorkerOptions o = g.OptionsFor(i, listen);
  o.backend = "cuda";
  o.device = static_cast<int32_t>(i);
  auto w = LlmWorkerServer::Start(o, g.model, g.fingerprint);
  if (!w.ok()) return w.status();
  if (g.addresses.size() <= i) g.addresses.resize(i + 1);
  g.addresses[i] = (*w)->address();
  if (g.workers.size() <= i) g.workers.resize(i + 1);
  g.workers[i] = std::move(*w);
  return Status::Ok();
}

// A group of cuda workers: worker i (stage-major) on device i.
std::unique_ptr<testing::LlmTestGroup> StartCudaGroup(int32_t tp, int32_t pp) {
  RegisterCudaWorkerShard();
  auto g = std::make_unique<testing::LlmTestGroup>();
  g->model = LoadStories().model;
  g->fingerprint = LoadStories().fingerprint;
  g->tp = tp;
  g->pp = pp;
  for (size_t i = 0; i < static_cast<size_t>(tp * pp); ++i) {
    const Status s = StartCudaWorker(*g, i);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return nullptr;
  }
  return g;
}

void ExpectEqualBits(const std::vector<std::vector<float>>& got,
                     const std::vector<std::vector<float>>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t p = 0; p < got.size(); ++p)
    EXPECT_ALL_CLOSE(got[p], want[p], tol, tol, std::string(what) + ", pass " + std::to_string(p));
}

class CudaLlmWorkers : public ::testing::TestWithParam<std::pair<int32_t, int32_t>> {};

TEST_P(CudaLlmWorkers, GroupLogitsEqualOneGpuAndCpu) {
  const auto [tp, pp] = GetParam();
  if (cuda::DeviceCount() < tp * pp)
    GTEST_SKIP() << "needs " << tp * pp << " GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(LoadStories().model);
  auto group = StartCudaGroup(tp, pp);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), group->model, group->fingerprint);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  const int32_t blocks = (*remote)->num_kv_blocks();
  KvCacheManager remote_kv(blocks, (*remote)->kv_block_size());
  const auto got = testing::RunScenario(**remote, remote_kv);

  cuda::CudaRunnerOptions o;
  o.num_kv_blocks = blocks;
  auto whole = cuda::CudaModelRunner::Create(group->model, o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  KvCacheManager whole_kv(blocks, 16);
  ExpectEqualBits(got, testing::RunScenario(**whole, whole_kv), 0.0, "vs one GPU");
  auto cpu = testing::MakeLocalRunner(group->model, blocks);
  ExpectEqualBits(got, testing::RunScenario(*cpu.runner, *cpu.kv), 1e-4, "vs the CPU");
  // Argmax rows: each last-stage GPU's argmax over its columns, combined by the client.
  testing::ExpectArgmaxRowsMatchLogits(**remote, remote_kv, {1, 20, 31, 45, 7, 60, 13, 21, 90});
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaLlmWorkers,
                         ::testing::Values(std::make_pair(1, 1), std::make_pair(2, 1),
                                           std::make_pair(2, 2)),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.first) + "_pp" +
                                  std::to_string(info.param.second);
                         });

// Continuous batching over the group (prefill chunks beside token trees, KV compaction of
// accepted paths), with and without speculation: greedy output equals one GPU's, token for token
// (the shares' decode and tree passes of repeated shapes replayed from CUDA graphs).
TEST(CudaLlmWorkerGeneration, GreedyTp2Pp2EqualsOneGpuWithAndWithoutSpeculation) {
  if (cuda::DeviceCount() < 4) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  const Stories& st = LoadStories();
  ASSERT_TRUE(st.model);
  auto group = StartCudaGroup(2, 2);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  // The shares replay CUDA graphs (their collectives in them): the engine's cost calibration
  // leaves a shape's capture untimed.
  EXPECT_EQ((*remote)->warmup_passes(), 2);
  const int32_t blocks = (*remote)->num_kv_blocks();
  cuda::CudaRunnerOptions o;
  o.num_kv_blocks = blocks;
  auto whole = cuda::CudaModelRunner::Create(st.model, o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();

  SpeculatorOptions so;
  so.num_threads = 1;
  auto ngram = CreateSpeculator("ngram", st.model, so);
  ASSERT_TRUE(ngram.ok()) << ngram.status().ToString();
  auto layers = CreateSpeculator("layers:2", st.model, so);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  std::vector<GenerateRequest> reqs;
  const char* prompts[] = {"Once upon a time", "Lily and Ben went to the park. They saw",
                           "One day, a little girl named Lily found a needle"};
  for (int i = 0; i < 3; ++i) {
    GenerateRequest r;
    r.prompt_tokens = st.Encode(prompts[i]);
    r.max_new_tokens = 24;
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
  KvCacheManager whole_kv(blocks, 16), remote_kv(blocks, (*remote)->kv_block_size());
  const auto want = GenerateAll(**whole, whole_kv, reqs);
  const auto got = GenerateAll(**remote, remote_kv, reqs);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].size(), 24u) << i;
    EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
}

// Sampled token trees of requests that read no logits: a group of GPU workers (TP 1 with one stage
// or two; TP 2, whose last-stage ranks gather the rows' columns first) answers each node's
// distribution (what top-k/top-p keep) instead of its logits, and the tokens equal one GPU's (its
// distributions made by the same kernels from the same logits) token for token. A plain sampled
// decode's draws cross as distribution rows too, drawn in the manager: the tokens one GPU draws on
// the device. The same requests reading logits give the same tokens for several times the bytes.
TEST(CudaLlmWorkerGeneration, SampledTreesAndDrawsComeBackAsDistributionsFromGpuGroups) {
  const Stories& st = LoadStories();
  ASSERT_TRUE(st.model);
  SpeculatorOptions so;
  so.num_threads = 1;
  auto layers = CreateSpeculator("layers:2", st.model, so);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  const auto reqs = testing::SampledRequests(st, layers->get(), 12, /*seed=*/3);
  for (const auto& [tp, pp] : {std::make_pair(1, 1), std::make_pair(1, 2), std::make_pair(2, 1)}) {
    const std::string what = "tp " + std::to_string(tp) + " pp " + std::to_string(pp);
    if (cuda::DeviceCount() < tp * pp) {
      std::printf("skipped %s: needs %d GPUs\n", what.c_str(), tp * pp);
      continue;
    }
    auto group = StartCudaGroup(tp, pp);
    ASSERT_TRUE(group) << what;
    auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), st.model, st.fingerprint);
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    const int32_t blocks = (*remote)->num_kv_blocks();
    cuda::CudaRunnerOptions o;
    o.num_kv_blocks = blocks;
    auto whole = cuda::CudaModelRunner::Create(st.model, o);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    KvCacheManager whole_kv(blocks, 16), remote_kv(blocks, (*remote)->kv_block_size());
    const auto want = GenerateAll(**whole, whole_kv, reqs);
    testing::ExpectDistributionRowsGiveTokensForFewerBytes(**remote, remote_kv, reqs, want, what);
  }
}

// A worker that shuts down: the group's next pass fails with an error, bounded by the collective
// timeout (3 s in GroupOptions), not a hang; once the worker is back on its port, the manager
// re-forms the group (a new in-process collective under a new epoch) and passes give one GPU's
// logits again.
TEST(CudaLlmWorkerFaults, AWorkerGoingAwayFailsThePassAndTheGroupReforms) {
  if (cuda::DeviceCount() < 4) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(LoadStories().model);
  auto group = StartCudaGroup(2, 2);
  ASSERT_TRUE(group);
  auto remote = RemoteLlmRunner::Connect(group->GroupOptions(), group->model, group->fingerprint);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  KvCacheManager kv((*remote)->num_kv_blocks(), (*remote)->kv_block_size());
  const SeqId s = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(s, 4).ok());
  ForwardBatch b;
  b.AddSequence(s, std::vector<int32_t>{5, 6, 7, 8}, std::vector<int32_t>{0, 1, 2, 3}, 0, nullptr);
  b.logit_rows = {3};
  std::vector<float> logits(static_cast<size_t>(group->model->config().vocab_size));
  ASSERT_TRUE((*remote)->Forward(b, kv, logits).ok());
  group->workers[3]->Shutdown();
  const auto t0 = std::chrono::steady_clock::now();
  ForwardBatch d;
  ASSERT_TRUE(kv.Reserve(s, 5).ok());
  d.AddSequence(s, std::vector<int32_t>{9}, std::vector<int32_t>{4}, 4, nullptr);
  d.logit_rows = {0};
  const Status st = (*remote)->Forward(d, kv, logits);
  EXPECT_FALSE(st.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << st.ToString();
  kv.RemoveSequence(s);

  const uint64_t epoch0 = (*remote)->epoch();
  group->workers[3].reset();
  ASSERT_TRUE(StartCudaWorker(*group, 3).ok());
  Status probe = (*remote)->Probe();
  for (int i = 0; i < 50 && !probe.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    probe = (*remote)->Probe();
  }
  ASSERT_TRUE(probe.ok()) << probe.ToString();
  EXPECT_GT((*remote)->epoch(), epoch0);
  cuda::CudaRunnerOptions o;
  o.num_kv_blocks = (*remote)->num_kv_blocks();
  auto whole = cuda::CudaModelRunner::Create(group->model, o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  std::vector<std::vector<float>> results;
  for (ModelRunner* r :
       {static_cast<ModelRunner*>(remote->get()), static_cast<ModelRunner*>(whole->get())}) {
    KvCacheManager fresh(r->num_kv_blocks(), r->kv_block_size());
    const SeqId n = fresh.AddSequence();
    ASSERT_TRUE(fresh.Reserve(n, 6).ok());
    ForwardBatch p;
    p.AddSequence(n, std::vector<int32_t>{1, 9, 8, 7, 6, 5}, std::vector<int32_t>{0, 1, 2, 3, 4, 5},
                  0, nullptr);
    p.logit_rows = {0, 5};
    results.push_back(testing::Pass(*r, fresh, p));
  }
  EXPECT_ALL_CLOSE(results[0], results[1], 0.0, 0.0, "after the group re-formed, vs one GPU");
}

// In a program with the CUDA backend, the GPU example configs pass the start-up check (they were
// refused before LLM workers could run on GPUs).
TEST(CudaLlmWorkerConfigs, GpuExampleConfigsAreRunnable) {
  cuda::RegisterCudaBackend();
  for (const char* name : {"multi-gpu-node", "two-node"}) {
    auto c = LoadClusterConfig(testing::SourcePath(std::string("configs/") + name + ".yaml"));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->llm.backend, "cuda");
    EXPECT_EQ(c->llm.placement, ClusterLlm::Placement::kWorkers);
    const Status s = CheckClusterRunnable(*c);
    EXPECT_TRUE(s.ok()) << name << ": " << s.ToString();
  }
}

TEST(CudaLlmWorkerFaults, UnknownBackendIsRefused) {
  ASSERT_TRUE(LoadStories().model);
  LlmWorkerOptions o;
  o.backend = "tpu";
  auto w = LlmWorkerServer::Start(o, LoadStories().model, LoadStories().fingerprint);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound) << w.status().ToString();
}

}  // namespace
}  // namespace specinfer
