// CudaModelRunner as one share of a TP x PP group (ranks as threads, each on its own device, over
// ThreadCollectiveGroup): the assembled logits of the last stage's ranks against the whole-model
// CUDA runner (bit for bit on batch-invariant passes, as the split promises; within the cuBLAS
// tolerance on a prompt pass that may use it) and against the single-process CPU runner (the
// tolerance of cuda_runner_test.cc), on stories260K and a random GQA model with uneven shares,
// through prompts, a token tree, KV compaction and decode steps, in pieces of max_batch_tokens.
// Failure paths: a rank whose pass fails, and a rank that never runs it, end every rank's pass
// with an error (no hang); layouts the model cannot take are refused at Create, and a share
// without a group refuses to run.
// On real GPUs (cuda_tests) each test needs as many devices as ranks, else it skips itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <latch>
#include <numeric>
#include <random>
#include <thread>

#include "backend/cpu/cpu_runner.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/thread_collective.h"
#include "cuda_test_util.h"
#include "model/hf_loader.h"
#include "model/loader.h"
#include "model/random_model.h"
#include "quant/quant_random.h"
#include "test_util.h"

namespace specinfer {
namespace {

using namespace std::chrono_literals;
using cuda::CudaModelRunner;
using cuda::CudaRunnerOptions;

constexpr int32_t kBlocks = 16;

std::shared_ptr<const Model> Stories() {
  static std::shared_ptr<const Model> model = [] {
    auto loaded =
        LoadModelAndTokenizer(testing::Stories260KModel(), testing::Stories260KTokenizer());
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    return loaded.ok() ? std::shared_ptr<const Model>(std::move(loaded->model)) : nullptr;
  }();
  return model;
}

// GQA 4 (8 query heads over 2 KV heads), 3 layers (PP 2: 2 + 1), and widths that split unevenly
// over 2 ranks: hidden 330 (165 + 165 is even, but q and vocab are not), vocab 301.
std::shared_ptr<const Model> RandomGqa() {
  static std::shared_ptr<const Model> model = [] {
    ModelConfig c;
    c.dim = 128;
    c.hidden_dim = 330;
    c.n_layers = 3;
    c.n_heads = 8;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 301;
    c.max_seq_len = 128;
    c.rope_style = RopeStyle::kHalf;
    auto m = MakeRandomModel(c, 23);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::shared_ptr<const Model>(std::move(m).value()) : nullptr;
  }();
  return model;
}

// Every matrix in a block or 16-bit type the GPU reads directly (Q4_1, Q8_0, Q6_K, Q5_0, Q4_K,
// Q5_1, F16 in turn): a share's rows of a block type are whole rows of blocks, and a 16-bit model
// gets a 16-bit KV cache, so this covers the row slicing of quantised weights and the q cast of a
// share. Built once; the storage lives as long as the process.
std::shared_ptr<const Model> QuantizedGqa() {
  static std::shared_ptr<const Model> model = []() -> std::shared_ptr<const Model> {
    ModelConfig c;
    c.dim = 256;
    c.hidden_dim = 512;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.vocab_size = 97;
    c.max_seq_len = 128;
    auto base = MakeRandomModel(c, 31);
    EXPECT_TRUE(base.ok()) << base.status().ToString();
    if (!base.ok()) return nullptr;
    static std::unique_ptr<Model> owner = std::move(base).value();  // keeps the norm gains
    static std::vector<std::vector<uint8_t>> storage;
    storage.reserve(64);
    const DType types[] = {DType::kQ4_1, DType::kQ8_0, DType::kQ6_K, DType::kQ5_0,
                           DType::kQ4_K, DType::kQ5_1, DType::kF16};
    std::mt19937 rng(37);
    int k = 0;
    auto requant = [&](WeightMatrix& m) {
      const DType t = types[k++ % std::size(types)];
      storage.emplace_back();
      // Scales (and Q4_1/Q5_1's minimum) divided by 16, fp16 values of N(0, 0.02): activations stay
      // moderate (the cuBLAS pass casts them to fp16).
      std::normal_distribution<float> normal(0.0f, 0.02f);
      for (int64_t r = 0; r < m.rows; ++r) {
        std::vector<uint8_t> row = testing::RandomRow(t, m.cols, rng);
        if (t == DType::kF16) {
          for (int64_t i = 0; i < m.cols; ++i) {
            const uint16_t h = Fp32ToFp16(normal(rng));
            std::memcpy(row.data() + 2 * i, &h, 2);
          }
        } else {
          std::vector<size_t> fields = testing::HalfFields(t);
          if (fields.empty())
            fields = testing::HasMinField(t) ? std::vector<size_t>{0, 2} : std::vector<size_t>{0};
          const size_t bb = GetDTypeTraits(t).block_bytes;
          for (size_t off = 0; off < row.size(); off += bb)
            for (size_t f : fields)
              testing::PutHalf(row.data() + off + f, testing::GetHalf(row.data() + off + f) / 16);
        }
        storage.back().insert(storage.back().end(), row.begin(), row.end());
      }
      m = WeightMatrix{t, m.rows, m.cols, storage.back().data()};
    };
    ModelWeights w = owner->weights();
    requant(w.token_embedding);
    for (LayerWeights& l : w.layers)
      for (WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        requant(*m);
    requant(w.output);
    return std::make_shared<Model>(c, w, "quantised random");
  }();
  return model;
}

// RandomGqa's shape with Qwen2's q/k/v biases (random, so that a share that adds another rank's
// slice of them gives other logits) and interleaved RoPE.
std::shared_ptr<const Model> RandomGqaWithBiases() {
  static std::shared_ptr<const Model> model = []() -> std::shared_ptr<const Model> {
    ModelConfig c = RandomGqa()->config();
    c.rope_style = RopeStyle::kInterleaved;
    auto base = MakeRandomModel(c, 41);
    EXPECT_TRUE(base.ok()) << base.status().ToString();
    if (!base.ok()) return nullptr;
    static std::unique_ptr<Model> owner = std::move(base).value();
    static std::vector<std::vector<float>> storage;
    storage.reserve(16);
    std::mt19937 rng(43);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    auto bias = [&](int64_t n) {
      storage.emplace_back(static_cast<size_t>(n));
      for (float& v : storage.back()) v = normal(rng);
      return WeightVector{storage.back().data(), n};
    };
    ModelWeights w = owner->weights();
    for (LayerWeights& l : w.layers) {
      l.bq = bias(c.q_dim());
      l.bk = bias(c.kv_dim());
      l.bv = bias(c.kv_dim());
    }
    c.attention_bias = true;
    return std::make_shared<Model>(c, w, "random with biases");
  }();
  return model;
}

std::vector<int32_t> SomeTokens(int32_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = std::uniform_int_distribution<int32_t>(1, vocab - 1)(rng);
  return t;
}

std::vector<int32_t> Range(int32_t begin, int32_t n) {
  std::vector<int32_t> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), begin);
  return r;
}

// The logits of one pass: [rows, cols], and whether the pass was batch-invariant.
struct PassLogits {
  std::vector<float> values;
  int32_t rows = 0;
  bool invariant = true;
};

// How a runner runs a batch and a KV move (the ModelRunner interface, or with block tables).
struct Driver {
  std::function<Status(const ForwardBatch&, const KvCacheManager&, std::span<float>)> forward;
  std::function<Status(const KvCacheManager&, SeqId, std::span<const int32_t>,
                       std::span<const int32_t>)>
      move;
};

Driver ViaRunner(ModelRunner& r) {
  return {[&r](const ForwardBatch& b, const KvCacheManager& kv, std::span<float> l) {
            return r.Forward(b, kv, l);
          },
          [&r](const KvCacheManager& kv, SeqId s, std::span<const int32_t> src,
               std::span<const int32_t> dst) { return r.MoveKv(kv, s, src, dst); }};
}

Driver ViaTables(CudaModelRunner& r) {
  return {
      [&r](const ForwardBatch& b, const KvCacheManager& kv, std::span<float> l) {
        std::vector<std::span<const int32_t>> tables;
        for (const BatchSequence& s : b.seqs) tables.push_back(kv.BlockTable(s.seq));
        return r.ForwardWithTables(b, tables, l);
      },
      [&r](const KvCacheManager& kv, SeqId s, std::span<const int32_t> src,
           std::span<const int32_t> dst) { return r.MoveKvWithTable(kv.BlockTable(s), src, dst); }};
}

// The same passes on any runner (each rank of a group runs them with its own manager, whose
// plans are the same): a prompt, a prompt batched with a 6-node tree of the first sequence, KV
// compaction of the accepted path, a decode step of both, and last a non-invariant prompt of a
// third sequence (cuBLAS takes it: its K/V would make later passes of that sequence differ in
// the last bits, so it comes last). `cols` is the logits width the runner writes (its
// vocabulary share).
StatusOr<std::vector<PassLogits>> RunScenario(const Driver& d, int32_t vocab, int32_t cols) {
  KvCacheManager kv(kBlocks, 16);
  std::vector<PassLogits> out;
  auto pass = [&](const ForwardBatch& b) -> Status {
    PassLogits p;
    p.rows = static_cast<int32_t>(b.logit_rows.size());
    p.invariant = b.batch_invariant;
    p.values.assign(static_cast<size_t>(p.rows) * cols, 0.0f);
    SI_RETURN_IF_ERROR(d.forward(b, kv, p.values));
    out.push_back(std::move(p));
    return Status::Ok();
  };
  const SeqId a = kv.AddSequence(), b = kv.AddSequence();
  SI_RETURN_IF_ERROR(kv.Reserve(a, 23 + 6));
  SI_RETURN_IF_ERROR(kv.Reserve(b, 9 + 1));
  {
    ForwardBatch pb;
    pb.AddSequence(a, SomeTokens(23, vocab, 5), Range(0, 23), 0, nullptr);
    pb.logit_rows = {0, 11, 22};
    SI_RETURN_IF_ERROR(pass(pb));
  }
  const TreeMask mask = TreeMask::FromParents(std::vector<int32_t>{-1, 0, 0, 1, 2, 2});
  {
    ForwardBatch tb;
    tb.AddSequence(b, SomeTokens(9, vocab, 6), Range(0, 9), 0, nullptr);
    tb.AddSequence(a, SomeTokens(6, vocab, 7), std::vector<int32_t>{23, 24, 24, 25, 25, 25}, 23,
                   &mask);
    tb.logit_rows = Range(0, 15);
    SI_RETURN_IF_ERROR(pass(tb));
  }
  // Accept 0 -> 2 -> 5 of the tree: positions 25 and 28 move to 24 and 25.
  SI_RETURN_IF_ERROR(d.move(kv, a, std::vector<int32_t>{25, 28}, std::vector<int32_t>{24, 25}));
  kv.Truncate(a, 26);
  SI_RETURN_IF_ERROR(kv.Reserve(a, 27));
  {
    ForwardBatch db;
    db.AddSequence(a, std::vector<int32_t>{7}, std::vector<int32_t>{26}, 26, nullptr);
    db.AddSequence(b, std::vector<int32_t>{9}, std::vector<int32_t>{9}, 9, nullptr);
    db.logit_rows = {0, 1};
    SI_RETURN_IF_ERROR(pass(db));
  }
  {
    const SeqId c = kv.AddSequence();
    SI_RETURN_IF_ERROR(kv.Reserve(c, 20));
    ForwardBatch pb;
    pb.AddSequence(c, SomeTokens(20, vocab, 8), Range(0, 20), 0, nullptr);
    pb.logit_rows = {3, 19};
    pb.batch_invariant = false;
    SI_RETURN_IF_ERROR(pass(pb));
  }
  return out;
}

struct RankResult {
  Status status;
  std::vector<PassLogits> passes;
  ShardRange vocab;
  bool last_stage = false;
};

struct GroupSpec {
  int32_t stages = 1, tp = 1;
  int32_t max_batch_tokens = 512;
  bool with_tables = false;
  std::chrono::milliseconds timeout = 120s;
  // Runs instead of the scenario on rank (stage, tp) when set (failure tests).
  std::function<Status(int32_t, int32_t, CudaModelRunner&)> override_rank;
};

// Creates every rank's runner on its own thread and device and runs the scenario there.
std::vector<RankResult> RunGroup(std::shared_ptr<const Model> model, const GroupSpec& g) {
  auto group = cuda::ThreadCollectiveGroup::Create(g.stages, g.tp, g.timeout);
  EXPECT_TRUE(group.ok()) << group.status().ToString();
  if (!group.ok()) return {};
  std::vector<RankResult> results(static_cast<size_t>(g.stages * g.tp));
  std::vector<std::thread> threads;
  for (int32_t s = 0; s < g.stages; ++s)
    for (int32_t r = 0; r < g.tp; ++r)
      threads.emplace_back([&, s, r] {
        RankResult& res = results[static_cast<size_t>(s * g.tp + r)];
        auto coll = (*group)->Rank(s, r);
        if (!coll.ok()) {
          res.status = coll.status();
          return;
        }
        CudaRunnerOptions o;
        o.device = s * g.tp + r;
        o.num_kv_blocks = kBlocks;
        o.max_batch_tokens = g.max_batch_tokens;
        o.layout = (*coll)->layout();
        o.collective = std::move(coll).value();
        auto runner = CudaModelRunner::Create(model, o);
        if (!runner.ok()) {
          res.status = runner.status();
          (*group)->Abort(res.status);
          return;
        }
        res.vocab = (*runner)->vocab();
        res.last_stage = (*runner)->last_stage();
        if (g.override_rank) {
          res.status = g.override_rank(s, r, **runner);
          return;
        }
        const Driver d = g.with_tables ? ViaTables(**runner) : ViaRunner(**runner);
        auto passes =
            RunScenario(d, model->config().vocab_size, static_cast<int32_t>(res.vocab.count));
        res.status = passes.status();
        if (passes.ok()) res.passes = std::move(passes).value();
      });
  for (std::thread& t : threads) t.join();
  return results;
}

// The full logits of every pass, from the last stage's ranks' columns.
std::vector<PassLogits> Assemble(const std::vector<RankResult>& ranks, int32_t vocab) {
  std::vector<PassLogits> full;
  for (const RankResult& r : ranks) {
    if (!r.last_stage) continue;
    if (full.empty()) {
      for (const PassLogits& p : r.passes)
        full.push_back(
            {std::vector<float>(static_cast<size_t>(p.rows) * vocab, NAN), p.rows, p.invariant});
    }
    for (size_t i = 0; i < r.passes.size() && i < full.size(); ++i)
      for (int32_t row = 0; row < full[i].rows; ++row)
        std::memcpy(&full[i].values[static_cast<size_t>(row) * vocab + r.vocab.begin],
                    &r.passes[i].values[static_cast<size_t>(row) * r.vocab.count],
                    static_cast<size_t>(r.vocab.count) * sizeof(float));
  }
  return full;
}

bool EnoughDevices(int32_t ranks) { return cuda::DeviceCount() >= ranks; }

// `compare_cpu`: also against the CPU runner (float32 models: the GPU's own tolerance).
// `tolerance`: absolute and relative, on the passes that are not batch-invariant.
void ExpectGroupMatches(std::shared_ptr<const Model> model, GroupSpec g, bool compare_cpu = true,
                        double tolerance = 1e-4) {
  const int32_t vocab = model->config().vocab_size;
  // References: the whole model on one GPU and on the CPU.
  CudaRunnerOptions whole_o;
  whole_o.num_kv_blocks = kBlocks;
  auto whole = CudaModelRunner::Create(model, whole_o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto want_gpu = RunScenario(ViaRunner(**whole), vocab, vocab);
  ASSERT_TRUE(want_gpu.ok()) << want_gpu.status().ToString();
  CpuRunnerOptions cpu_o;
  cpu_o.num_threads = 2;
  cpu_o.num_kv_blocks = kBlocks;
  auto cpu = CpuModelRunner::Create(model, cpu_o);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  StatusOr<std::vector<PassLogits>> want_cpu = std::vector<PassLogits>{};
  if (compare_cpu) want_cpu = RunScenario(ViaRunner(**cpu), vocab, vocab);
  ASSERT_TRUE(want_cpu.ok()) << want_cpu.status().ToString();

  const std::vector<RankResult> ranks = RunGroup(model, g);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(g.stages * g.tp));
  for (size_t i = 0; i < ranks.size(); ++i)
    ASSERT_TRUE(ranks[i].status.ok()) << "rank " << i << ": " << ranks[i].status.ToString();
  const std::vector<PassLogits> got = Assemble(ranks, vocab);
  ASSERT_EQ(got.size(), want_gpu->size());
  const std::string layout = std::to_string(g.tp) + " x " + std::to_string(g.stages) + ", " +
                             model->config().ToString() + ", pass ";
  for (size_t i = 0; i < got.size(); ++i) {
    // Logits that are all one value would make the comparisons below say little.
    const auto [lo, hi] = std::minmax_element(got[i].values.begin(), got[i].values.end());
    ASSERT_FALSE(got[i].values.empty());
    EXPECT_GT(*hi - *lo, 0.1f) << layout << i;
    if (got[i].invariant) {
      EXPECT_ALL_CLOSE(got[i].values, (*want_gpu)[i].values, 0.0, 0.0,
                       "bit-exact vs one GPU, TP x PP " + layout + std::to_string(i));
    } else {
      EXPECT_ALL_CLOSE(got[i].values, (*want_gpu)[i].values, tolerance, tolerance,
                       "vs one GPU, TP x PP " + layout + std::to_string(i));
    }
    if (compare_cpu)
      EXPECT_ALL_CLOSE(got[i].values, (*want_cpu)[i].values, 1e-4, 1e-4,
                       "vs the CPU, TP x PP " + layout + std::to_string(i));
  }
}

TEST(CudaShardRunner, Stories260KTensorParallel2MatchesOneGpuAndCpu) {
  if (!EnoughDevices(2)) GTEST_SKIP() << "needs 2 GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(Stories());
  GroupSpec g;
  g.tp = 2;
  ExpectGroupMatches(Stories(), g);
}

// Pipeline stages hand activations on per piece: pieces of 7 tokens make several per pass.
TEST(CudaShardRunner, Stories260KTp2Pp2InPiecesMatchesOneGpuAndCpu) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(Stories());
  GroupSpec g;
  g.tp = 2;
  g.stages = 2;
  g.max_batch_tokens = 7;
  ExpectGroupMatches(Stories(), g);
}

