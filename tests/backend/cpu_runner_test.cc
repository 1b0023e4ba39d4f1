// The CPU runner against itself: tree-masked passes, batches and chunked prefill must give the
// logits of plain incremental decoding. These are the properties speculative verification and
// continuous batching rely on.
#include "backend/cpu/cpu_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "model/loader.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace specinfer {
namespace {

class CpuRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KModel());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::shared_ptr<Model>(std::move(m).value());
    CpuRunnerOptions o;
    o.num_threads = 2;
    o.num_kv_blocks = 64;
    o.kv_block_size = 16;
    auto r = CpuModelRunner::Create(model_, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    runner_ = std::move(r).value();
    kv_ = std::make_unique<KvCacheManager>(64, 16);
  }

  int32_t vocab() const { return model_->config().vocab_size; }

  // A pass of a new sequence's 4-token prompt with every row's logits wanted (KV reserved).
  ForwardBatch FourTokenPrompt() {
    SeqId s = kv_->AddSequence();
    EXPECT_TRUE(kv_->Reserve(s, 4).ok());
    ForwardBatch b;
    b.AddSequence(s, std::vector<int32_t>{1, 403, 407, 261}, std::vector<int32_t>{0, 1, 2, 3}, 0,
                  nullptr);
    b.logit_rows = {0, 1, 2, 3};
    return b;
  }

  // Prefills `tokens` into a new sequence in one pass; returns the sequence.
  SeqId Prefill(const std::vector<int32_t>& tokens) {
    SeqId s = kv_->AddSequence();
    EXPECT_TRUE(kv_->Reserve(s, static_cast<int32_t>(tokens.size())).ok());
    ForwardBatch b;
    std::vector<int32_t> pos(tokens.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    b.AddSequence(s, tokens, pos, 0, nullptr);
    std::vector<float> unused;
    EXPECT_TRUE(runner_->Forward(b, *kv_, unused).ok());
    return s;
  }

  // Feeds `tokens` one at a time after the sequence's current length; returns the logits after
  // the last one.
  std::vector<float> DecodeEach(SeqId s, const std::vector<int32_t>& tokens) {
    std::vector<float> logits(vocab());
    for (int32_t t : tokens) {
      int32_t pos = kv_->Length(s);
      EXPECT_TRUE(kv_->Reserve(s, pos + 1).ok());
      ForwardBatch b;
      b.AddSequence(s, std::span(&t, 1), std::span(&pos, 1), pos, nullptr);
      b.logit_rows = {0};
      EXPECT_TRUE(runner_->Forward(b, *kv_, logits).ok());
    }
    return logits;
  }

  std::shared_ptr<Model> model_;
  std::unique_ptr<CpuModelRunner> runner_;
  std::unique_ptr<KvCacheManager> kv_;
};

// A token tree in depth-first order: every node's logits from one masked pass equal those of
// decoding its root-to-node path incrementally, bit for bit (the kernels are batch-invariant).
TEST_F(CpuRunnerTest, TreePassEqualsIncrementalDecodingOfEachPath) {
  const std::vector<int32_t> prefix = {1, 403, 407, 261, 378};
  // Node 0 has children 1, 4, 6; node 1 has children 2, 3; node 4 has child 5.
  const std::vector<int32_t> parents = {-1, 0, 1, 1, 0, 4, 0};
  const std::vector<int32_t> tokens = {300, 301, 302, 303, 304, 305, 306};
  const int32_t n = static_cast<int32_t>(tokens.size());

  SeqId tree_seq = Prefill(prefix);
  const int32_t P = static_cast<int32_t>(prefix.size());
  ASSERT_TRUE(kv_->Reserve(tree_seq, P + n).ok());
  TreeMask mask = TreeMask::FromParents(parents);
  std::vector<int32_t> pos(n);
  for (int32_t i = 0; i < n; ++i) {
    int32_t depth = 0;
    for (int32_t a = parents[i]; a >= 0; a = parents[a]) ++depth;
    pos[i] = P + depth;
  }
  ForwardBatch b;
  b.AddSequence(tree_seq, tokens, pos, P, &mask);
  for (int32_t i = 0; i < n; ++i) b.logit_rows.push_back(i);
  std::vector<float> tree_logits(static_cast<size_t>(n) * vocab());
  ASSERT_TRUE(runner_->Forward(b, *kv_, tree_logits).ok());

  for (int32_t i = 0; i < n; ++i) {
    std::vector<int32_t> path;
    for (int32_t a = i; a >= 0; a = parents[a]) path.insert(path.begin(), tokens[a]);
    SeqId ref = Prefill(prefix);
    std::vector<float> want = DecodeEach(ref, path);
    kv_->RemoveSequence(ref);
    for (int32_t v = 0; v < vocab(); ++v)
      ASSERT_EQ(tree_logits[static_cast<size_t>(i) * vocab() + v], want[v])
          << "node " << i << " vocab " << v;
  }
}

