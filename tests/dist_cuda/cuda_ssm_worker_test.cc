// SSM workers with backend "cuda" (dist/ssm_worker.h: the worker's model: or layers: draft on a
// GPU through the backend registry, as `serve --draft-backend cuda` puts in-process drafts there)
// behind RemoteSpeculator, as a cluster runs them (dist_cuda_emu_tests: emulated devices;
// dist_cuda_tests: a real GPU, else skipped). For a stories260K layers: draft and a model: draft:
//   - the GPU worker's trees equal an in-process draft on the same GPU bit for bit (tokens, shape,
//     sampled distributions), greedy and sampled, over steps that send deltas;
//   - greedy trees equal the CPU worker's token for token, and sampled trees' root distribution
//     is the CPU worker's within 1e-4 (the GPU and CPU kernels sum in different orders);
//   - greedy generation speculating with GPU workers equals incremental decoding token for token,
//     with proposals accepted;
//   - the worker runs on the device asked for: one that does not exist is refused at start.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "dist/model_identity.h"
#include "dist/ssm_client.h"
#include "dist/ssm_wire.h"
#include "dist/ssm_worker.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "spec/speculator.h"
#include "test_util.h"

namespace specinfer {
namespace {

// Device 1 where there are two (not the default 0: the device must reach the runner), else 0.
int32_t TestDevice() { return cuda::DeviceCount() > 1 ? 1 : 0; }

struct Llm {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  uint64_t fingerprint = 0;
};

Llm LoadLlm() {
  auto loaded = LoadModelAndTokenizer(testing::Stories260KModel(), testing::Stories260KTokenizer());
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  Llm l;
  if (!loaded.ok()) return l;
  l.model = std::shared_ptr<const Model>(std::move(loaded->model));
  l.tokenizer = std::move(loaded->tokenizer);
  l.fingerprint = VocabFingerprint(*l.tokenizer);
  return l;
}

// The drafts under test: the LLM's first four layers (of five: layers:2 rarely guesses right),
// and a separate draft model (stories260K again: it shares its own vocabulary).
std::vector<std::string> DraftSpecs() {
  return {"layers:4", "model:" + testing::Stories260KModel()};
}

SsmWorkerOptions WorkerOptions(const std::string& spec, const std::string& backend,
                               int32_t device) {
  SsmWorkerOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.speculator = spec;
  o.backend = backend;
  o.device = device;
  o.num_threads = 1;
  o.max_sessions = 4;
  return o;
}

std::string Address(const SsmWorkerServer& w) { return "127.0.0.1:" + std::to_string(w.port()); }

RemoteSpeculatorOptions ClientOptions(const std::string& spec, const Model& model,
                                      uint64_t fingerprint, std::vector<std::string> replicas) {
  RemoteSpeculatorOptions o;
  o.replicas = std::move(replicas);
  o.name = spec;
  o.vocab_size = model.config().vocab_size;
  o.vocab_fingerprint = fingerprint;
  o.rpc_timeout = std::chrono::milliseconds(60000);  // the emulator is slow
  o.probe_interval = std::chrono::seconds(60);       // no re-probe during a test
  return o;
}

// Everything a tree holds, as it crosses the wire (tokens, parents, proposers, trials, sampled
// distributions bit for bit).
std::string Wire(const TokenTree& t) {
  worker::TokenTreeProto p;
  TreeToProto(t, &p);
  return p.SerializeAsString();
}

// Tokens and shape only.
std::vector<std::pair<int32_t, int32_t>> Nodes(const TokenTree& t) {
  std::vector<std::pair<int32_t, int32_t>> out;
  for (int32_t v = 0; v < t.size(); ++v) out.emplace_back(t.node(v).token, t.node(v).parent);
  return out;
}

std::string SpecName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param.rfind("model:", 0) == 0 ? std::string("model") : std::string("layers4");
}

class CudaSsmWorker : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSsmWorker, TreesEqualAnInProcessGpuDraftAndTheCpuWorkers) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int32_t device = TestDevice();
  cuda::RegisterCudaBackend();
  const std::string spec = GetParam();
  Llm llm = LoadLlm();
  ASSERT_TRUE(llm.model);
  auto gpu_worker = SsmWorkerServer::Start(WorkerOptions(spec, "cuda", device));
  ASSERT_TRUE(gpu_worker.ok()) << gpu_worker.status().ToString();
  auto cpu_worker = SsmWorkerServer::Start(WorkerOptions(spec, "cpu", 0));
  ASSERT_TRUE(cpu_worker.ok()) << cpu_worker.status().ToString();
  auto gpu_remote = RemoteSpeculator::Connect(
      ClientOptions(spec, *llm.model, llm.fingerprint, {Address(**gpu_worker)}));
  ASSERT_TRUE(gpu_remote.ok()) << gpu_remote.status().ToString();
  auto cpu_remote = RemoteSpeculator::Connect(
      ClientOptions(spec, *llm.model, llm.fingerprint, {Address(**cpu_worker)}));
  ASSERT_TRUE(cpu_remote.ok()) << cpu_remote.status().ToString();
  SpeculatorOptions so;
  so.backend = "cuda";
  so.device = device;
  so.llm_tokenizer = llm.tokenizer.get();
  auto local = CreateSpeculator(spec, llm.model, so);
  ASSERT_TRUE(local.ok()) << local.status().ToString();

  auto gs = (*gpu_remote)->StartSession();
  auto cs = (*cpu_remote)->StartSession();
  auto ls = (*local)->StartSession();
  ASSERT_TRUE(gs.ok() && cs.ok() && ls.ok());
  auto ids = llm.tokenizer->Encode("Once upon a time, there was a little girl", true);
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> tokens = *ids;
  const TreeShape shape{{2, 2, 1}};
  int greedy_steps = 0, sampled_steps = 0;
  for (const float temperature : {0.0f, 0.8f}) {
    SamplingParams sampling;
    sampling.temperature = temperature;
    sampling.top_k = temperature > 0 ? 30 : 0;
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("temperature " + std::to_string(temperature) + ", step " + std::to_string(step));
      // Each worker draws from Rng(seed), the seed drawn from the request's stream.
      Rng gpu_rng(100 + step), cpu_rng(100 + step), seed_rng(100 + step);
      DraftContext gctx{tokens, &shape, 3, &sampling, &gpu_rng, 2};
      DraftContext cctx{tokens, &shape, 3, &sampling, &cpu_rng, 2};
      auto gt = (*gs)->Propose(gctx);
      ASSERT_TRUE(gt.ok()) << gt.status().ToString();
      auto ct = (*cs)->Propose(cctx);
      ASSERT_TRUE(ct.ok()) << ct.status().ToString();
      Rng local_rng(sampling.greedy() ? 0 : DrawSpeculationSeed(seed_rng));
      DraftContext lctx{tokens, &shape, 3, &sampling, &local_rng, 2};
      auto lt = (*ls)->Propose(lctx);
      ASSERT_TRUE(lt.ok()) << lt.status().ToString();

      ASSERT_GT(gt->size(), 3) << "a worker that drafts nothing would pass vacuously";
      EXPECT_EQ(Wire(*gt), Wire(*lt)) << "the GPU worker vs an in-process draft on the same GPU";
      if (sampling.greedy()) {
        EXPECT_EQ(Nodes(*gt), Nodes(*ct)) << "the GPU worker vs the CPU worker";
        ++greedy_steps;
      } else {
        // Both drew from the root's q (its first trial); q is the CPU's within tolerance.
        ASSERT_FALSE(gt->node(0).trials.empty());
        ASSERT_FALSE(ct->node(0).trials.empty());
        const auto gq = gt->distribution(gt->node(0).trials[0].dist);
        const auto cq = ct->distribution(ct->node(0).trials[0].dist);
        ASSERT_EQ(gq.size(), cq.size());
        double max_diff = 0, mass = 0;
        for (size_t i = 0; i < gq.size(); ++i) {
          max_diff = std::max(max_diff, std::fabs(double{gq[i]} - double{cq[i]}));
          mass += gq[i];
        }
        EXPECT_LE(max_diff, 1e-4) << "root distribution, GPU vs CPU worker";
        EXPECT_NEAR(mass, 1.0, 1e-3);
        ++sampled_steps;
      }
      // The sequence grows by the tree's first child and one more token: deltas from now on.
      tokens.push_back(gt->node(1).token);
      tokens.push_back(static_cast<int32_t>(40 + 3 * step));
    }
  }
  EXPECT_EQ(greedy_steps, 3);
  EXPECT_EQ(sampled_steps, 3);
}