TEST(CudaShardRunner, RandomGqaTp2AndTp2Pp2MatchOneGpuAndCpu) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(RandomGqa());
  GroupSpec g;
  g.tp = 2;
  g.with_tables = true;
  ExpectGroupMatches(RandomGqa(), g);
  g.stages = 2;
  ExpectGroupMatches(RandomGqa(), g);
}

TEST(CudaShardRunner, QkvBiasesTp2Pp2MatchOneGpuAndCpu) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(RandomGqaWithBiases());
  GroupSpec g;
  g.tp = 2;
  g.stages = 2;
  ExpectGroupMatches(RandomGqaWithBiases(), g);
}

// Transformers' tiny Qwen3, Mistral and Gemma 3 (tests/data/arch): each Qwen3 share norms its own
// heads' q and k (QK-norm) with the layer's whole gain vectors (q_dim is twice dim); Mistral's
// shares attend within its sliding window of 5 positions (the scenario's prompts are longer);
// Gemma's post-norms apply to whole rows after the all-gather, Gemma 2's final soft-capping to
// each share's columns.
TEST(CudaShardRunner, Qwen3MistralGemmaTp2Pp2MatchOneGpuAndCpu) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  for (const char* family : {"qwen3", "mistral", "gemma2", "gemma3"}) {
    auto m = ModelFromHfDirectory(testing::SourcePath(std::string("tests/data/arch/") + family));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    std::shared_ptr<const Model> model = std::move(m).value();
    ASSERT_TRUE(model->config().qk_norm || model->config().sliding_window > 0) << family;
    SCOPED_TRACE(family);
    GroupSpec g;
    g.tp = 2;
    g.stages = 2;
    ExpectGroupMatches(model, g);
  }
}