// A chain given as an explicit tree mask equals causal prefill (mask == nullptr).
TEST_F(CpuRunnerTest, ChainMaskEqualsCausal) {
  const std::vector<int32_t> toks = {1, 403, 407, 261, 378, 290};
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5};
  TreeMask chain = TreeMask::FromParents(std::vector<int32_t>{-1, 0, 1, 2, 3, 4});
  std::vector<float> a(vocab()), b(vocab());
  for (int with_mask = 0; with_mask < 2; ++with_mask) {
    SeqId s = kv_->AddSequence();
    ASSERT_TRUE(kv_->Reserve(s, 6).ok());
    ForwardBatch batch;
    batch.AddSequence(s, toks, pos, 0, with_mask ? &chain : nullptr);
    batch.logit_rows = {5};
    ASSERT_TRUE(runner_->Forward(batch, *kv_, with_mask ? b : a).ok());
  }
  EXPECT_EQ(a, b);
}

// Two sequences in one batch give the same logits as each run alone.
TEST_F(CpuRunnerTest, BatchedSequencesEqualSeparateRuns) {
  const std::vector<int32_t> p1 = {1, 403, 407}, p2 = {1, 290, 291, 292, 293};
  std::vector<float> alone1(vocab()), alone2(vocab());
  auto run_alone = [&](const std::vector<int32_t>& p, std::vector<float>& out) {
    SeqId s = kv_->AddSequence();
    ASSERT_TRUE(kv_->Reserve(s, static_cast<int32_t>(p.size())).ok());
    ForwardBatch b;
    std::vector<int32_t> pos(p.size());
    for (size_t i = 0; i < p.size(); ++i) pos[i] = static_cast<int32_t>(i);
    b.AddSequence(s, p, pos, 0, nullptr);
    b.logit_rows = {static_cast<int32_t>(p.size()) - 1};
    ASSERT_TRUE(runner_->Forward(b, *kv_, out).ok());
  };
  run_alone(p1, alone1);
  run_alone(p2, alone2);

  SeqId s1 = kv_->AddSequence(), s2 = kv_->AddSequence();
  ASSERT_TRUE(kv_->Reserve(s1, 3).ok());
  ASSERT_TRUE(kv_->Reserve(s2, 5).ok());
  ForwardBatch b;
  std::vector<int32_t> pos1 = {0, 1, 2}, pos2 = {0, 1, 2, 3, 4};
  b.AddSequence(s1, p1, pos1, 0, nullptr);
  b.AddSequence(s2, p2, pos2, 0, nullptr);
  b.logit_rows = {2, 7};
  std::vector<float> both(2 * vocab());
  ASSERT_TRUE(runner_->Forward(b, *kv_, both).ok());
  EXPECT_EQ(std::vector<float>(both.begin(), both.begin() + vocab()), alone1);
  EXPECT_EQ(std::vector<float>(both.begin() + vocab(), both.end()), alone2);
}

