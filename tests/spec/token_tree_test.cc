// Token trees: proposals, merging (SpecInfer §3.2) and the depth-first layout.
#include "spec/token_tree.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "backend/backend.h"
#include "spec/ngram.h"

namespace specinfer {
namespace {

using Seqs = std::vector<std::vector<int32_t>>;

Seqs Sorted(Seqs s) {
  std::sort(s.begin(), s.end());
  return s;
}

TEST(TokenTree, ProposingAnExistingChildAddsATrialNotANode) {
  TokenTree t(7);
  const int32_t a = t.Propose(0, 5, /*speculator=*/0);
  const int32_t b = t.Propose(0, 5, /*speculator=*/1);
  EXPECT_EQ(a, b);
  EXPECT_EQ(t.size(), 2);
  EXPECT_EQ(t.node(0).trials.size(), 2u);
  EXPECT_EQ(t.node(a).proposers, 0b11u);
  EXPECT_EQ(t.node(a).depth, 1);
  EXPECT_EQ(t.FindChild(0, 5), a);
  EXPECT_EQ(t.FindChild(0, 6), -1);
}

// The merged tree holds exactly the union of the input trees' sequences, shared prefixes once,
// and remembers every proposer.
TEST(TokenTree, MergeIsTheUnionOfSequencesWithSharedPrefixesOnce) {
  TokenTree a(1), b(1);
  // a: 1 -> 2 -> 3 -> 4, 1 -> 2 -> 5
  int32_t n = a.Propose(0, 2, 0);
  a.Propose(a.Propose(n, 3, 0), 4, 0);
  a.Propose(n, 5, 0);
  // b: 1 -> 2 -> 3 -> 6, 1 -> 7
  n = b.Propose(0, 2, 1);
  b.Propose(b.Propose(n, 3, 1), 6, 1);
  b.Propose(0, 7, 1);
  const Seqs want = Sorted({{2, 3, 4}, {2, 5}, {2, 3, 6}, {7}});
  ASSERT_TRUE(a.Merge(std::move(b)).ok());
  EXPECT_EQ(Sorted(a.Sequences()), want);
  EXPECT_EQ(a.size(), 7);  // root, 2, 3, 4, 5, 6, 7: the prefix 2 -> 3 once
  const int32_t two = a.FindChild(0, 2), three = a.FindChild(two, 3);
  EXPECT_EQ(a.node(two).proposers, 0b11u);
  EXPECT_EQ(a.node(three).proposers, 0b11u);
  EXPECT_EQ(a.node(a.FindChild(three, 6)).proposers, 0b10u);
  EXPECT_EQ(a.node(a.FindChild(0, 7)).proposers, 0b10u);
  // Trials of both speculators survive, the first tree's first.
  ASSERT_EQ(a.node(0).trials.size(), 3u);
  EXPECT_EQ(a.node(0).trials[0].speculator, 0);
  EXPECT_EQ(a.node(0).trials[1].speculator, 1);
  EXPECT_EQ(a.max_depth(), 3);

  TokenTree other_root(9);
  EXPECT_FALSE(a.Merge(std::move(other_root)).ok());
}

TEST(TokenTree, MergeKeepsDraftDistributions) {
  TokenTree a(0), b(0);
  const int32_t da = a.AddDistribution({0.5f, 0.5f});
  a.Propose(0, 1, 0, da);
  const int32_t db = b.AddDistribution({0.25f, 0.75f});
  b.Propose(0, 1, 1, db);
  ASSERT_TRUE(a.Merge(std::move(b)).ok());
  ASSERT_EQ(a.node(0).trials.size(), 2u);
  EXPECT_EQ(a.distribution(a.node(0).trials[0].dist)[1], 0.5f);
  EXPECT_EQ(a.distribution(a.node(0).trials[1].dist)[1], 0.75f);
}

TEST(TokenTree, DepthFirstLayoutPutsEachSubtreeContiguously) {
  TokenTree t(0);
  const int32_t a = t.Propose(0, 10, 0);  // node 1
  const int32_t b = t.Propose(0, 20, 0);  // node 2
  const int32_t a1 = t.Propose(a, 11, 0);  // node 3
  const int32_t b1 = t.Propose(b, 21, 0);  // node 4
  t.Propose(a1, 12, 0);                    // node 5
  std::vector<int32_t> order, parents;
  t.DepthFirstLayout(&order, &parents);
  EXPECT_EQ(order, (std::vector<int32_t>{0, a, a1, 5, b, b1}));
  EXPECT_EQ(parents, (std::vector<int32_t>{-1, 0, 1, 2, 0, 4}));
  // The layout's mask lets each node see exactly its ancestors and itself.
  TreeMask m = TreeMask::FromParents(parents);
  EXPECT_TRUE(m.Get(3, 0) && m.Get(3, 1) && m.Get(3, 2) && m.Get(3, 3));
  EXPECT_FALSE(m.Get(3, 4) || m.Get(5, 1) || m.Get(5, 2) || m.Get(4, 3));
  EXPECT_TRUE(m.Get(5, 4) && m.Get(5, 0));
  EXPECT_EQ(t.TokensTo(5), (std::vector<int32_t>{10, 11, 12}));
}

TEST(PromptLookup, ContinuesTheMostRecentLongestMatch) {
  // ... 5 6 7 8 9 ... 5 6 7 1 ... 5 6 [7]: the last 3 tokens "5 6 7" occurred twice; the most
  // recent occurrence comes first.
  const std::vector<int32_t> toks = {5, 6, 7, 8, 9, 3, 5, 6, 7, 1, 2, 4, 5, 6, 7};
  const TokenTree t = PromptLookupTree(toks, TreeShape::Chain(3), 8, 3, 0);
  EXPECT_EQ(t.Sequences(), (Seqs{{1, 2, 4}}));
  // Width 2 at the first level holds both continuations.
  const TokenTree w = PromptLookupTree(toks, *TreeShape::Parse("2,1,1"), 8, 3, 0);
  EXPECT_EQ(Sorted(w.Sequences()), Sorted({{1, 2, 4}, {8, 9, 3}}));
  // Depth is capped by max_depth.
  EXPECT_EQ(PromptLookupTree(toks, TreeShape::Chain(3), 1, 3, 0).Sequences(), (Seqs{{1}}));
  // Nothing matches: the root alone.
  EXPECT_EQ(PromptLookupTree(std::vector<int32_t>{1, 2, 3}, TreeShape::Chain(3), 8, 3, 0).size(),
            1);
}

TEST(PromptLookup, FallsBackToShorterNgrams) {
  // "9 7" never occurred before, but "7" did (followed by 8 3).
  const std::vector<int32_t> toks = {1, 7, 8, 3, 2, 9, 7};
  EXPECT_EQ(PromptLookupTree(toks, TreeShape::Chain(2), 8, 3, 0).Sequences(), (Seqs{{8, 3}}));
  // A continuation may run up to the root itself: "7 8" -> 7 8 ... here "8" follows "7".
  const std::vector<int32_t> rep = {4, 4, 4};
  EXPECT_EQ(PromptLookupTree(rep, TreeShape::Chain(4), 8, 2, 0).Sequences(), (Seqs{{4}}));
}

TEST(TokenTree, NodesKeepTheLargestProbabilityProposedAndMergeCarriesIt) {
  TokenTree a(7), b(7);
  EXPECT_EQ(a.node(0).prob, 1.0f);  // the root is already chosen
  const int32_t x = a.Propose(0, 5, 0, -1, 0.25f);
  a.Propose(x, 6, 0, -1, 0.125f);
  const int32_t y = b.Propose(0, 5, 1, -1, 0.5f);
  b.Propose(y, 9, 1, -1, 0.0625f);
  ASSERT_TRUE(a.Merge(std::move(b)).ok());
  EXPECT_EQ(a.node(x).prob, 0.5f);
  EXPECT_EQ(a.SortedProbs(), (std::vector<float>{0.5f, 0.125f, 0.0625f}));
  a.RaiseProb(x, 0.1f);  // lower: unchanged
  EXPECT_EQ(a.node(x).prob, 0.5f);
}

TEST(PromptLookup, StaticTreesStopAtTheNodeBudgetInInsertionOrder) {
  const std::vector<int32_t> toks = {5, 6, 7, 8, 9, 3, 5, 6, 7, 1, 2, 4, 5, 6, 7};
  const TokenTree w = PromptLookupTree(toks, *TreeShape::Parse("2,1,1"), 8, 3, 0, 4);
  EXPECT_EQ(Sorted(w.Sequences()), Sorted({{1, 2, 4}, {8}}));
  // Nodes carry the per-match confidence: 3 matching tokens, 3/4 per token.
  EXPECT_FLOAT_EQ(w.node(w.FindChild(0, 1)).prob, 0.75f);
  EXPECT_EQ(PromptLookupTree(toks, *TreeShape::Parse("2,1,1"), 8, 3, 0, 0).size(), 1);
}

TEST(PromptLookup, DynamicTreesKeepTheMostConfidentNodes) {
  // Both continuations of "5 6 7" have confidence 3/4 per token: the 4 best nodes are the first
  // two levels of both (0.75, 0.75, 0.5625, 0.5625), whatever the shape's widths.
  const std::vector<int32_t> toks = {5, 6, 7, 8, 9, 3, 5, 6, 7, 1, 2, 4, 5, 6, 7};
  const TokenTree t = PromptLookupDynamicTree(toks, 3, 4, 3, 0);
  EXPECT_EQ(Sorted(t.Sequences()), Sorted({{1, 2}, {8, 9}}));
  EXPECT_EQ(t.SortedProbs(), (std::vector<float>{0.75f, 0.75f, 0.5625f, 0.5625f}));
  // Depth and budget bound it; every proposal is deterministic.
  const TokenTree d = PromptLookupDynamicTree(toks, 1, 64, 3, 0);
  EXPECT_EQ(Sorted(d.Sequences()), Sorted({{1}, {8}}));
  for (int32_t v = 0; v < t.size(); ++v)
    for (const DraftTrial& tr : t.node(v).trials) EXPECT_EQ(tr.dist, -1);
  // A one-token match is less sure (1/2 per token) than a longer one.
  EXPECT_LT(PromptLookupConfidence(1), PromptLookupConfidence(3));
  EXPECT_EQ(PromptLookupDynamicTree(toks, 3, 0, 3, 0).size(), 1);
}

}  // namespace
}  // namespace specinfer