// Quantised and 16-bit weights, a 16-bit KV cache: the shares' logits are the whole-model GPU
// runner's columns (the whole model against the CPU is cuda_runner_test.cc's business).
TEST(CudaShardRunner, QuantizedWeightsTp2Pp2MatchOneGpu) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(QuantizedGqa());
  GroupSpec g;
  g.tp = 2;
  g.stages = 2;
  // Its cuBLAS passes cast activations to fp16 (and the KV cache is 16-bit): a reduction split
  // over the TP ranks sums in another order, which flips an fp16 rounding now and then (2.6e-4
  // on the logits, seen on a Sapphire Rapids host whose OpenBLAS kernels run the emulated
  // cuBLAS; 1e-4 held on the others). The batch-invariant passes stay bit-exact.
  ExpectGroupMatches(QuantizedGqa(), g, /*compare_cpu=*/false, /*tolerance=*/1e-3);
}

// A rank whose pass fails (here: a token outside the vocabulary, refused before any collective)
// aborts the group: its peers' passes end with ABORTED long before the group's timeout.
TEST(CudaShardRunner, FailingRankAbortsItsPeers) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(Stories());
  GroupSpec g;
  g.tp = 2;
  g.stages = 2;
  g.timeout = 600s;
  const int32_t vocab = Stories()->config().vocab_size;
  g.override_rank = [&](int32_t s, int32_t r, CudaModelRunner& runner) -> Status {
    KvCacheManager kv(kBlocks, 16);
    const SeqId seq = kv.AddSequence();
    SI_RETURN_IF_ERROR(kv.Reserve(seq, 12));
    ForwardBatch b;
    std::vector<int32_t> tokens = SomeTokens(12, vocab, 1);
    if (s == 1 && r == 1) tokens[3] = vocab + 5;
    b.AddSequence(seq, tokens, Range(0, 12), 0, nullptr);
    b.logit_rows = {11};
    std::vector<float> logits(static_cast<size_t>(runner.vocab().count));
    return runner.Forward(b, kv, logits);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<RankResult> ranks = RunGroup(Stories(), g);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 300s);
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_EQ(ranks[3].status.code(), StatusCode::kInvalidArgument) << ranks[3].status.ToString();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ranks[i].status.code(), StatusCode::kAborted)
        << "rank " << i << ": " << ranks[i].status.ToString();
    EXPECT_NE(ranks[i].status.message().find("stage 1 tp rank 1"), std::string::npos)
        << ranks[i].status.ToString();
  }
}