// Moving accepted tree entries to consecutive positions leaves a cache equivalent to having
// decoded the accepted path directly.
TEST_F(CpuRunnerTest, MoveKvCompactsAnAcceptedPath) {
  const std::vector<int32_t> prefix = {1, 403, 407};
  const std::vector<int32_t> parents = {-1, 0, 0, 2};  // accepted path: nodes 0, 2, 3
  const std::vector<int32_t> tokens = {300, 301, 302, 303};
  SeqId s = Prefill(prefix);
  ASSERT_TRUE(kv_->Reserve(s, 3 + 4).ok());
  TreeMask mask = TreeMask::FromParents(parents);
  std::vector<int32_t> pos = {3, 4, 4, 5};
  ForwardBatch b;
  b.AddSequence(s, tokens, pos, 3, &mask);
  std::vector<float> unused;
  ASSERT_TRUE(runner_->Forward(b, *kv_, unused).ok());
  // Keep nodes 0, 2, 3 at positions 3, 4, 5.
  std::vector<int32_t> src = {3 + 2, 3 + 3}, dst = {4, 5};
  ASSERT_TRUE(runner_->MoveKv(*kv_, s, src, dst).ok());
  kv_->Truncate(s, 6);
  std::vector<float> after = DecodeEach(s, {304});

  SeqId ref = Prefill(prefix);
  std::vector<float> want = DecodeEach(ref, {300, 302, 303, 304});
  EXPECT_EQ(after, want);
}

// A prompt batch that may use BLAS gives the same logits as the batch-invariant kernels, within
// float rounding.
TEST_F(CpuRunnerTest, BlasPrefillMatchesInvariantKernels) {
  std::vector<int32_t> toks(40), pos(40);
  for (int32_t i = 0; i < 40; ++i) toks[i] = 1 + (i * 37) % 500, pos[i] = i;
  std::vector<float> a(vocab()), b(vocab());
  for (bool invariant : {true, false}) {
    SeqId s = kv_->AddSequence();
    ASSERT_TRUE(kv_->Reserve(s, 40).ok());
    ForwardBatch batch;
    batch.AddSequence(s, toks, pos, 0, nullptr);
    batch.logit_rows = {39};
    batch.batch_invariant = invariant;
    ASSERT_TRUE(runner_->Forward(batch, *kv_, invariant ? a : b).ok());
  }
  for (int32_t v = 0; v < vocab(); ++v) EXPECT_NEAR(a[v], b[v], 1e-4f) << v;
}

