// Batched drafting (Speculator::ProposeBatch): a model draft proposing for several sequences in
// one pass per tree level gives every sequence the tree it would draft alone, node for node and
// trial for trial, with bit-identical draft distributions (so bit-identical draft logits: the CPU
// kernels are batch-invariant), over several steps of sequences of different lengths, greedy
// and sampled.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/loader.h"
#include "spec/speculator.h"
#include "test_util.h"

namespace specinfer {
namespace {

// Both trees equal in structure, proposals and (bit for bit) the distributions drawn from.
void ExpectSameTree(const TokenTree& a, const TokenTree& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (int32_t v = 0; v < a.size(); ++v) {
    const TreeNode& x = a.node(v);
    const TreeNode& y = b.node(v);
    ASSERT_EQ(x.token, y.token) << what << " node " << v;
    ASSERT_EQ(x.parent, y.parent) << what << " node " << v;
    ASSERT_EQ(x.proposers, y.proposers) << what << " node " << v;
    ASSERT_EQ(x.trials.size(), y.trials.size()) << what << " node " << v;
    for (size_t t = 0; t < x.trials.size(); ++t) {
      ASSERT_EQ(x.trials[t].child, y.trials[t].child) << what << " node " << v;
      ASSERT_EQ(x.trials[t].speculator, y.trials[t].speculator) << what << " node " << v;
      ASSERT_EQ(x.trials[t].dist, y.trials[t].dist) << what << " node " << v;
      if (x.trials[t].dist < 0) continue;
      const auto p = a.distribution(x.trials[t].dist);
      const auto q = b.distribution(y.trials[t].dist);
      ASSERT_EQ(p.size(), q.size());
      ASSERT_EQ(std::memcmp(p.data(), q.data(), p.size() * sizeof(float)), 0)
          << what << ": draft distribution at node " << v << " differs";
    }
  }
}

std::shared_ptr<const Model> Load(const std::string& path) {
  auto m = LoadModel(path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::shared_ptr<const Model>(std::move(*m)) : nullptr;
}

std::unique_ptr<Speculator> Draft(std::shared_ptr<const Model> model, const std::string& spec,
                                  int32_t sequences) {
  SpeculatorOptions so;
  so.max_sequences = sequences;
  so.num_threads = 2;  // the rows of one pass split across threads
  auto s = CreateSpeculator(spec, std::move(model), so);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<DraftSession> Start(Speculator& s) {
  auto r = s.StartSession();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Sequences of different lengths (a prompt of 20+ tokens catches up alone, the short ones share
// a pass) drafted for several steps, batched by one speculator and alone by another; each step
// accepts part of the tree's first path and adds a token of its own, as verification would.
void CheckBatchedEqualsAlone(const std::string& spec, const SamplingParams& sampling,
                             const std::string& model_path = testing::Stories260KModel()) {
  auto model = Load(model_path);
  ASSERT_TRUE(model);
  const int32_t vocab = model->config().vocab_size;
  const std::vector<int32_t> lengths = {3, 9, 24, 1, 40};
  const std::vector<int32_t> max_depths = {4, 2, 4, 3, 0};  // the last has nothing to guess
  const size_t n = lengths.size();
  auto batched = Draft(model, spec, static_cast<int32_t>(n));
  auto alone = Draft(model, spec, static_cast<int32_t>(n));
  ASSERT_TRUE(batched && alone);
  EXPECT_TRUE(batched->batches_proposals());
  std::vector<std::unique_ptr<DraftSession>> bs, as;
  std::vector<std::vector<int32_t>> tokens(n);
  std::vector<Rng> brng, arng;
  uint64_t state = 7;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>(1 + (state >> 33) % static_cast<uint64_t>(vocab - 1));
  };
  for (size_t i = 0; i < n; ++i) {
    bs.push_back(Start(*batched));
    as.push_back(Start(*alone));
    for (int32_t t = 0; t < lengths[i]; ++t) tokens[i].push_back(next());
    brng.emplace_back(100 + i);
    arng.emplace_back(100 + i);
  }
  const TreeShape shape = *TreeShape::Parse("3,2,2,1");
  for (int step = 0; step < 5; ++step) {
    std::vector<DraftContext> bctx(n), actx(n);
    std::vector<DraftSession*> sessions;
    for (size_t i = 0; i < n; ++i) {
      for (auto* c : {&bctx[i], &actx[i]}) {
        c->tokens = tokens[i];
        c->shape = &shape;
        c->max_depth = max_depths[i];
        c->sampling = &sampling;
        c->speculator_index = 1;
      }
      bctx[i].rng = &brng[i];
      actx[i].rng = &arng[i];
      sessions.push_back(bs[i].get());
    }
    std::vector<StatusOr<TokenTree>> trees = batched->ProposeBatch(sessions, bctx);
    ASSERT_EQ(trees.size(), n);
    for (size_t i = 0; i < n; ++i) {
      StatusOr<TokenTree> lone = as[i]->Propose(actx[i]);
      ASSERT_TRUE(lone.ok()) << lone.status().ToString();
      ASSERT_TRUE(trees[i].ok()) << trees[i].status().ToString();
      const std::string what = "step " + std::to_string(step) + " sequence " + std::to_string(i);
      ExpectSameTree(*trees[i], *lone, what);
      if (max_depths[i] > 0) {
        EXPECT_GT(trees[i]->size(), 1) << what;
      }
      // Accept the first path's first `step % 3` tokens, then a token of "the LLM".
      std::vector<int32_t> path;
      for (int32_t v = 0; !trees[i]->node(v).children.empty();) {
        v = trees[i]->node(v).children[0];
        path.push_back(v);
      }
      for (size_t k = 0; k < path.size() && k < static_cast<size_t>(step % 3); ++k)
        tokens[i].push_back(trees[i]->node(path[k]).token);
      tokens[i].push_back(next());
    }
  }
}

TEST(BatchedDraft, GreedyTreesOfLayersDraftEqualTheLoneOnes) {
  SamplingParams greedy;
  greedy.temperature = 0;
  CheckBatchedEqualsAlone("layers:2", greedy);
}

TEST(BatchedDraft, SampledTreesOfModelDraftEqualTheLoneOnes) {
  SamplingParams s;
  s.temperature = 0.8f;
  s.top_k = 20;
  CheckBatchedEqualsAlone("model:" + testing::Stories260KModel(), s);
}

// The default model's quantised weights go through the CPU tile kernels: batch-invariant too.
TEST(BatchedDraft, TreesOfTheDefaultModelsLayersDraftEqualTheLoneOnes) {
  if (testing::DefaultModel().empty()) GTEST_SKIP() << "the default model is absent";
  SamplingParams greedy;
  greedy.temperature = 0;
  CheckBatchedEqualsAlone("layers:2", greedy, testing::DefaultModel());
  SamplingParams sampled;
  sampled.temperature = 1;
  CheckBatchedEqualsAlone("layers:2", sampled, testing::DefaultModel());
}

TEST(BatchedDraft, ASessionTwiceIsServedInOrderAndForeignSessionsAreRefused) {
  auto model = Load(testing::Stories260KModel());
  ASSERT_TRUE(model);
  auto batched = Draft(model, "layers:2", 2);
  auto alone = Draft(model, "layers:2", 2);
  ASSERT_TRUE(batched && alone);
  auto b = Start(*batched);
  auto a = Start(*alone);
  const TreeShape shape = *TreeShape::Parse("2,2");
  SamplingParams greedy;
  greedy.temperature = 0;
  Rng rng(1);
  const std::vector<int32_t> first = {5, 6, 7, 8}, second = {5, 6, 7, 9, 10};
  DraftContext c1{first, &shape, 2, &greedy, &rng, 0};
  DraftContext c2{second, &shape, 2, &greedy, &rng, 0};
  DraftSession* twice[] = {b.get(), b.get()};
  const DraftContext ctxs[] = {c1, c2};
  auto trees = batched->ProposeBatch(twice, ctxs);
  ASSERT_EQ(trees.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    auto lone = a->Propose(ctxs[i]);
    ASSERT_TRUE(trees[i].ok() && lone.ok());
    ExpectSameTree(*trees[i], *lone, "item " + std::to_string(i));
  }
  DraftSession* foreign[] = {b.get(), a.get()};
  trees = batched->ProposeBatch(foreign, ctxs);
  ASSERT_EQ(trees.size(), 2u);
  EXPECT_TRUE(trees[0].ok());
  EXPECT_EQ(trees[1].status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specinfer