// A rank that never runs the pass (a dead worker): its peers' waits end after the group's
// timeout with DEADLINE_EXCEEDED (or ABORTED, once one of them has failed the group).
TEST(CudaShardRunner, MissingRankTimesOut) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  ASSERT_TRUE(Stories());
  GroupSpec g;
  g.tp = 2;
  g.stages = 2;
  g.timeout = 2s;
  const int32_t vocab = Stories()->config().vocab_size;
  g.override_rank = [&](int32_t s, int32_t r, CudaModelRunner& runner) -> Status {
    if (s == 0 && r == 1) return Status::Ok();  // never arrives
    KvCacheManager kv(kBlocks, 16);
    const SeqId seq = kv.AddSequence();
    SI_RETURN_IF_ERROR(kv.Reserve(seq, 5));
    ForwardBatch b;
    b.AddSequence(seq, SomeTokens(5, vocab, 1), Range(0, 5), 0, nullptr);
    b.logit_rows = {4};
    std::vector<float> logits(static_cast<size_t>(runner.vocab().count));
    return runner.Forward(b, kv, logits);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<RankResult> ranks = RunGroup(Stories(), g);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(elapsed, 120s);
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_TRUE(ranks[1].status.ok());
  EXPECT_EQ(ranks[0].status.code(), StatusCode::kDeadlineExceeded) << ranks[0].status.ToString();
  for (size_t i : {2, 3}) {
    const StatusCode code = ranks[i].status.code();
    EXPECT_TRUE(code == StatusCode::kDeadlineExceeded || code == StatusCode::kAborted)
        << "rank " << i << ": " << ranks[i].status.ToString();
  }
}