// Malformed batches are refused with a Status, not trusted.
TEST_F(CpuRunnerTest, BadBatchesAreRejected) {
  SeqId s = kv_->AddSequence();
  ForwardBatch b;
  std::vector<int32_t> t = {1}, p = {0};
  b.AddSequence(s, t, p, 0, nullptr);
  std::vector<float> logits(vocab());
  // Not reserved.
  EXPECT_EQ(runner_->Forward(b, *kv_, logits).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(kv_->Reserve(s, 1).ok());
  b.tokens[0] = vocab();  // out of vocabulary
  EXPECT_EQ(runner_->Forward(b, *kv_, logits).code(), StatusCode::kInvalidArgument);
  b.tokens[0] = 1;
  b.logit_rows = {3};
  EXPECT_EQ(runner_->Forward(b, *kv_, logits).code(), StatusCode::kInvalidArgument);
}

// Greedy rows that read no logits ask for their argmax instead (ForwardArgmax): the ids are
// Argmax of the same rows' logits, logits rows beside them are unchanged, and an argmax row out
// of range or a too small id buffer is refused.
TEST_F(CpuRunnerTest, ArgmaxRowsAreTheArgmaxOfTheirLogits) {
  testing::ExpectArgmaxRowsMatchLogits(*runner_, *kv_, {1, 403, 407, 261, 378, 290, 301, 418, 5});
  SeqId s = kv_->AddSequence();
  ASSERT_TRUE(kv_->Reserve(s, 1).ok());
  ForwardBatch b;
  b.AddSequence(s, std::vector<int32_t>{1}, std::vector<int32_t>{0}, 0, nullptr);
  std::vector<float> logits;
  std::vector<int32_t> ids(2);
  b.argmax_rows = {1};
  EXPECT_EQ(runner_->ForwardArgmax(b, *kv_, logits, ids).code(), StatusCode::kInvalidArgument);
  b.argmax_rows = {0, 0, 0};
  EXPECT_EQ(runner_->ForwardArgmax(b, *kv_, logits, ids).code(), StatusCode::kInvalidArgument);
  b.argmax_rows = {0, 0};
  EXPECT_TRUE(runner_->ForwardArgmax(b, *kv_, logits, ids).ok());
  EXPECT_EQ(ids[0], ids[1]);
}

// A sampled sequence that reads no logits has its token drawn by the runner (ForwardBatch::draws):
// the default (host) ForwardArgmax takes SampleFromProbs of the row's ComputeProbs at the draw's
// uniform, greedy draws stay argmaxes, and malformed draws are refused.
TEST_F(CpuRunnerTest, DrawsAreSampledFromTheirRows) {
  ForwardBatch b = FourTokenPrompt();
  const std::vector<TokenDraw> draws = {
      {1.0f, 0, 1.0f, 0.3}, {0.0f, 0, 1.0f, 0.5}, {0.7f, 20, 0.9f, 0.99}, {1.3f, 0, 0.8f, 0.0}};
  for (int32_t r = 0; r < 4; ++r) b.AddTokenRow(r, draws[static_cast<size_t>(r)]);
  ASSERT_EQ(b.draws.size(), 4u);
  EXPECT_TRUE(b.has_draws());
  ForwardBatch greedy_first;  // an argmax row before the first draw is filled in as greedy
  greedy_first.AddTokenRow(0);
  EXPECT_TRUE(greedy_first.draws.empty());
  greedy_first.AddTokenRow(1, draws[0]);
  ASSERT_EQ(greedy_first.draws.size(), 2u);
  EXPECT_TRUE(greedy_first.draws[0].greedy());
  EXPECT_FALSE(greedy_first.draws[1].greedy());
  std::vector<float> logits(4 * static_cast<size_t>(vocab()));
  std::vector<int32_t> ids(4);
  ASSERT_TRUE(runner_->ForwardArgmax(b, *kv_, logits, ids).ok());
  for (int32_t r = 0; r < 4; ++r) {
    const TokenDraw& d = draws[static_cast<size_t>(r)];
    const std::span<const float> row(logits.data() + static_cast<size_t>(r) * vocab(),
                                     static_cast<size_t>(vocab()));
    if (d.greedy()) {
      EXPECT_EQ(ids[r], Argmax(row));
      continue;
    }
    std::vector<float> probs;
    ComputeProbs(row, d.params(), probs);
    EXPECT_EQ(ids[r], SampleFromProbs(probs, d.u)) << "row " << r;
  }
  // The uniform decides: across u, row 0 at temperature 5 (nearly flat) gives many tokens.
  std::set<int32_t> seen;
  b.draws[0].temperature = 5.0f;
  for (double u = 0.0; u < 1.0; u += 0.05) {
    b.draws[0].u = u;
    ASSERT_TRUE(runner_->ForwardArgmax(b, *kv_, logits, ids).ok());
    seen.insert(ids[0]);
  }
  EXPECT_GE(seen.size(), 5u);
  // Malformed draws.
  for (double bad : {1.0, -0.1, std::nan("")}) {
    b.draws[0].u = bad;
    EXPECT_EQ(runner_->ForwardArgmax(b, *kv_, logits, ids).code(), StatusCode::kInvalidArgument)
        << bad;
  }
  b.draws[0].u = 0.3;
  b.draws[0].top_p = 0.0f;
  EXPECT_EQ(runner_->ForwardArgmax(b, *kv_, logits, ids).code(), StatusCode::kInvalidArgument);
  b.draws[0].top_p = 1.0f;
  b.draws.pop_back();
  EXPECT_EQ(runner_->ForwardArgmax(b, *kv_, logits, ids).code(), StatusCode::kInvalidArgument);
}

// Distribution rows (ForwardBatch::dist_rows), filled by the default (host) ForwardArgmax: each
// the ComputeProbs of its row's logits under its settings, beside argmax rows and draws; refused
// by Forward, without a DistRows to fill, and with malformed settings.
TEST_F(CpuRunnerTest, DistributionRowsAreTheirRowsSamplingDistributions) {
  ForwardBatch b = FourTokenPrompt();
  b.AddTokenRow(2, {0.9f, 0, 1.0f, 0.4});
  const std::vector<TokenDraw> settings = {
      {1.0f, 0, 1.0f, 0}, {0.7f, 0, 0.9f, 0}, {1.2f, 5, 1.0f, 0}, {0.0f, 0, 1.0f, 0}};
  const std::vector<int32_t> rows = {3, 0, 2, 1};
  for (size_t i = 0; i < rows.size(); ++i) b.AddDistRow(rows[i], settings[i]);
  std::vector<float> logits(4 * static_cast<size_t>(vocab()));
  std::vector<int32_t> ids(1);
  DistRows dists;
  ASSERT_TRUE(runner_->ForwardArgmax(b, *kv_, logits, ids, &dists).ok());
  ASSERT_EQ(dists.size(), 4);
  ASSERT_EQ(dists.vocab(), vocab());
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::span<const float> row(logits.data() + static_cast<size_t>(rows[i]) * vocab(),
                                     static_cast<size_t>(vocab()));
    std::vector<float> want, got;
    ComputeProbs(row, settings[i].params(), want);
    dists.Expand(static_cast<int32_t>(i), got);
    EXPECT_EQ(got, want) << "distribution row " << i;
  }
  EXPECT_FALSE(dists.ids(2).empty()) << "top-k 5 of 512 is stored sparse";
  std::vector<float> probs;
  ComputeProbs(std::span<const float>(logits.data() + 2 * static_cast<size_t>(vocab()),
                                      static_cast<size_t>(vocab())),
               b.draws[0].params(), probs);
  EXPECT_EQ(ids[0], SampleFromProbs(probs, 0.4)) << "the draw beside them";
  // Refusals.
  EXPECT_EQ(runner_->Forward(b, *kv_, logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runner_->ForwardArgmax(b, *kv_, logits, ids).code(), StatusCode::kInvalidArgument);
  b.dist_settings[1].top_p = 1.5f;
  EXPECT_EQ(runner_->ForwardArgmax(b, *kv_, logits, ids, &dists).code(),
            StatusCode::kInvalidArgument);
  b.dist_settings.pop_back();
  EXPECT_EQ(runner_->ForwardArgmax(b, *kv_, logits, ids, &dists).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(runner_->returns_distributions()) << "on the host logits rows cost less";
}

// Shares of a row over disjoint columns combine to the whole row's Argmax, in any order: the
// largest value, the lowest id among equal maxima; an empty share (id -1) changes nothing.
TEST(ArgmaxShare, CombinesToTheLowestIdAmongEqualMaxima) {
  const std::vector<ArgmaxShare> shares = {{2.0f, 40}, {5.0f, 71}, {5.0f, 12}, {-1.0f, 3}, {}};
  std::vector<size_t> order = {0, 1, 2, 3, 4};
  do {
    ArgmaxShare all;
    for (size_t i : order) all.Combine(shares[i]);
    EXPECT_EQ(all.id, 12);
    EXPECT_EQ(all.value, 5.0f);
  } while (std::next_permutation(order.begin(), order.end()));
  ArgmaxShare none;
  none.Combine(ArgmaxShare{});
  EXPECT_EQ(none.id, -1);
}

// A KV manager planning blocks of another size than the runner's storage would address the
// wrong slots: the runner refuses it (CheckForward), as the CUDA and remote runners do.
TEST_F(CpuRunnerTest, RefusesAKvManagerWithAnotherBlockSize) {
  KvCacheManager other(64, 8);
  SeqId s = other.AddSequence();
  ASSERT_TRUE(other.Reserve(s, 1).ok());
  ForwardBatch b;
  std::vector<int32_t> t = {1}, p = {0};
  b.AddSequence(s, t, p, 0, nullptr);
  b.logit_rows = {0};
  std::vector<float> logits(vocab());
  Status st = runner_->Forward(b, other, logits);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block size"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace specinfer
