// Dynamic token trees (spec/dynamic_tree.h): best-first growth by cumulative draft probability
// within the node budget, the depth limit and the rounds; sampled growth records the
// distribution of every draw. (Their exactness under multi-step speculative sampling is tested
// statistically in verifier_test.cc, and end to end in speculative_generation_test.cc.)
#include "spec/dynamic_tree.h"

#include <gtest/gtest.h>

#include <cmath>

namespace specinfer {
namespace {

constexpr int32_t kVocab = 6;

// Logits whose softmax is `probs`.
std::vector<float> LogitsOf(const std::vector<float>& probs) {
  std::vector<float> l;
  for (float p : probs) l.push_back(p > 0 ? std::log(p) : -1e4f);
  return l;
}

// A draft that predicts, after any node, token 1 with 0.6, token 2 with 0.3, the rest 0.1 / 4;
// it counts its passes.
struct ToyDraft {
  int32_t passes = 0;
  int32_t tokens = 0;
  std::vector<float> row = LogitsOf({0.025f, 0.6f, 0.3f, 0.025f, 0.025f, 0.025f});
  DraftRunFn fn() {
    return [this](const TokenTree&, std::span<const int32_t> nodes, std::vector<float>& logits) {
      ++passes;
      tokens += static_cast<int32_t>(nodes.size());
      logits.clear();
      for (size_t i = 0; i < nodes.size(); ++i) logits.insert(logits.end(), row.begin(), row.end());
      return Status::Ok();
    };
  }
};

SamplingParams Greedy() {
  SamplingParams s;
  s.temperature = 0;
  return s;
}

TEST(DynamicTree, GreedyGrowthTakesTheMostProbableNodesFirst) {
  ToyDraft draft;
  DynamicTreeOptions o;
  o.max_nodes = 4;
  o.max_depth = 4;
  o.max_rounds = 4;  // one node per round: exactly best-first
  Rng rng(1);
  auto t = GrowDynamicTree(0, draft.row, o, Greedy(), rng, 0, draft.fn());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  // Cumulative probabilities: 1 (0.6), 1 1 (0.36), 2 (0.3), 1 1 1 (0.216) beat 1 2 (0.18).
  std::vector<std::vector<int32_t>> seqs = t->Sequences();
  std::sort(seqs.begin(), seqs.end());
  EXPECT_EQ(seqs, (std::vector<std::vector<int32_t>>{{1, 1, 1}, {2}}));
  const std::vector<float> probs = t->SortedProbs();
  ASSERT_EQ(probs.size(), 4u);
  EXPECT_NEAR(probs[0], 0.6f, 1e-5);
  EXPECT_NEAR(probs[1], 0.36f, 1e-5);
  EXPECT_NEAR(probs[2], 0.3f, 1e-5);
  EXPECT_NEAR(probs[3], 0.216f, 1e-5);
  // Deterministic proposals; the last round's node is not run.
  for (int32_t v = 0; v < t->size(); ++v)
    for (const DraftTrial& tr : t->node(v).trials) EXPECT_EQ(tr.dist, -1);
  EXPECT_EQ(draft.passes, 3);
}

TEST(DynamicTree, BudgetDepthAndRoundsBoundTheTree) {
  for (int32_t budget : {1, 3, 8, 20}) {
    for (int32_t depth : {1, 2, 5}) {
      ToyDraft draft;
      DynamicTreeOptions o;
      o.max_nodes = budget;
      o.max_depth = depth;
      o.max_children = 3;
      Rng rng(2);
      auto t = GrowDynamicTree(0, draft.row, o, Greedy(), rng, 0, draft.fn());
      ASSERT_TRUE(t.ok());
      SCOPED_TRACE("budget " + std::to_string(budget) + " depth " + std::to_string(depth));
      // As many nodes as the budget allows (3 children per node at most, up to `depth`).
      int64_t room = 0;
      for (int64_t level = 1, d = 0; d < depth; ++d) room += level *= 3;
      EXPECT_EQ(t->size() - 1, std::min<int64_t>(budget, room));
      EXPECT_LE(t->max_depth(), depth);
      for (int32_t v = 0; v < t->size(); ++v) EXPECT_LE(t->node(v).children.size(), 3u);
      EXPECT_LE(draft.passes, depth - 1);  // one pass per round but the last
    }
  }
}

TEST(DynamicTree, SampledGrowthRecordsTheDistributionOfEveryDraw) {
  ToyDraft draft;
  DynamicTreeOptions o;
  o.max_nodes = 10;
  o.max_depth = 3;
  SamplingParams s;
  s.temperature = 1;
  Rng rng(3);
  auto t = GrowDynamicTree(0, draft.row, o, s, rng, 2, draft.fn());
  ASSERT_TRUE(t.ok());
  EXPECT_LE(t->size() - 1, 10);
  EXPECT_GT(t->size(), 1);
  for (int32_t v = 0; v < t->size(); ++v) {
    for (const DraftTrial& tr : t->node(v).trials) {
      ASSERT_GE(tr.dist, 0);
      EXPECT_EQ(tr.speculator, 2);
      const std::span<const float> q = t->distribution(tr.dist);
      ASSERT_EQ(q.size(), static_cast<size_t>(kVocab));
      EXPECT_NEAR(q[1], 0.6f, 1e-5);
      // The child's probability is its parent's times q of its token.
      const TreeNode& c = t->node(tr.child);
      EXPECT_NEAR(c.prob, t->node(v).prob * q[static_cast<size_t>(c.token)], 1e-6);
    }
  }
}

TEST(DynamicTree, NothingToGrowAndDraftErrors) {
  ToyDraft draft;
  DynamicTreeOptions o;
  o.max_nodes = 0;
  o.max_depth = 4;
  Rng rng(4);
  EXPECT_EQ(GrowDynamicTree(0, draft.row, o, Greedy(), rng, 0, draft.fn())->size(), 1);
  o.max_nodes = 8;
  const DraftRunFn failing = [](const TokenTree&, std::span<const int32_t>, std::vector<float>&) {
    return InternalError("draft failed");
  };
  EXPECT_EQ(GrowDynamicTree(0, draft.row, o, Greedy(), rng, 0, failing).status().code(),
            StatusCode::kInternal);
}

}  // namespace
}  // namespace specinfer