// What a runner gave for each step of GraphWorkload: the logits columns it wrote and its argmax
// shares (last stage), and its graph counters at the end.
struct WorkloadRun {
  Status status;
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<ArgmaxShare>> argmax;
  cuda::CudaGraphStats stats;
  ShardRange vocab;
  bool last_stage = false;
  int32_t reformed = 0;  // times it took a new group
};

// A workload whose pass shapes repeat, so that graphs are captured and replayed: two prompts
// (not batch-invariant: eager), then `steps` batch-invariant passes: both sequences decode,
// every third step a 4-node token tree of the first beside a decode of the second, and odd
// steps want one logits row and one argmax row. At step `abort_at`, once every rank is there
// (`ready`), the rank where `aborts` is true fails its group instead of running the pass (a
// worker whose pass failed); the others' passes of that step fail or (stage 0, whose sends do
// not wait) may have finished; then each takes the group `next()` gives it (the manager
// re-forming the group) and runs the step again.
void GraphWorkload(CudaModelRunner& r, int32_t vocab, int32_t steps, WorkloadRun& out,
                   int32_t abort_at = -1, bool aborts = false,
                   const std::function<std::shared_ptr<cuda::DeviceCollective>()>& next = {},
                   cuda::DeviceCollective* group = nullptr, std::latch* ready = nullptr) {
  KvCacheManager kv(kBlocks, 16);
  out.vocab = r.vocab();
  out.last_stage = r.last_stage();
  const int32_t cols = static_cast<int32_t>(r.vocab().count);
  auto pass = [&](const ForwardBatch& b, bool keep) -> Status {
    std::vector<std::span<const int32_t>> tables;
    for (const BatchSequence& s : b.seqs) tables.push_back(kv.BlockTable(s.seq));
    std::vector<float> logits(b.logit_rows.size() * static_cast<size_t>(cols));
    std::vector<ArgmaxShare> argmax(b.argmax_rows.size());
    SI_RETURN_IF_ERROR(r.ForwardWithTables(b, tables, logits, argmax));
    if (keep) {
      out.logits.push_back(std::move(logits));
      out.argmax.push_back(std::move(argmax));
    }
    return Status::Ok();
  };
  const SeqId a = kv.AddSequence(), b = kv.AddSequence();
  std::vector<int32_t> len = {13, 30};
  uint32_t seed = 50;
  for (SeqId s : {a, b}) {
    const int32_t n = len[static_cast<size_t>(s == a ? 0 : 1)];
    out.status = kv.Reserve(s, n);
    ForwardBatch pb;
    pb.AddSequence(s, SomeTokens(n, vocab, seed++), Range(0, n), 0, nullptr);
    pb.batch_invariant = false;
    if (out.status.ok()) out.status = pass(pb, false);
    if (!out.status.ok()) return;
  }
  const TreeMask mask = TreeMask::FromParents(std::vector<int32_t>{-1, 0, 0, 1});
  for (int32_t t = 0; t < steps; ++t) {
    const bool tree = t % 3 == 2;
    ForwardBatch db;
    for (size_t i = 0; i < 2; ++i) {
      const SeqId s = i == 0 ? a : b;
      const int32_t n = tree && i == 0 ? 4 : 1;
      out.status = kv.Reserve(s, len[i] + n);
      if (!out.status.ok()) return;
      const std::vector<int32_t> pos =
          n == 4 ? std::vector<int32_t>{len[i], len[i] + 1, len[i] + 1, len[i] + 2}
                 : std::vector<int32_t>{len[i]};
      db.AddSequence(s, SomeTokens(n, vocab, seed++), pos, len[i], n == 4 ? &mask : nullptr);
    }
    if (t % 2 == 1) {
      db.logit_rows = {0};
      for (int32_t row = 1; row < db.size(); ++row) db.argmax_rows.push_back(row);
    } else {
      db.logit_rows = Range(0, db.size());
    }
    if (t == abort_at) {
      ready->arrive_and_wait();
      if (aborts) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the peers are in the pass
        group->Abort(InternalError("injected failure"));
      } else {
        const Status failed = pass(db, false);
        if (!failed.ok() && failed.code() != StatusCode::kAborted) {
          out.status = InternalError("a peer's failure gave " + failed.ToString());
          return;
        }
      }
      ++out.reformed;
      out.status = r.SetCollective(next());
      if (!out.status.ok()) return;
    }
    out.status = pass(db, true);
    if (!out.status.ok()) return;
    if (tree) kv.Truncate(a, len[0] + 1);  // keep the root: it was this step's token
    ++len[0];
    ++len[1];
  }
  out.stats = r.graph_stats();
}