// Greedy generation on the CPU LLM, speculating with a GPU worker's draft: the output equals
// incremental decoding token for token, and the draft's proposals were verified and accepted.
TEST_P(CudaSsmWorker, GreedySpeculativeOutputEqualsIncremental) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int32_t device = TestDevice();
  cuda::RegisterCudaBackend();
  const std::string spec = GetParam();
  auto worker = SsmWorkerServer::Start(WorkerOptions(spec, "cuda", device));
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 1;
  o.spec_budget = SpecBudgetMode::kStatic;  // every step verifies the whole tree
  const std::string address = Address(**worker);
  RemoteSpeculator* remote = nullptr;
  o.speculator_factory =
      [&](std::shared_ptr<const Model> model,
          const Tokenizer& tok) -> StatusOr<std::vector<std::unique_ptr<Speculator>>> {
    SI_ASSIGN_OR_RETURN(auto s, RemoteSpeculator::Connect(
                                    ClientOptions(spec, *model, VocabFingerprint(tok), {address})));
    remote = s.get();
    std::vector<std::unique_ptr<Speculator>> out;
    out.push_back(std::move(s));
    return out;
  };
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_NE(remote, nullptr);

  GenerateRequest req;
  req.prompt_tokens = *(*engine)->EncodePrompt("Once upon a time");
  req.max_new_tokens = 48;
  req.sampling.temperature = 0;
  auto plain = (*engine)->Generate(req);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_EQ(plain->tokens.size(), 48u);
  req.speculators = {remote};
  req.tree_shape = TreeShape{{2, 1, 1}};
  auto spec_out = (*engine)->Generate(req);
  ASSERT_TRUE(spec_out.ok()) << spec_out.status().ToString();
  EXPECT_EQ(spec_out->tokens, plain->tokens) << "greedy output must not change";
  EXPECT_GT(spec_out->stats.spec.tree_nodes, 0) << "the GPU worker drafted";
  EXPECT_GT(spec_out->stats.spec.accepted_tokens, 0) << "and its proposals were accepted";
  EXPECT_EQ(remote->live_replicas(), 1);
  std::printf("%s on the GPU: %lld nodes verified, %lld accepted, %d passes for 48 tokens\n",
              spec.c_str(), static_cast<long long>(spec_out->stats.spec.tree_nodes),
              static_cast<long long>(spec_out->stats.spec.accepted_tokens),
              spec_out->stats.decode_passes);
}

INSTANTIATE_TEST_SUITE_P(Drafts, CudaSsmWorker, ::testing::ValuesIn(DraftSpecs()), SpecName);

// The worker's device reaches the runner: one past the last is refused at start, naming it.
TEST(CudaSsmWorkerStart, AMissingDeviceIsRefused) {
  cuda::RegisterCudaBackend();
  const int32_t missing = cuda::DeviceCount();
  auto w = SsmWorkerServer::Start(WorkerOptions("layers:2", "cuda", missing));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kFailedPrecondition) << w.status().ToString();
  EXPECT_NE(w.status().message().find("no CUDA device " + std::to_string(missing)),
            std::string::npos)
      << w.status().ToString();
  auto negative = SsmWorkerServer::Start(WorkerOptions("layers:2", "cuda", -1));
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specinfer
