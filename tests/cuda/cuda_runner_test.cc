// CudaModelRunner end to end: logits against the CPU backend (stories260K, random models with
// grouped-query attention, both RoPE pairings, 16-bit KV caches, quantised SmolLM2, a random
// model with K-quant weights, in memory and as a GGUF file, whose tree passes equal incremental
// decoding bit for bit), greedy generation on the GPU equal to the CPU's token for token,
// speculative generation on the GPU equal to incremental generation on the GPU, KV compaction,
// batches run in pieces, and memory shortfalls reported as errors.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "backend/cpu/cpu_runner.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "model/dequantize.h"
#include "model/gguf_writer.h"
#include "model/hf_loader.h"
#include "model/loader.h"
#include "model/random_model.h"
#include "quant/quant_random.h"
#include "spec/token_tree.h"
#include "test_util.h"

namespace specinfer {
namespace {

using cuda::CudaModelRunner;
using cuda::CudaRunnerOptions;

std::shared_ptr<const Model> Stories() {
  static std::shared_ptr<const Model> model = [] {
    auto loaded =
        LoadModelAndTokenizer(testing::Stories260KModel(), testing::Stories260KTokenizer());
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    return loaded.ok() ? std::shared_ptr<const Model>(std::move(loaded->model)) : nullptr;
  }();
  return model;
}

std::unique_ptr<CudaModelRunner> MakeCuda(std::shared_ptr<const Model> model, int32_t blocks,
                                          CudaRunnerOptions o = {}) {
  o.num_kv_blocks = blocks;
  auto r = CudaModelRunner::Create(std::move(model), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::unique_ptr<CpuModelRunner> MakeCpu(std::shared_ptr<const Model> model, int32_t blocks) {
  CpuRunnerOptions o;
  o.num_threads = 2;
  o.num_kv_blocks = blocks;
  auto r = CpuModelRunner::Create(std::move(model), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::vector<int32_t> SomeTokens(int32_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = std::uniform_int_distribution<int32_t>(1, vocab - 1)(rng);
  return t;
}

std::vector<int32_t> AllRows(int32_t n) {
  std::vector<int32_t> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// Prompt logits of every position on the GPU against the CPU.
void ExpectPromptLogitsMatch(std::shared_ptr<const Model> model, int32_t n, double atol,
                             double rtol, CudaRunnerOptions o = {}) {
  auto cpu = MakeCpu(model, 64);
  auto gpu = MakeCuda(model, 64, o);
  ASSERT_TRUE(cpu && gpu);
  KvCacheManager kv_cpu(64, 16), kv_gpu(64, 16);
  const std::vector<int32_t> tokens = SomeTokens(n, model->config().vocab_size, 3);
  const std::vector<float> want = testing::PromptLogits(*cpu, kv_cpu, tokens, AllRows(n));
  const std::vector<float> got = testing::PromptLogits(*gpu, kv_gpu, tokens, AllRows(n));
  EXPECT_ALL_CLOSE(got, want, atol, rtol, "prompt logits, " + model->config().ToString());
}

TEST(CudaRunner, Stories260KPromptLogitsMatchCpu) {
  ASSERT_TRUE(Stories());
  ExpectPromptLogitsMatch(Stories(), 100, 1e-4, 1e-4);
}

// Random float32 models with the shapes the CPU tests do not cover on the GPU otherwise:
// GQA 4 and 8, head_dim 64 and 128, the half RoPE pairing, a fp16 and a bf16 KV cache.
TEST(CudaRunner, RandomModelsMatchCpu) {
  struct Shape {
    int32_t dim, heads, kv_heads, hidden;
    RopeStyle rope;
    cuda::KvCacheType kv;
    double tol;
  };
  const Shape shapes[] = {
      {256, 4, 1, 512, RopeStyle::kInterleaved, cuda::KvCacheType::kAuto, 1e-4},
      {512, 8, 1, 1024, RopeStyle::kHalf, cuda::KvCacheType::kAuto, 1e-4},
      {512, 4, 4, 768, RopeStyle::kHalf, cuda::KvCacheType::kF16, 2e-2},
      {256, 8, 2, 512, RopeStyle::kInterleaved, cuda::KvCacheType::kBF16, 1e-1},
  };
  for (const Shape& s : shapes) {
    ModelConfig c;
    c.dim = s.dim;
    c.hidden_dim = s.hidden;
    c.n_layers = 3;
    c.n_heads = s.heads;
    c.n_kv_heads = s.kv_heads;
    c.head_dim = s.dim / s.heads;
    c.vocab_size = 300;
    c.max_seq_len = 256;
    c.rope_style = s.rope;
    auto model = MakeRandomModel(c, 17);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    CudaRunnerOptions o;
    o.kv_type = s.kv;
    ExpectPromptLogitsMatch(std::shared_ptr<const Model>(std::move(model).value()), 70, s.tol,
                            s.tol, o);
  }
}

// The decoder families the GPU runs, as transformers wrote them (tests/data/arch: Llama 3's RoPE
// scaling, Qwen2's q/k/v biases, Qwen3's QK-norm, q_dim != dim, Mistral's sliding window of 5
// positions over a 12-token prompt, Gemma 2's soft-capping of scores and logits, Gemma 3's GELU,
// embedding and attention scales, post-norms, QK-norm and sliding layers with their own RoPE
// base), through the Hugging Face loader
// and Qwen3 and Gemma 3 also as GGUF: prompt logits at every position within
// 1e-4 * max|reference| + 1e-5 of transformers' (as tests/model/arch_reference_test.cc asks of
// the CPU), and decoding the
// same tokens one at a time gives the prompt pass's logits bit for bit.
TEST(CudaRunner, HfFamiliesMatchTransformersAndDecodeAsTheyPrefill) {
  for (const std::string family :
       {"llama3", "qwen2", "qwen3", "qwen3.gguf", "mistral", "gemma2", "gemma3", "gemma3.gguf"}) {
    const std::string dir = testing::SourcePath("tests/data/arch/" + family.substr(0, family.find('.')));
    StatusOr<std::unique_ptr<Model>> m = family.ends_with(".gguf")
                                             ? LoadModel(dir + "/model.gguf")
                                             : ModelFromHfDirectory(dir);
    ASSERT_TRUE(m.ok()) << family << ": " << m.status().ToString();
    std::shared_ptr<const Model> model = std::move(m).value();
    std::ifstream f(dir + "/reference.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    const auto tokens = j["tokens"].get<std::vector<int32_t>>();
    const auto ref = j["logits"].get<std::vector<std::vector<float>>>();
    const int32_t n = static_cast<int32_t>(tokens.size()), vocab = model->config().vocab_size;
    std::vector<float> want;
    float max_abs = 0.0f;
    for (const auto& row : ref) {
      ASSERT_EQ(row.size(), static_cast<size_t>(vocab)) << family;
      want.insert(want.end(), row.begin(), row.end());
      for (float v : row) max_abs = std::max(max_abs, std::fabs(v));
    }
    auto gpu = MakeCuda(model, 8);
    ASSERT_TRUE(gpu) << family;
    KvCacheManager kv(8, 16);
    const std::vector<float> got = testing::PromptLogits(*gpu, kv, tokens, AllRows(n));
    EXPECT_ALL_CLOSE(got, want, 1e-4 * max_abs + 1e-5, 0.0, family + " against transformers");
    // Token by token.
    const SeqId s = kv.AddSequence();
    ASSERT_TRUE(kv.Reserve(s, n).ok());
    std::vector<float> decoded;
    for (int32_t i = 0; i < n; ++i) {
      ForwardBatch b;
      b.AddSequence(s, std::vector<int32_t>{tokens[static_cast<size_t>(i)]},
                    std::vector<int32_t>{i}, i, nullptr);
      b.logit_rows = {0};
      std::vector<float> row(static_cast<size_t>(vocab));
      ASSERT_TRUE(gpu->Forward(b, kv, row).ok()) << family;
      decoded.insert(decoded.end(), row.begin(), row.end());
    }
    EXPECT_ALL_CLOSE(decoded, got, 0.0, 0.0, family + ": decoding vs the prompt pass");
  }
}

// Token-tree passes (mask bits, masked earlier levels) and KV compaction give the CPU's logits.
TEST(CudaRunner, TreePassAndMoveKvMatchCpu) {
  auto model = Stories();
  ASSERT_TRUE(model);
  auto cpu = MakeCpu(model, 32);
  auto gpu = MakeCuda(model, 32);
  ASSERT_TRUE(cpu && gpu);
  const int32_t vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = SomeTokens(37, vocab, 9);
  std::vector<std::vector<float>> results;
  for (ModelRunner* r :
       {static_cast<ModelRunner*>(cpu.get()), static_cast<ModelRunner*>(gpu.get())}) {
    KvCacheManager kv(32, 16);
    const SeqId s = kv.AddSequence();
    ASSERT_TRUE(kv.Reserve(s, 37 + 6).ok());
    std::vector<float> logits;
    // Prompt, as a non-invariant pass (the GPU may use cuBLAS when it has >= 16 tokens).
    ForwardBatch pb;
    std::vector<int32_t> pos(37);
    std::iota(pos.begin(), pos.end(), 0);
    pb.AddSequence(s, prompt, pos, 0, nullptr);
    pb.logit_rows = {36};
    pb.batch_invariant = false;
    logits.resize(static_cast<size_t>(vocab));
    ASSERT_TRUE(r->Forward(pb, kv, logits).ok());
    std::vector<float> all = logits;
    // A tree of 6 nodes after the prompt: 0 -> {1, 2}, 1 -> {3}, 2 -> {4, 5}.
    const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 2};
    const TreeMask mask = TreeMask::FromParents(parents);
    const std::vector<int32_t> toks = {5, 77, 300, 12, 9, 401};
    const std::vector<int32_t> tpos = {37, 38, 38, 39, 39, 39};
    ForwardBatch tb;
    tb.AddSequence(s, toks, tpos, 37, &mask);
    tb.logit_rows = AllRows(6);
    logits.resize(6 * static_cast<size_t>(vocab));
    ASSERT_TRUE(r->Forward(tb, kv, logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
    // Accept path 0 -> 2 -> 5: compact positions 39, 42 into 38, 39 and drop the rest.
    ASSERT_TRUE(r->MoveKv(kv, s, std::vector<int32_t>{39, 42}, std::vector<int32_t>{38, 39}).ok());
    kv.Truncate(s, 40);
    ASSERT_TRUE(kv.Reserve(s, 41).ok());
    ForwardBatch db;
    db.AddSequence(s, std::vector<int32_t>{100}, std::vector<int32_t>{40}, 40, nullptr);
    db.logit_rows = {0};
    logits.resize(static_cast<size_t>(vocab));
    ASSERT_TRUE(r->Forward(db, kv, logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
    results.push_back(all);
  }
  EXPECT_ALL_CLOSE(results[1], results[0], 1e-4, 1e-4, "prompt, tree and decode after MoveKv");
}

// A batch larger than the planned workspace runs in pieces, with the same results bit for bit
// (batch-invariant kernels; the pieces' later rows see the earlier ones as committed KV).
TEST(CudaRunner, OversizedBatchRunsInPieces) {
  auto model = Stories();
  ASSERT_TRUE(model);
  CudaRunnerOptions small;
  small.max_batch_tokens = 7;
  auto whole = MakeCuda(model, 64);
  auto pieces = MakeCuda(model, 64, small);
  ASSERT_TRUE(whole && pieces);
  const int32_t vocab = model->config().vocab_size;
  std::vector<std::vector<float>> out;
  for (CudaModelRunner* r : {whole.get(), pieces.get()}) {
    KvCacheManager kv(64, 16);
    // Two sequences: a 30-token prompt and, after a 20-token prompt, a 9-node tree.
    const SeqId a = kv.AddSequence(), b = kv.AddSequence();
    ASSERT_TRUE(kv.Reserve(a, 30).ok());
    ASSERT_TRUE(kv.Reserve(b, 29).ok());
    ForwardBatch first;
    std::vector<int32_t> pa(30), pb(20);
    std::iota(pa.begin(), pa.end(), 0);
    std::iota(pb.begin(), pb.end(), 0);
    first.AddSequence(b, SomeTokens(20, vocab, 1), pb, 0, nullptr);
    std::vector<float> l0(static_cast<size_t>(vocab));
    first.logit_rows = {19};
    ASSERT_TRUE(r->Forward(first, kv, l0).ok());
    const TreeMask mask = TreeMask::FromParents(std::vector<int32_t>{-1, 0, 0, 1, 1, 2, 3, 6, 7});
    ForwardBatch batch;
    batch.AddSequence(a, SomeTokens(30, vocab, 2), pa, 0, nullptr);
    batch.AddSequence(b, SomeTokens(9, vocab, 3),
                      std::vector<int32_t>{20, 21, 21, 22, 22, 22, 23, 24, 25}, 20, &mask);
    batch.logit_rows = AllRows(39);
    std::vector<float> logits(39 * static_cast<size_t>(vocab));
    ASSERT_TRUE(r->Forward(batch, kv, logits).ok());
    out.push_back(logits);
  }
  EXPECT_ALL_CLOSE(out[1], out[0], 0.0, 0.0, "pieces of 7 tokens vs one pass");
}

// CUDA graphs: passes replayed from graphs give exactly the eager passes' logits and argmax ids.
// Three sequences decode together while their contexts grow across attention chunks of 64
// positions (work items change: new shapes), every fourth step is a token-tree pass of two of
// them, decode steps alternate logits rows with a mix of one logits row and argmax rows (the
// engine's batches of sampled and greedy sequences); on stories260K (float32 KV) and a
// random grouped-query model with an fp16 KV cache (the tensor-core kernel), the second with
// room for only two graphs.
TEST(CudaRunner, GraphReplaysEqualEagerPasses) {
  ModelConfig c;
  c.dim = 256;
  c.hidden_dim = 512;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 300;
  c.max_seq_len = 256;
  auto random = MakeRandomModel(c, 23);
  ASSERT_TRUE(random.ok()) << random.status().ToString();
  CudaRunnerOptions f16;
  f16.kv_type = cuda::KvCacheType::kF16;
  f16.max_graphs = 2;
  const std::pair<std::shared_ptr<const Model>, CudaRunnerOptions> setups[] = {
      {Stories(), CudaRunnerOptions{}},
      {std::shared_ptr<const Model>(std::move(random).value()), f16}};
  for (const auto& [model, base_options] : setups) {
    ASSERT_TRUE(model);
    const int32_t vocab = model->config().vocab_size;
    const int32_t steps = testing::kEmulated ? 28 : 120;
    std::vector<std::vector<float>> logits_of;
    std::vector<std::vector<int32_t>> ids_of;
    std::vector<cuda::CudaGraphStats> stats;
    for (bool graphs : {true, false}) {
      CudaRunnerOptions o = base_options;
      o.attention_chunk = 64;
      o.cuda_graphs = graphs;
      auto runner = MakeCuda(model, 96, o);
      ASSERT_TRUE(runner);
      KvCacheManager kv(96, 16);
      std::vector<SeqId> seqs;
      std::vector<int32_t> len;
      std::vector<float> all_logits;
      std::vector<int32_t> all_ids;
      uint32_t seed = 100;
      for (int32_t n : {5, 40, 61}) {  // prompts, as prompt passes (eager: not batch-invariant)
        const SeqId s = kv.AddSequence();
        ASSERT_TRUE(kv.Reserve(s, n).ok());
        ForwardBatch pb;
        std::vector<int32_t> pos(static_cast<size_t>(n));
        std::iota(pos.begin(), pos.end(), 0);
        pb.AddSequence(s, SomeTokens(n, vocab, seed++), pos, 0, nullptr);
        pb.batch_invariant = false;
        ASSERT_TRUE(runner->Forward(pb, kv, {}).ok());
        seqs.push_back(s);
        len.push_back(n);
      }
      const std::vector<int32_t> parents = {-1, 0, 0, 1};
      const TreeMask mask = TreeMask::FromParents(parents);
      for (int32_t t = 0; t < steps; ++t) {
        ForwardBatch b;
        const bool tree = t % 4 == 3;
        for (size_t i = 0; i < (tree ? 2 : seqs.size()); ++i) {
          const int32_t n = tree ? 4 : 1;
          ASSERT_TRUE(kv.Reserve(seqs[i], len[i] + n).ok());
          const std::vector<int32_t> pos =
              tree ? std::vector<int32_t>{len[i], len[i] + 1, len[i] + 1, len[i] + 2}
                   : std::vector<int32_t>{len[i]};
          b.AddSequence(seqs[i], SomeTokens(n, vocab, seed++), pos, len[i], tree ? &mask : nullptr);
        }
        std::vector<float> logits;
        if (tree || t % 2 == 0) {
          b.logit_rows = AllRows(b.size());
          logits.resize(static_cast<size_t>(b.size()) * vocab);
          ASSERT_TRUE(runner->Forward(b, kv, logits).ok()) << "step " << t;
        } else {
          b.logit_rows = {0};
          for (int32_t r = 1; r < b.size(); ++r) b.argmax_rows.push_back(r);
          logits.resize(static_cast<size_t>(vocab));
          std::vector<int32_t> ids(b.argmax_rows.size());
          ASSERT_TRUE(runner->ForwardArgmax(b, kv, logits, ids).ok()) << "step " << t;
          all_ids.insert(all_ids.end(), ids.begin(), ids.end());
        }
        all_logits.insert(all_logits.end(), logits.begin(), logits.end());
        for (size_t i = 0; i < seqs.size(); ++i) {
          if (tree && i < 2) {
            kv.Truncate(seqs[i], len[i] + 1);  // keep the root: it was this step's token
            ++len[i];
          } else if (!tree) {
            ++len[i];
          }
        }
      }
      logits_of.push_back(std::move(all_logits));
      ids_of.push_back(std::move(all_ids));
      stats.push_back(runner->graph_stats());
    }
    const std::string what = model->config().ToString();
    EXPECT_ALL_CLOSE(logits_of[0], logits_of[1], 0.0, 0.0, "graph vs eager logits, " + what);
    EXPECT_EQ(ids_of[0], ids_of[1]) << what;
    const cuda::CudaGraphStats& g = stats[0];
    EXPECT_FALSE(g.disabled);
    EXPECT_GE(g.captured, 3) << what;  // decode shapes across chunks, and the tree's
    EXPECT_GE(g.replayed, steps / 4) << what;
    EXPECT_EQ(g.evicted, std::max<int64_t>(0, g.captured - base_options.max_graphs)) << what;
    EXPECT_EQ(g.replayed + g.eager, steps + 3) << what;
    EXPECT_EQ(stats[1].captured, 0);
    EXPECT_EQ(stats[1].replayed, 0);
  }
}

// Argmax rows (ForwardArgmax) found on the GPU: the Argmax of the same rows' logits, beside
// logits rows; 141 argmax rows run in two classifier chunks of at most 128.
TEST(CudaRunner, ArgmaxRowsAreFoundOnTheGpu) {
  auto model = Stories();
  ASSERT_TRUE(model);
  auto gpu = MakeCuda(model, 64);
  ASSERT_TRUE(gpu);
  KvCacheManager kv(64, 16);
  testing::ExpectArgmaxRowsMatchLogits(*gpu, kv, SomeTokens(140, model->config().vocab_size, 9));
}

std::unique_ptr<Engine> StoriesEngine(const std::string& backend, bool cuda_graphs = true,
                                      SpecBudgetMode budget = SpecBudgetMode::kAuto) {
  cuda::RegisterCudaBackend();
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 2;
  o.backend = backend;
  o.cuda_graphs = cuda_graphs;
  o.spec_budget = budget;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(CudaRunner, GreedyGenerationEqualsCpuTokenForToken) {
  auto cpu = StoriesEngine("cpu");
  auto gpu = StoriesEngine("cuda");
  ASSERT_TRUE(cpu && gpu);
  EXPECT_EQ(gpu->runner().name(), "cuda:0");
  for (const char* prompt : {"", "Once upon a time", "The little dog was sad because"}) {
    GenerateRequest req;
    req.prompt_tokens = *cpu->EncodePrompt(prompt);
    req.max_new_tokens = 200;
    req.sampling.temperature = 0;
    auto want = cpu->Generate(req);
    auto got = gpu->Generate(req);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->tokens, want->tokens) << "prompt '" << prompt << "'";
  }
  EXPECT_EQ(gpu->kv().used_blocks(), 0);
}

TEST(CudaRunner, SpeculativeGenerationEqualsIncrementalOnGpu) {
  auto gpu = StoriesEngine("cuda");
  ASSERT_TRUE(gpu);
  struct Case {
    std::vector<std::string> drafts;
    std::string shape;
  };
  const Case cases[] = {{{"ngram"}, "1,1,1,1"},
                        {{"ngram:2"}, "2,2,1"},
                        {{"layers:2"}, "1,1,3,1"},
                        {{"layers:3", "ngram"}, "3,2,2,1,1"}};
  for (const char* prompt : {"Once upon a time", "Tom and Tom and Tom went to the park. Tom"}) {
    GenerateRequest req;
    req.prompt_tokens = *gpu->EncodePrompt(prompt);
    req.max_new_tokens = testing::kEmulated ? 40 : 120;
    req.sampling.temperature = 0;
    req.stop_tokens = gpu->default_stop_tokens();
    auto base = gpu->Generate(req);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    for (const Case& c : cases) {
      GenerateRequest sreq = req;
      sreq.tree_shape = *TreeShape::Parse(c.shape);
      for (const std::string& d : c.drafts) {
        auto s = gpu->GetSpeculator(d);
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        sreq.speculators.push_back(*s);
      }
      // Every other case reads no logits: its trees' argmax is found on the GPU.
      sreq.callback_logits = (&c - cases) % 2 == 0;
      auto r = gpu->Generate(sreq);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->tokens, base->tokens) << "prompt '" << prompt << "', tree " << c.shape
                                         << (sreq.callback_logits ? "" : ", argmax rows");
      EXPECT_LE(r->stats.decode_passes, base->stats.decode_passes);
    }
  }
  EXPECT_EQ(gpu->kv().used_blocks(), 0);
}

struct SamplingCase {
  float temperature;
  int32_t top_k;
  float top_p;
};

// A seeded sampled request after "Once upon a time" under `c`.
GenerateRequest SampledStory(Engine& engine, const SamplingCase& c, uint64_t seed) {
  GenerateRequest req;
  req.prompt_tokens = *engine.EncodePrompt("Once upon a time");
  req.max_new_tokens = testing::kEmulated ? 24 : 100;
  req.sampling.temperature = c.temperature;
  req.sampling.top_k = c.top_k;
  req.sampling.top_p = c.top_p;
  req.sampling.seed = seed;
  return req;
}

// A sampled sequence that reads no logits (GenerateRequest::callback_logits false) gets its tokens
// drawn on the GPU (ForwardBatch::draws; kernels/sampling.cuh DrawTokens) at the uniforms its
// seeded random stream supplies: the same tokens as sampling on the host from the GPU's logits
// rows, and as the CPU backend's, under temperature, top-k and top-p; no logits row reaches the
// callback, and the draws replay the decode graphs.
TEST(CudaRunner, SampledTokensAreDrawnOnTheGpu) {
  auto cpu = StoriesEngine("cpu");
  auto gpu = StoriesEngine("cuda");
  ASSERT_TRUE(cpu && gpu);
  auto* cuda_runner = dynamic_cast<CudaModelRunner*>(&gpu->runner());
  ASSERT_NE(cuda_runner, nullptr);
  for (const SamplingCase& c :
       {SamplingCase{1.0f, 0, 1.0f}, SamplingCase{0.8f, 0, 0.9f}, SamplingCase{1.2f, 20, 0.95f}}) {
    GenerateRequest req = SampledStory(*gpu, c, /*seed=*/11);
    auto cpu_tokens = cpu->Generate(req);
    auto host_drawn = gpu->Generate(req);  // logits rows, sampled on the host
    req.callback_logits = false;
    const int64_t replayed = cuda_runner->graph_stats().replayed;
    size_t without_logits = 0;
    auto gpu_drawn = gpu->Generate(req, [&](int32_t, std::span<const float> logits) {
      without_logits += logits.empty();
      return true;
    });
    ASSERT_TRUE(cpu_tokens.ok() && host_drawn.ok() && gpu_drawn.ok());
    const std::string what = "T " + std::to_string(c.temperature) + " top_k " +
                             std::to_string(c.top_k) + " top_p " + std::to_string(c.top_p);
    EXPECT_EQ(gpu_drawn->tokens, host_drawn->tokens) << what;
    EXPECT_EQ(gpu_drawn->tokens, cpu_tokens->tokens) << what;
    EXPECT_EQ(without_logits, gpu_drawn->tokens.size()) << what;
    EXPECT_GT(cuda_runner->graph_stats().replayed, replayed) << what;
  }
  EXPECT_EQ(gpu->kv().used_blocks(), 0);
}

// A sampled speculative request that reads no logits gets its trees back as distribution rows
// computed on the GPU (kernels/sampling.cuh DistRows): only each node's kept tokens cross, in
// graphs too, and the tokens equal those of the same request verified on the host from the GPU's
// logits rows (the GPU's distributions differ from the host's ComputeProbs in the last bits:
// equal tokens unless an acceptance test lands within that of its threshold).
TEST(CudaRunner, SampledTreesAreVerifiedFromDistributionsMadeOnTheGpu) {
  auto gpu = StoriesEngine("cuda", true, SpecBudgetMode::kStatic);
  ASSERT_TRUE(gpu);
  auto* cuda_runner = dynamic_cast<CudaModelRunner*>(&gpu->runner());
  ASSERT_NE(cuda_runner, nullptr);
  EXPECT_TRUE(cuda_runner->returns_distributions());
  int64_t accepted = 0;
  for (const SamplingCase& c : {SamplingCase{1.0f, 0, 1.0f}, SamplingCase{0.8f, 0, 0.9f}}) {
    GenerateRequest req = SampledStory(*gpu, c, /*seed=*/5);
    req.tree_shape = *TreeShape::Parse("2,1,1");
    req.speculators = {*gpu->GetSpeculator("ngram")};
    auto from_logits = gpu->Generate(req);
    req.callback_logits = false;
    const int64_t replayed = cuda_runner->graph_stats().replayed;
    size_t without_logits = 0;
    auto from_dists = gpu->Generate(req, [&](int32_t, std::span<const float> logits) {
      without_logits += logits.empty();
      return true;
    });
    ASSERT_TRUE(from_logits.ok() && from_dists.ok());
    const std::string what =
        "T " + std::to_string(c.temperature) + " top_p " + std::to_string(c.top_p);
    EXPECT_EQ(from_dists->tokens, from_logits->tokens) << what;
    EXPECT_EQ(without_logits, from_dists->tokens.size()) << what;
    EXPECT_GT(from_dists->stats.spec.tree_nodes, 0) << what << ": no tree was verified";
    accepted += from_dists->stats.spec.accepted_tokens;
    EXPECT_GT(cuda_runner->graph_stats().replayed, replayed) << what;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_EQ(gpu->kv().used_blocks(), 0);
}

// The engine's decode and tree passes replay graphs, and --enforce-eager (cuda_graphs false)
// launches them kernel by kernel: sampled speculative generation with the same seed gives the
// same tokens either way.
TEST(CudaRunner, EnforceEagerSamplesTheSameTokens) {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<cuda::CudaGraphStats> stats;
  for (bool graphs : {true, false}) {
    // Full trees every step: the adaptive budget's depths follow measured times, and with them
    // how many random draws a step takes.
    auto engine = StoriesEngine("cuda", graphs, SpecBudgetMode::kStatic);
    ASSERT_TRUE(engine);
    GenerateRequest req;
    req.prompt_tokens = *engine->EncodePrompt("Once upon a time");
    req.max_new_tokens = testing::kEmulated ? 32 : 120;
    req.sampling.temperature = 0.8f;
    req.sampling.top_p = 0.9f;
    req.sampling.seed = 7;
    req.tree_shape = *TreeShape::Parse("2,1,1");
    req.speculators = {*engine->GetSpeculator("ngram")};
    auto r = engine->Generate(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    tokens.push_back(r->tokens);
    auto* cuda_runner = dynamic_cast<CudaModelRunner*>(&engine->runner());
    ASSERT_NE(cuda_runner, nullptr);
    stats.push_back(cuda_runner->graph_stats());
    // Cost calibration times a shape's first replay (capture and instantiation untimed).
    EXPECT_EQ(cuda_runner->warmup_passes(), graphs ? 2 : 0);
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_GT(stats[0].replayed, 0);
  EXPECT_EQ(stats[1].replayed, 0);
  EXPECT_EQ(stats[1].captured, 0);
}

// --draft-backend cuda: model and layers drafts get their runners from the registry like the
// LLM (here on the CPU), and greedy speculative output stays the incremental output.
TEST(CudaRunner, DraftsOnTheGpuKeepGreedyOutput) {
  cuda::RegisterCudaBackend();
  EngineOptions o;
  o.model_path = testing::Stories260KModel();
  o.tokenizer_path = testing::Stories260KTokenizer();
  o.num_threads = 2;
  o.draft_backend = "cuda";
  o.drafts = {"layers:2", "model:" + o.model_path};
  o.spec_budget = SpecBudgetMode::kStatic;  // every step's full tree: the passes counted below
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Engine& engine = **e;
  GenerateRequest req;
  req.prompt_tokens = *engine.EncodePrompt("Once upon a time");
  req.max_new_tokens = testing::kEmulated ? 24 : 120;
  req.sampling.temperature = 0;
  req.stop_tokens = engine.default_stop_tokens();
  auto base = engine.Generate(req);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  for (Speculator* s : engine.speculators()) {
    GenerateRequest sreq = req;
    sreq.tree_shape = *TreeShape::Parse("1,1,3,1");
    sreq.speculators = {s};
    auto r = engine.Generate(sreq);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->tokens, base->tokens) << s->name();
    EXPECT_LE(r->stats.decode_passes, base->stats.decode_passes) << s->name();
    // The model draft is the LLM itself: it guesses right, so the LLM runs fewer passes.
    if (s->name().starts_with("model:")) {
      EXPECT_LT(r->stats.decode_passes, base->stats.decode_passes);
    }
  }
}

// The default model (Q4_1 weights read directly by the kernels, activations in float32). Its
// exact counterpart on the CPU is the dequantised model (float32 weights equal to the Q4_1
// values, float32 activations): with a float32 KV cache the logits agree to float32 rounding.
// The default KV cache of a quantised model is fp16 (logits move by ~2e-2), and the CPU's
// quantised path rounds activations to 8 bits (Q8_1, logits off by up to ~0.8 on this prompt):
// against those only the next token is compared.
TEST(CudaRunner, QuantizedSmolLM2AgreesWithCpu) {
  const std::string path = testing::DefaultModel();
  if (path.empty()) GTEST_SKIP() << "default model not fetched";
  auto loaded = LoadModelAndTokenizer(path, "");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::shared_ptr<const Model> model(std::move(loaded->model));
  auto dequantized = DequantizeToF32(*model);
  ASSERT_TRUE(dequantized.ok()) << dequantized.status().ToString();
  auto cpu = MakeCpu(model, 16);
  auto cpu_f32 = MakeCpu(std::shared_ptr<const Model>(std::move(dequantized).value()), 16);
  CudaRunnerOptions f32_kv;
  f32_kv.kv_type = cuda::KvCacheType::kF32;
  auto gpu = MakeCuda(model, 16);
  auto gpu_f32_kv = MakeCuda(model, 16, f32_kv);
  ASSERT_TRUE(cpu && cpu_f32 && gpu && gpu_f32_kv);
  KvCacheManager kv_cpu(16, 16), kv_f32(16, 16), kv_gpu(16, 16), kv_gpu_f32(16, 16);
  const std::vector<int32_t> tokens = *loaded->tokenizer->Encode("The capital of France is", true);
  const int32_t n = static_cast<int32_t>(tokens.size());
  const std::vector<float> quantized = testing::PromptLogits(*cpu, kv_cpu, tokens, {n - 1});
  const std::vector<float> exact = testing::PromptLogits(*cpu_f32, kv_f32, tokens, {n - 1});
  const std::vector<float> got = testing::PromptLogits(*gpu, kv_gpu, tokens, {n - 1});
  const std::vector<float> got_f32_kv =
      testing::PromptLogits(*gpu_f32_kv, kv_gpu_f32, tokens, {n - 1});
  ASSERT_EQ(got_f32_kv.size(), exact.size());
  EXPECT_ALL_CLOSE(got_f32_kv, exact, 1e-3, 1e-3,
                   "SmolLM2 Q4_1 last logits (float32 KV) against float32 weights");
  auto argmax = [](const std::vector<float>& v) {
    return std::max_element(v.begin(), v.end()) - v.begin();
  };
  EXPECT_EQ(argmax(got), argmax(exact));
  EXPECT_EQ(argmax(got), argmax(quantized));
}

// A random Llama model (GQA 2, half RoPE) whose every matrix is of one of `types`, in turn (the
// token embedding and the tied output included): random quantised rows as the CPU's quant tests
// make them (testing::RandomRow), with their fp16 scales (d, dmin; Q4_1/Q5_1's minimum m too)
// divided by `divisor` so that the logits are of order 1 and the activations moderate. The
// storage lives as long as the process.
std::shared_ptr<const Model> RandomQuantModel(const std::vector<DType>& types, uint32_t seed,
                                              float divisor, const std::string& name) {
  ModelConfig c;
  c.dim = 256;
  c.hidden_dim = 512;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 96;
  c.max_seq_len = 128;
  c.rope_style = RopeStyle::kHalf;
  auto base = MakeRandomModel(c, 23);
  EXPECT_TRUE(base.ok()) << base.status().ToString();
  if (!base.ok()) return nullptr;
  static std::deque<std::unique_ptr<Model>> owners;  // keep the norm gains
  static std::deque<std::vector<uint8_t>> storage;
  owners.push_back(std::move(base).value());
  std::mt19937 rng(seed);
  size_t k = 0;
  auto requant = [&](WeightMatrix& m) {
    const DType t = types[k++ % types.size()];
    storage.emplace_back();
    std::vector<size_t> fields = testing::HalfFields(t);
    if (fields.empty())
      fields = testing::HasMinField(t) ? std::vector<size_t>{0, 2} : std::vector<size_t>{0};
    for (int64_t r = 0; r < m.rows; ++r) {
      std::vector<uint8_t> row = testing::RandomRow(t, m.cols, rng);
      const size_t bb = GetDTypeTraits(t).block_bytes;
      for (size_t off = 0; off < row.size(); off += bb)
        for (size_t f : fields)
          testing::PutHalf(row.data() + off + f, testing::GetHalf(row.data() + off + f) / divisor);
      storage.back().insert(storage.back().end(), row.begin(), row.end());
    }
    m = WeightMatrix{t, m.rows, m.cols, storage.back().data()};
  };
  ModelWeights w = owners.back()->weights();
  requant(w.token_embedding);
  for (LayerWeights& l : w.layers)
    for (WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      requant(*m);
  w.output = w.token_embedding;
  return std::make_shared<Model>(c, w, name);
}

// Every matrix a K-quant, the five types in turn (d and dmin divided by 8: logits rms ~0.7).
std::shared_ptr<const Model> KQuantModel() {
  static std::shared_ptr<const Model> model = RandomQuantModel(
      {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}, 29, 8.0f,
      "k-quant random");
  return model;
}

// Every matrix a 32-element block type, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 in turn (scales and
// minima divided by 16).
std::shared_ptr<const Model> BlockQuantModel() {
  static std::shared_ptr<const Model> model = RandomQuantModel(
      {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0}, 37, 16.0f,
      "block-quant random");
  return model;
}

// Prompt logits of `model` on the GPU against the CPU running the same weights dequantised to
// float32: batch-invariant passes (the linear kernel reading the blocks) within `tol`,
// batch-dependent ones (matrices dequantised to fp16 for cuBLAS) within `cublas_tol`.
void ExpectQuantModelMatchesDequantizedCpu(std::shared_ptr<const Model> model, double tol,
                                           double cublas_tol) {
  ASSERT_TRUE(model);
  auto dequantized = DequantizeToF32(*model);
  ASSERT_TRUE(dequantized.ok()) << dequantized.status().ToString();
  auto cpu = MakeCpu(std::shared_ptr<const Model>(std::move(dequantized).value()), 16);
  CudaRunnerOptions o;
  o.kv_type = cuda::KvCacheType::kF32;
  auto gpu = MakeCuda(model, 16, o);
  ASSERT_TRUE(cpu && gpu);
  const int32_t n = 24;
  const std::vector<int32_t> tokens = SomeTokens(n, model->config().vocab_size, 31);
  KvCacheManager kv_cpu(16, 16), kv_gpu(16, 16);
  const std::vector<float> want = testing::PromptLogits(*cpu, kv_cpu, tokens, AllRows(n));
  for (const float v : want) ASSERT_TRUE(std::isfinite(v));
  const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
  EXPECT_GT(*hi - *lo, 0.5f) << "logits too flat to say much";
  for (bool invariant : {true, false}) {
    const SeqId s = kv_gpu.AddSequence();
    ASSERT_TRUE(kv_gpu.Reserve(s, n).ok());
    ForwardBatch b;
    b.AddSequence(s, tokens, AllRows(n), 0, nullptr);
    b.logit_rows = AllRows(n);
    b.batch_invariant = invariant;
    std::vector<float> got(want.size());
    ASSERT_TRUE(gpu->Forward(b, kv_gpu, got).ok());
    kv_gpu.RemoveSequence(s);
    if (invariant) {
      EXPECT_ALL_CLOSE(got, want, tol, tol, model->source() + " prompt logits, linear kernel");
    } else {
      EXPECT_ALL_CLOSE(got, want, cublas_tol, cublas_tol,
                       model->source() + " prompt logits, cuBLAS on fp16");
    }
  }
}

// K-quant weights on the GPU against the CPU running the same weights dequantised to float32
// (the CPU's own K-quant path rounds activations to Q8_K, so it is not the exact counterpart):
// batch-invariant prompt passes (the linear kernel reading the blocks) agree to float32
// rounding (largest difference seen on the emulator 1.8e-6); batch-dependent ones (the K-quant
// matrices dequantised to fp16 for cuBLAS, fp16 activations) to fp16 rounding (2.8e-3 seen).
TEST(CudaRunner, KQuantModelMatchesDequantizedCpu) {
  ExpectQuantModelMatchesDequantizedCpu(KQuantModel(), 1e-4, 2e-2);
}

// The same for the 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 matrices.
TEST(CudaRunner, BlockQuantModelMatchesDequantizedCpu) {
  ExpectQuantModelMatchesDequantizedCpu(BlockQuantModel(), 1e-4, 2e-2);
}

// KQuantModel() as a GGUF file (llama architecture, K-quant tensors as GGUF stores them, tied
// output): the loader's K-quant tensors reach the GPU, whose logits match the CPU on the
// dequantised file to float32 rounding.
TEST(CudaRunner, KQuantGgufFileRunsLikeItsDequantizedCpuModel) {
  auto source = KQuantModel();
  ASSERT_TRUE(source);
  const ModelConfig& c = source->config();
  const ModelWeights& w = source->weights();
  auto ggml_id = [](DType t) -> uint32_t {
    return t == DType::kQ2_K   ? 10
           : t == DType::kQ3_K ? 11
           : t == DType::kQ4_K ? 12
           : t == DType::kQ5_K ? 13
                               : 14;
  };
  GgufWriter g;
  g.KvString("general.architecture", "llama");
  g.KvU32("llama.block_count", c.n_layers);
  g.KvU32("llama.context_length", c.max_seq_len);
  g.KvU32("llama.embedding_length", c.dim);
  g.KvU32("llama.feed_forward_length", c.hidden_dim);
  g.KvU32("llama.attention.head_count", c.n_heads);
  g.KvU32("llama.attention.head_count_kv", c.n_kv_heads);
  g.KvF32("llama.rope.freq_base", 10000.0f);
  g.KvF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  auto matrix = [&](const std::string& name, const WeightMatrix& m) {
    g.TensorBytes(name, {m.cols, m.rows}, ggml_id(m.type), static_cast<const uint8_t*>(m.data),
                  static_cast<size_t>(RowBytes(m.type, m.cols) * m.rows));
  };
  matrix("token_embd.weight", w.token_embedding);
  g.Tensor("output_norm.weight", {c.dim}, w.final_norm.data);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    g.Tensor(p + "attn_norm.weight", {c.dim}, lw.attn_norm.data);
    g.Tensor(p + "ffn_norm.weight", {c.dim}, lw.ffn_norm.data);
    matrix(p + "attn_q.weight", lw.wq);
    matrix(p + "attn_k.weight", lw.wk);
    matrix(p + "attn_v.weight", lw.wv);
    matrix(p + "attn_output.weight", lw.wo);
    matrix(p + "ffn_gate.weight", lw.w_gate);
    matrix(p + "ffn_down.weight", lw.w_down);
    matrix(p + "ffn_up.weight", lw.w_up);
  }
  const auto dir = std::filesystem::temp_directory_path() / "specinfer_cuda_kquant_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "kquant.gguf").string();
  {
    const std::string bytes = g.Finish();
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::shared_ptr<const Model> model(std::move(loaded).value());
  EXPECT_EQ(model->weights().layers[0].wq.type, DType::kQ3_K);
  EXPECT_EQ(model->weights().token_embedding.type, DType::kQ2_K);
  auto dequantized = DequantizeToF32(*model);
  ASSERT_TRUE(dequantized.ok()) << dequantized.status().ToString();
  auto cpu = MakeCpu(std::shared_ptr<const Model>(std::move(dequantized).value()), 8);
  CudaRunnerOptions o;
  o.kv_type = cuda::KvCacheType::kF32;
  auto gpu = MakeCuda(model, 8, o);
  ASSERT_TRUE(cpu && gpu);
  const std::vector<int32_t> tokens = SomeTokens(9, c.vocab_size, 41);
  KvCacheManager kv_cpu(8, 16), kv_gpu(8, 16);
  const std::vector<float> want = testing::PromptLogits(*cpu, kv_cpu, tokens, AllRows(9));
  const std::vector<float> got = testing::PromptLogits(*gpu, kv_gpu, tokens, AllRows(9));
  ASSERT_EQ(got.size(), want.size());
  EXPECT_ALL_CLOSE(got, want, 1e-4, 1e-4, "K-quant GGUF prompt logits");
  std::filesystem::remove_all(dir);
}

// Tree verification on K-quant weights: one pass over a token tree gives every node the logits,
// bit for bit, of decoding its path token by token after the same prompt (what greedy
// speculative output equal to incremental output rests on).
TEST(CudaRunner, KQuantTreePassEqualsIncrementalDecoding) {
  auto model = KQuantModel();
  ASSERT_TRUE(model);
  auto gpu = MakeCuda(model, 16);  // default KV cache (fp16 for quantised weights)
  ASSERT_TRUE(gpu);
  const int32_t vocab = model->config().vocab_size;
  const int32_t np = 13;
  const std::vector<int32_t> prompt = SomeTokens(np, vocab, 37);
  // 0 -> {1, 2}, 1 -> {3, 4}, 2 -> {5}, 5 -> {6}: leaves 3, 4, 6.
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 1, 2, 5};
  const std::vector<int32_t> toks = {7, 50, 3, 91, 12, 12, 60};
  const std::vector<int32_t> depth = {0, 1, 1, 2, 2, 2, 3};
  const int32_t nt = static_cast<int32_t>(parents.size());
  KvCacheManager kv(16, 16);
  auto prefill = [&](SeqId s) {
    ForwardBatch pb;
    pb.AddSequence(s, prompt, AllRows(np), 0, nullptr);
    pb.logit_rows = {np - 1};
    std::vector<float> l(static_cast<size_t>(vocab));
    return gpu->Forward(pb, kv, l);
  };
  const SeqId t = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(t, np + nt).ok());
  ASSERT_TRUE(prefill(t).ok());
  const TreeMask mask = TreeMask::FromParents(parents);
  std::vector<int32_t> tpos(static_cast<size_t>(nt));
  for (int32_t i = 0; i < nt; ++i) tpos[i] = np + depth[i];
  ForwardBatch tb;
  tb.AddSequence(t, toks, tpos, np, &mask);
  tb.logit_rows = AllRows(nt);
  std::vector<float> tree(static_cast<size_t>(nt) * vocab);
  ASSERT_TRUE(gpu->Forward(tb, kv, tree).ok());
  for (float v : tree) ASSERT_TRUE(std::isfinite(v));

  int32_t checked = 0;
  for (int32_t leaf : {3, 4, 6}) {
    std::vector<int32_t> path;
    for (int32_t v = leaf; v >= 0; v = parents[v]) path.insert(path.begin(), v);
    const SeqId s = kv.AddSequence();
    ASSERT_TRUE(kv.Reserve(s, np + static_cast<int32_t>(path.size())).ok());
    ASSERT_TRUE(prefill(s).ok());
    for (size_t d = 0; d < path.size(); ++d) {
      const int32_t pos = np + static_cast<int32_t>(d);
      ForwardBatch db;
      db.AddSequence(s, std::vector<int32_t>{toks[path[d]]}, std::vector<int32_t>{pos}, pos,
                     nullptr);
      db.logit_rows = {0};
      std::vector<float> step(static_cast<size_t>(vocab));
      ASSERT_TRUE(gpu->Forward(db, kv, step).ok());
      const std::vector<float> want(tree.begin() + path[d] * vocab,
                                    tree.begin() + (path[d] + 1) * vocab);
      EXPECT_ALL_CLOSE(
          step, want, 0.0, 0.0,
          "node " + std::to_string(path[d]) + " decoded after leaf path " + std::to_string(leaf));
      ++checked;
    }
    kv.RemoveSequence(s);
  }
  EXPECT_EQ(checked, 10);  // every node, the shared ones once per path
}

// Planned memory that the GPU cannot hold is ResourceExhausted naming the sizes, not a crash;
// the device stays usable.
TEST(CudaRunner, OutOfMemoryIsAnError) {
  auto model = Stories();
  ASSERT_TRUE(model);
  CudaRunnerOptions o;
  o.num_kv_blocks = 1 << 30;  // ~ 2.7 TB of KV cache
  auto r = CudaModelRunner::Create(model, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("KV cache"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(MakeCuda(model, 8) != nullptr);
}

// Weights generated on the device (the benchmark's 7B-shaped models, here small) run and give
// finite logits, with fp16 weights through both the invariant kernel and cuBLAS.
TEST(CudaRunner, RandomDeviceWeightsRun) {
  ModelConfig c;
  c.dim = 512;
  c.hidden_dim = 1376;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 8;
  c.head_dim = 64;
  c.vocab_size = 1000;
  c.max_seq_len = 512;
  CudaRunnerOptions o;
  o.num_kv_blocks = 40;
  auto r = CudaModelRunner::CreateRandom(c, DType::kF16, 1, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  KvCacheManager kv(40, 16);
  for (bool invariant : {true, false}) {
    const SeqId s = kv.AddSequence();
    ASSERT_TRUE(kv.Reserve(s, 64).ok());
    ForwardBatch b;
    b.AddSequence(s, SomeTokens(64, c.vocab_size, 4), AllRows(64), 0, nullptr);
    b.logit_rows = {0, 63};
    b.batch_invariant = invariant;
    std::vector<float> logits(2 * 1000);
    ASSERT_TRUE((*r)->Forward(b, kv, logits).ok());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    kv.RemoveSequence(s);
  }
}

}  // namespace
}  // namespace specinfer

namespace specinfer {
namespace {

// What the CUDA backend does not implement is refused by name when the runner is created, never
// computed wrongly: a weight type it has no kernels for (Q8_K, the K-quants' activation type,
// which no model file holds). (Every decoder-family switch of model_config.h runs on the GPU:
// HfFamiliesMatchTransformersAndDecodeAsTheyPrefill.)
TEST(CudaRunner, UnsupportedWeightTypesAreRefused) {
  // A plain Llama whose wq is Q8_K.
  auto m = ModelFromHfDirectory(testing::SourcePath("tests/data/arch/llama3"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ModelWeights w = (*m)->weights();
  std::vector<uint8_t> q8k(RowBytes(DType::kQ8_K, 256) * w.layers[0].wq.rows);
  const ModelConfig c = (*m)->config();
  // (refused on its type, before any shape is looked at)
  w.layers[0].wq = WeightMatrix{DType::kQ8_K, w.layers[0].wq.rows, 256, q8k.data()};
  CudaRunnerOptions o;
  o.num_kv_blocks = 4;
  auto r = CudaModelRunner::Create(std::make_shared<Model>(c, w, "q8_k"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("Q8_K"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace specinfer