// TP x PP shares replay CUDA graphs that hold their collectives: over 20 decode and tree steps
// (four shapes, captured the second time each comes) a 2 x 2 group's logits columns are the
// whole-model GPU runner's bit for bit and its argmax shares combine to the same tokens; every
// rank captured and replayed the same passes (a group must agree on that). A rank fails its
// group during a replayed step: the peers' passes end (no hang), the group is re-formed, the
// step runs again, graphs are captured anew for the new group, and the results are still the
// whole model's.
TEST(CudaShardRunner, Tp2Pp2SharesReplayGraphsThatHoldTheirCollectives) {
  if (!EnoughDevices(4)) GTEST_SKIP() << "needs 4 GPUs, found " << cuda::DeviceCount();
  auto model = RandomGqa();
  ASSERT_TRUE(model);
  const int32_t vocab = model->config().vocab_size;
  // Step 6 is the third decode step with logits rows: replayed from a graph (captured at step 4).
  const int32_t steps = 20, abort_at = 6;

  // No cuBLAS, for the prompts either: it picks its algorithm by the matrix's shape, so a
  // share's prompt KV can differ from the whole model's in the last bit, and every later row of
  // that sequence with it (the emulator's OpenBLAS did so on some CPUs, a GPU's cuBLAS may too).
  CudaRunnerOptions whole_o;
  whole_o.num_kv_blocks = kBlocks;
  whole_o.cublas_min_tokens = 0;
  auto whole = CudaModelRunner::Create(model, whole_o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  WorkloadRun want;
  GraphWorkload(**whole, vocab, steps, want);
  ASSERT_TRUE(want.status.ok()) << want.status.ToString();

  auto first = cuda::ThreadCollectiveGroup::Create(2, 2, 60s);
  auto second = cuda::ThreadCollectiveGroup::Create(2, 2, 60s);
  ASSERT_TRUE(first.ok() && second.ok());
  std::vector<WorkloadRun> ranks(4);
  std::latch ready(4);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t st = 0; st < 2; ++st)
    for (int32_t tp = 0; tp < 2; ++tp)
      threads.emplace_back([&, st, tp] {
        WorkloadRun& res = ranks[static_cast<size_t>(st * 2 + tp)];
        std::shared_ptr<cuda::DeviceCollective> coll = std::move((*first)->Rank(st, tp)).value();
        CudaRunnerOptions o;
        o.device = st * 2 + tp;
        o.num_kv_blocks = kBlocks;
        o.cublas_min_tokens = 0;
        o.layout = coll->layout();
        o.collective = coll;
        auto runner = CudaModelRunner::Create(model, o);
        if (!runner.ok()) {
          res.status = runner.status();
          (*first)->Abort(res.status);
          return;
        }
        GraphWorkload(
            **runner, vocab, steps, res, abort_at, st == 1 && tp == 1,
            [&] { return std::move((*second)->Rank(st, tp)).value(); }, coll.get(), &ready);
      });
  for (std::thread& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 300s);

  for (size_t i = 0; i < ranks.size(); ++i) {
    ASSERT_TRUE(ranks[i].status.ok()) << "rank " << i << ": " << ranks[i].status.ToString();
    EXPECT_EQ(ranks[i].reformed, 1) << "rank " << i;
    const cuda::CudaGraphStats& g = ranks[i].stats;
    const cuda::CudaGraphStats& g0 = ranks[0].stats;
    EXPECT_FALSE(g.disabled) << "rank " << i;
    EXPECT_GE(g.captured, 4) << "rank " << i;  // two shapes, in each group
    EXPECT_GE(g.replayed, 4) << "rank " << i;
    EXPECT_EQ(g.captured, g0.captured) << "rank " << i;
    // Rank 3 failed the group instead of replaying step 6; the others replayed it.
    EXPECT_EQ(g.replayed + (i == 3 ? 1 : 0), g0.replayed) << "rank " << i;
    EXPECT_EQ(g.eager, g0.eager) << "rank " << i;
  }
  for (int32_t t = 0; t < steps; ++t) {
    std::vector<float> full;
    std::vector<ArgmaxShare> best(want.argmax[static_cast<size_t>(t)].size());
    const size_t rows = want.logits[static_cast<size_t>(t)].size() / static_cast<size_t>(vocab);
    full.assign(rows * static_cast<size_t>(vocab), NAN);
    for (const WorkloadRun& r : ranks) {
      if (!r.last_stage) continue;
      const std::vector<float>& mine = r.logits[static_cast<size_t>(t)];
      for (size_t row = 0; row < rows; ++row)
        std::memcpy(&full[row * vocab + r.vocab.begin], &mine[row * r.vocab.count],
                    static_cast<size_t>(r.vocab.count) * sizeof(float));
      for (size_t i = 0; i < best.size(); ++i) best[i].Combine(r.argmax[static_cast<size_t>(t)][i]);
    }
    EXPECT_ALL_CLOSE(full, want.logits[static_cast<size_t>(t)], 0.0, 0.0,
                     "graph-replayed TP 2 x PP 2 vs one GPU, step " + std::to_string(t));
    for (size_t i = 0; i < best.size(); ++i)
      EXPECT_EQ(best[i].id, want.argmax[static_cast<size_t>(t)][i].id) << "step " << t;
  }
}

TEST(CudaShardRunner, RefusesLayoutsTheModelCannotTake) {
  ASSERT_TRUE(Stories());
  auto group = cuda::ThreadCollectiveGroup::Create(1, 3, 1s);
  ASSERT_TRUE(group.ok());
  auto coll = (*group)->Rank(0, 0);
  ASSERT_TRUE(coll.ok());
  CudaRunnerOptions o;
  o.num_kv_blocks = kBlocks;
  o.layout = (*coll)->layout();
  o.collective = std::move(coll).value();
  // stories260K has 4 KV heads: 3 TP ranks cannot share them.
  auto r = CudaModelRunner::Create(Stories(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  // A share whose collective has another layout.
  CudaRunnerOptions lonely;
  lonely.num_kv_blocks = kBlocks;
  lonely.layout.tp_size = 2;
  auto g2 = cuda::ThreadCollectiveGroup::Create(2, 1, 1s);
  ASSERT_TRUE(g2.ok());
  std::shared_ptr<cuda::DeviceCollective> other_layout = std::move((*g2)->Rank(1, 0)).value();
  CudaRunnerOptions other = lonely;
  other.collective = other_layout;
  EXPECT_EQ(CudaModelRunner::Create(Stories(), other).status().code(),
            StatusCode::kInvalidArgument);
  // A share without a group (yet) is created, but its passes fail until it has one.
  auto share = CudaModelRunner::Create(Stories(), lonely);
  ASSERT_TRUE(share.ok()) << share.status().ToString();
  KvCacheManager kv(kBlocks, 16);
  const SeqId seq = kv.AddSequence();
  ASSERT_TRUE(kv.Reserve(seq, 3).ok());
  ForwardBatch b;
  b.AddSequence(seq, std::vector<int32_t>{1, 2, 3}, Range(0, 3), 0, nullptr);
  b.logit_rows = {2};
  std::vector<float> logits(static_cast<size_t>((*share)->vocab().count));
  EXPECT_EQ((*share)->Forward(b, kv, logits).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*share)->SetCollective(other_layout).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specinfer
