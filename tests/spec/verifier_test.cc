// Token-tree verification: greedy follows the LLM's argmax; multi-step speculative sampling
// (MSS) reproduces the LLM's distribution exactly.
//
// The statistical tests run the production pieces (ProposeChildren, GrowDynamicTree,
// TokenTree::Merge, VerifyStochastic) on toy "models" — logits from a hash of the context over
// an 8-token vocabulary — generating two tokens N = 200000 times per configuration, and compare
// the counts of the first token, the second token and the pair with the exact probabilities. A
// cell fails when it is more than 5 standard deviations off. With N = 200000 an absolute bias of
// 1% in a token of probability 0.3 is 9.8 standard deviations, so the test catches it; two
// deliberately wrong verifiers below show that it does, and so does a dynamic tree pruned by its
// sampled nodes' probabilities.
#include "spec/verifier.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>

#include "spec/dynamic_tree.h"
#include "spec/speculator.h"

namespace specinfer {
namespace {

constexpr int32_t kVocab = 8;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Logits after `ctx` of the toy model `salt`, in [-scale, scale].
std::vector<float> ToyLogits(std::span<const int32_t> ctx, uint64_t salt, float scale) {
  uint64_t h = Mix(salt);
  for (int32_t t : ctx) h = Mix(h ^ static_cast<uint64_t>(t + 1));
  std::vector<float> l(kVocab);
  for (int32_t i = 0; i < kVocab; ++i) {
    const double u = static_cast<double>(Mix(h + i) >> 11) / 9007199254740992.0;
    l[i] = static_cast<float>(scale * (2 * u - 1));
  }
  return l;
}

// The LLM, a draft close to it, and a draft that is not.
std::vector<float> LlmLogits(std::span<const int32_t> ctx) { return ToyLogits(ctx, 1, 2.5f); }
std::vector<float> GoodDraftLogits(std::span<const int32_t> ctx) {
  std::vector<float> l = LlmLogits(ctx), noise = ToyLogits(ctx, 2, 0.8f);
  for (int32_t i = 0; i < kVocab; ++i) l[i] += noise[i];
  return l;
}
std::vector<float> PoorDraftLogits(std::span<const int32_t> ctx) {
  return ToyLogits(ctx, 3, 2.0f);
}

using LogitsFn = std::function<std::vector<float>(std::span<const int32_t>)>;

struct ToySpeculator {
  LogitsFn logits;
  bool deterministic;  // top-k proposals (as under greedy expansion or prompt lookup)
};

// A verifier under test; `ctx` is the sequence up to the tree's root (for the wrong verifiers).
using VerifyFn =
    std::function<VerifyOutcome(const TokenTree&, std::span<const float>, int32_t,
                                const SamplingParams&, Rng&, const std::vector<int32_t>& ctx)>;

// Grows speculator s's tree level by level from `ctx` (whose last token is the root), exactly as
// the model drafts do.
TokenTree Expand(const ToySpeculator& spec, int32_t index, const std::vector<int32_t>& ctx,
                 const TreeShape& shape, const SamplingParams& sampling, Rng& rng) {
  TokenTree tree(ctx.back());
  SamplingParams expansion = sampling;
  if (spec.deterministic) expansion.temperature = 0;  // top-k, proposed deterministically
  std::vector<int32_t> frontier = {0}, next;
  for (int32_t k : shape.widths) {
    next.clear();
    for (int32_t v : frontier) {
      std::vector<int32_t> path = ctx;
      for (int32_t t : tree.TokensTo(v)) path.push_back(t);
      const int32_t before = tree.size();
      ProposeChildren(tree, v, spec.logits(path), k, expansion, rng, index);
      for (int32_t c = before; c < tree.size(); ++c) next.push_back(c);
    }
    frontier.swap(next);
  }
  return tree;
}

// Dynamic trees (spec/dynamic_tree.h) of each speculator in turn, each within an even share of
// what the earlier ones left of `budget` nodes, as SpeculativeStep::Plan does; `min_prob` makes
// growth stop early (after draws whose probabilities it depends on), so later speculators'
// shares vary.
struct DynamicTrees {
  int32_t budget = 0;  // 0: static trees of the shape
  float min_prob = 0;
  // Deliberately wrong: grow `overdraw` times the budget, then keep only the `budget` nodes of
  // highest probability (pruning sampled proposals by their own values).
  int32_t overdraw = 1;
};

// Keeps the `keep` nodes of highest cumulative probability (closed under parents: a child's
// probability is at most its parent's) with the trials that lead to them.
TokenTree PruneToMostProbable(const TokenTree& t, int32_t keep) {
  std::vector<int32_t> order;
  for (int32_t v = 1; v < t.size(); ++v) order.push_back(v);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return t.node(a).prob > t.node(b).prob; });
  std::vector<bool> kept(static_cast<size_t>(t.size()), false);
  kept[0] = true;
  for (size_t i = 0; i < order.size() && i < static_cast<size_t>(keep); ++i)
    kept[static_cast<size_t>(order[i])] = true;
  TokenTree out(t.root_token());
  std::vector<int32_t> image(static_cast<size_t>(t.size()), -1);
  image[0] = 0;
  std::vector<int32_t> dist_image;
  for (int32_t v = 0; v < t.size(); ++v) {
    if (!kept[v] || image[v] < 0) continue;
    for (const DraftTrial& tr : t.node(v).trials) {
      if (!kept[tr.child]) continue;
      int32_t dist = -1;
      if (tr.dist >= 0) {
        const std::span<const float> q = t.distribution(tr.dist);
        dist = out.AddDistribution(std::vector<float>(q.begin(), q.end()));
      }
      image[tr.child] = out.Propose(image[v], t.node(tr.child).token, tr.speculator, dist,
                                    t.node(tr.child).prob);
    }
  }
  return out;
}

TokenTree ExpandDynamic(const ToySpeculator& spec, int32_t index, const std::vector<int32_t>& ctx,
                        int32_t depth, int32_t max_nodes, const DynamicTrees& dyn,
                        const SamplingParams& sampling, Rng& rng) {
  SamplingParams expansion = sampling;
  if (spec.deterministic) expansion.temperature = 0;  // next-best tokens, deterministically
  DynamicTreeOptions o;
  o.max_nodes = max_nodes * dyn.overdraw;
  o.max_depth = depth;
  o.min_prob = dyn.min_prob;
  const DraftRunFn run = [&](const TokenTree& t, std::span<const int32_t> nodes,
                             std::vector<float>& logits) {
    logits.clear();
    for (int32_t v : nodes) {
      std::vector<int32_t> path = ctx;
      for (int32_t tok : t.TokensTo(v)) path.push_back(tok);
      const std::vector<float> row = spec.logits(path);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    return Status::Ok();
  };
  auto tree = GrowDynamicTree(ctx.back(), spec.logits(ctx), o, expansion, rng, index, run);
  EXPECT_TRUE(tree.ok());
  if (dyn.overdraw > 1) return PruneToMostProbable(*tree, max_nodes);
  return std::move(tree).value();
}

// Generates two tokens after `prompt` with speculation, as the generator does.
std::pair<int32_t, int32_t> GenerateTwo(const std::vector<ToySpeculator>& specs,
                                        const TreeShape& shape, const SamplingParams& sampling,
                                        const VerifyFn& verify, Rng& rng,
                                        const DynamicTrees& dyn = {}) {
  std::vector<int32_t> ctx = {3};
  std::vector<int32_t> out;
  while (out.size() < 2) {
    TokenTree tree(ctx.back());
    for (size_t s = 0; s < specs.size(); ++s) {
      const int32_t index = static_cast<int32_t>(s);
      if (dyn.budget > 0) {
        const int32_t left = dyn.budget - (tree.size() - 1);
        const int32_t share = (left + static_cast<int32_t>(specs.size() - s) - 1) /
                              static_cast<int32_t>(specs.size() - s);
        if (share <= 0) continue;
        EXPECT_TRUE(tree.Merge(ExpandDynamic(specs[s], index, ctx, shape.depth(), share, dyn,
                                             sampling, rng))
                        .ok());
        continue;
      }
      EXPECT_TRUE(tree.Merge(Expand(specs[s], index, ctx, shape, sampling, rng)).ok());
    }
    std::vector<float> logits;
    for (int32_t v = 0; v < tree.size(); ++v) {
      std::vector<int32_t> path = ctx;
      for (int32_t t : tree.TokensTo(v)) path.push_back(t);
      std::vector<float> row = LlmLogits(path);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    const VerifyOutcome o = verify(tree, logits, kVocab, sampling, rng, ctx);
    for (int32_t v : o.accepted) {
      out.push_back(tree.node(v).token);
      ctx.push_back(tree.node(v).token);
    }
    out.push_back(o.next_token);
    ctx.push_back(o.next_token);
  }
  return {out[0], out[1]};
}

struct Deviation {
  double max_z = 0;    // largest |observed - expected| / sd over all cells
  bool impossible = false;  // a token of probability 0 came out
};

void Check(const std::vector<double>& expect, const std::vector<int64_t>& count, int64_t n,
           Deviation& d) {
  for (size_t i = 0; i < expect.size(); ++i) {
    const double p = expect[i];
    if (p <= 0) {
      d.impossible |= count[i] > 0;
      continue;
    }
    const double z = std::abs(count[i] - n * p) / std::sqrt(n * p * (1 - p));
    d.max_z = std::max(d.max_z, z);
  }
}

// Runs n generations and compares the first token, the second and the pair with the LLM's own
// probabilities under `sampling`.
Deviation Measure(const std::vector<ToySpeculator>& specs, const TreeShape& shape,
                  const SamplingParams& sampling, const VerifyFn& verify, int64_t n,
                  const DynamicTrees& dyn = {}) {
  std::vector<float> p1, p2;
  ComputeProbs(LlmLogits(std::vector<int32_t>{3}), sampling, p1);
  std::vector<double> first(kVocab, 0), second(kVocab, 0), pair(kVocab * kVocab, 0);
  for (int32_t a = 0; a < kVocab; ++a) {
    first[a] = p1[a];
    ComputeProbs(LlmLogits(std::vector<int32_t>{3, a}), sampling, p2);
    for (int32_t b = 0; b < kVocab; ++b) {
      pair[a * kVocab + b] = static_cast<double>(p1[a]) * p2[b];
      second[b] += pair[a * kVocab + b];
    }
  }
  std::vector<int64_t> c1(kVocab, 0), c2(kVocab, 0), c12(kVocab * kVocab, 0);
  Rng rng(12345);
  for (int64_t i = 0; i < n; ++i) {
    auto [a, b] = GenerateTwo(specs, shape, sampling, verify, rng, dyn);
    ++c1[a];
    ++c2[b];
    ++c12[a * kVocab + b];
  }
  Deviation d;
  Check(first, c1, n, d);
  Check(second, c2, n, d);
  Check(pair, c12, n, d);
  std::printf("  %lld samples: max |z| over first, second and pair cells = %.2f\n",
              static_cast<long long>(n), d.max_z);
  return d;
}

constexpr int64_t kSamples = 200000;
const VerifyFn kVerify = [](const TokenTree& tree, std::span<const float> logits, int32_t vocab,
                            const SamplingParams& params, Rng& rng, const std::vector<int32_t>&) {
  return VerifyStochastic(tree, logits, vocab, params, rng);
};

SamplingParams Temperature(float t, int32_t top_k = 0, float top_p = 1.0f) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = top_k;
  s.top_p = top_p;
  return s;
}

TEST(MultiStepSpeculativeSampling, OneSampledDraftKeepsTheDistribution) {
  const Deviation d = Measure({{GoodDraftLogits, false}}, *TreeShape::Parse("2,2,1"),
                              Temperature(1), kVerify, kSamples);
  EXPECT_LT(d.max_z, 5) << "output distribution differs from the LLM's";
  EXPECT_FALSE(d.impossible);
}

TEST(MultiStepSpeculativeSampling, SeveralMergedDraftsKeepTheDistribution) {
  const Deviation d =
      Measure({{GoodDraftLogits, false}, {PoorDraftLogits, false}, {GoodDraftLogits, true}},
              *TreeShape::Parse("1,2,1"), Temperature(1), kVerify, kSamples);
  EXPECT_LT(d.max_z, 5);
  EXPECT_FALSE(d.impossible);
}

TEST(MultiStepSpeculativeSampling, DeterministicProposalsKeepTheDistribution) {
  // Top-3 of a draft at every node, as greedy expansion or prompt lookup propose them.
  const Deviation d = Measure({{PoorDraftLogits, true}}, *TreeShape::Parse("3,2"),
                              Temperature(1), kVerify, kSamples);
  EXPECT_LT(d.max_z, 5);
  EXPECT_FALSE(d.impossible);
}

TEST(MultiStepSpeculativeSampling, LowTemperatureTopKAndTopPKeepTheDistribution) {
  for (const SamplingParams& s :
       {Temperature(0.6f), Temperature(1, 4), Temperature(1, 0, 0.8f), Temperature(0.7f, 5, 0.9f)}) {
    SCOPED_TRACE("temperature " + std::to_string(s.temperature) + " top_k " +
                 std::to_string(s.top_k) + " top_p " + std::to_string(s.top_p));
    const Deviation d = Measure({{GoodDraftLogits, false}, {PoorDraftLogits, true}},
                                *TreeShape::Parse("2,1,1"), s, kVerify, kSamples / 2);
    EXPECT_LT(d.max_z, 5);
    EXPECT_FALSE(d.impossible) << "a token outside top-k / top-p came out";
  }
}

// The LLM's distributions at the tree's nodes given as rows of DistRows (what a GPU runner brings
// back for a sampled tree instead of logits: ComputeProbs there), stored sparse or dense as
// DistRows chooses, after `offset` unrelated rows.
DistRows ToDistRows(std::span<const float> logits, int32_t vocab, const SamplingParams& params,
                    int32_t offset) {
  DistRows dists;
  dists.Reset(vocab);
  std::vector<float> p(static_cast<size_t>(vocab), 0.0f);
  p[0] = 1.0f;
  for (int32_t i = 0; i < offset; ++i) dists.AddDense(p);
  for (size_t v = 0; v * vocab < logits.size(); ++v) {
    ComputeProbs(logits.subspan(v * vocab, static_cast<size_t>(vocab)), params, p);
    dists.AddDense(p);
  }
  return dists;
}

TEST(MultiStepSpeculativeSampling, DistributionRowsKeepTheDistribution) {
  const VerifyFn from_dists = [](const TokenTree& tree, std::span<const float> logits,
                                 int32_t vocab, const SamplingParams& params, Rng& rng,
                                 const std::vector<int32_t>&) {
    return VerifyStochastic(tree, ToDistRows(logits, vocab, params, 3), 3, rng);
  };
  for (const SamplingParams& s : {Temperature(1), Temperature(0.7f, 5, 0.9f)}) {
    SCOPED_TRACE("temperature " + std::to_string(s.temperature) + " top_k " +
                 std::to_string(s.top_k) + " top_p " + std::to_string(s.top_p));
    const Deviation d = Measure({{GoodDraftLogits, false}, {PoorDraftLogits, true}},
                                *TreeShape::Parse("2,1,1"), s, from_dists, kSamples / 2);
    EXPECT_LT(d.max_z, 5);
    EXPECT_FALSE(d.impossible);
  }
}

// Verifying from the distributions is verifying from the logits, draw for draw: the same
// accepted path and token from the same random stream, over a vocabulary large enough that
// top-k/top-p rows are stored sparse.
TEST(VerifyStochastic, FromDistributionRowsEqualsFromLogits) {
  constexpr int32_t kWide = 96;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int sparse_rows = 0, accepted = 0;
  for (const SamplingParams& s : {Temperature(1), Temperature(0.8f, 0, 0.6f), Temperature(1.2f, 6),
                                  Temperature(0.5f, 8, 0.9f)}) {
    for (int trial = 0; trial < 150; ++trial) {
      // A random tree over tokens 0..5, its proposals sampled from a toy q or deterministic.
      TokenTree t(0);
      const int32_t size = 1 + static_cast<int32_t>(gen() % 10);
      while (t.size() < size) {
        const auto parent = static_cast<int32_t>(gen() % static_cast<uint32_t>(t.size()));
        std::vector<float> q(kWide, 0.0f);
        for (int32_t x = 0; x < 6; ++x) q[x] = 1.0f / 6;
        const int32_t dist = gen() % 2 ? t.AddDistribution(q) : -1;
        t.Propose(parent, static_cast<int32_t>(gen() % 6), 0, dist);
      }
      std::vector<float> logits(static_cast<size_t>(t.size()) * kWide);
      for (float& l : logits) l = normal(gen);
      for (int32_t v = 0; v < t.size(); ++v)  // the drafts' tokens likely
        for (int32_t x = 0; x < 6; ++x) logits[static_cast<size_t>(v) * kWide + x] += 3.0f;
      const DistRows dists = ToDistRows(logits, kWide, s, 2);
      for (int32_t r = 2; r < dists.size(); ++r) sparse_rows += !dists.ids(r).empty();
      Rng a(static_cast<uint64_t>(trial)), b(static_cast<uint64_t>(trial));
      const VerifyOutcome want = VerifyStochastic(t, logits, kWide, s, a);
      const VerifyOutcome got = VerifyStochastic(t, dists, 2, b);
      EXPECT_EQ(got.accepted, want.accepted) << "trial " << trial;
      EXPECT_EQ(got.next_token, want.next_token) << "trial " << trial;
      EXPECT_EQ(a.Uniform(), b.Uniform()) << "trial " << trial << ": draws out of step";
      accepted += static_cast<int>(want.accepted.size());
    }
  }
  EXPECT_GT(sparse_rows, 300);
  EXPECT_GT(accepted, 100);
}

// --- Dynamic trees (spec/dynamic_tree.h): grown by cumulative draft probability under a node
// budget, several speculators in turn within what the earlier ones left. ---

TEST(MultiStepSpeculativeSampling, DynamicSampledTreesKeepTheDistribution) {
  // Budget 3, depth 2: which node gets the next draw depends on the earlier draws' values.
  const Deviation d = Measure({{GoodDraftLogits, false}}, TreeShape::Chain(2), Temperature(1),
                              kVerify, kSamples, DynamicTrees{3, 0});
  EXPECT_LT(d.max_z, 5) << "output distribution differs from the LLM's";
  EXPECT_FALSE(d.impossible);
}

TEST(MultiStepSpeculativeSampling, MergedDynamicTreesWithSharedBudgetsKeepTheDistribution) {
  // Growth stops below probability 0.15, so each speculator's share is what the draws of the
  // ones before it left: a sampled good draft, a sampled poor one, deterministic proposals.
  const Deviation d =
      Measure({{GoodDraftLogits, false}, {PoorDraftLogits, false}, {GoodDraftLogits, true}},
              TreeShape::Chain(3), Temperature(1), kVerify, kSamples, DynamicTrees{5, 0.15f});
  EXPECT_LT(d.max_z, 5);
  EXPECT_FALSE(d.impossible);
}

TEST(MultiStepSpeculativeSampling, DynamicTreesUnderTopKTopPAndLowTemperature) {
  for (const SamplingParams& s : {Temperature(0.6f), Temperature(0.7f, 5, 0.9f)}) {
    SCOPED_TRACE("temperature " + std::to_string(s.temperature) + " top_k " +
                 std::to_string(s.top_k) + " top_p " + std::to_string(s.top_p));
    const Deviation d = Measure({{PoorDraftLogits, false}, {GoodDraftLogits, true}},
                                TreeShape::Chain(2), s, kVerify, kSamples / 2,
                                DynamicTrees{4, 0.1f});
    EXPECT_LT(d.max_z, 5);
    EXPECT_FALSE(d.impossible) << "a token outside top-k / top-p came out";
  }
}

TEST(MultiStepSpeculativeSampling, TheTestCatchesSampledTreesPrunedByTheirProbabilities) {
  // Growing more nodes than the budget and keeping the most probable ones keeps the draft's
  // favourite draws only: the kept trials are no longer draws from their q. (Why dynamic trees
  // never prune: spec/dynamic_tree.h.)
  const Deviation d = Measure({{PoorDraftLogits, false}}, TreeShape::Chain(2), Temperature(1),
                              kVerify, kSamples, DynamicTrees{2, 0, 4});
  EXPECT_GT(d.max_z, 5) << "the statistical test did not notice pruned sampled trees";
}

// --- Deliberately wrong verifiers: the same tests must catch them. ---

// Tries each proposal against the LLM's unchanged p (no residual after a rejection): the
// naive multi-draft rule, biased towards tokens the drafts like.
VerifyOutcome VerifyWithoutResidual(const TokenTree& tree, std::span<const float> logits,
                                    int32_t vocab, const SamplingParams& params, Rng& rng,
                                    const std::vector<int32_t>&) {
  VerifyOutcome out;
  std::vector<float> p;
  int32_t v = 0;
  for (;;) {
    ComputeProbs(logits.subspan(static_cast<size_t>(v) * vocab, vocab), params, p);
    int32_t accepted = -1;
    for (const DraftTrial& t : tree.node(v).trials) {
      const int32_t x = tree.node(t.child).token;
      const float qx = t.dist < 0 ? 1.0f : tree.distribution(t.dist)[x];
      if (rng.Uniform() * qx < p[x]) {
        accepted = t.child;
        break;
      }
    }
    if (accepted < 0) {
      out.next_token = SampleFromProbs(p, rng);
      return out;
    }
    out.accepted.push_back(accepted);
    v = accepted;
  }
}

// Treats deterministic (top-k) proposals as if they had been drawn from the draft's q: accepts
// with min(1, p/q) and subtracts q on rejection — the published implementations' mistake.
VerifyOutcome VerifyTopKAsSamples(const TokenTree& tree, std::span<const float> logits,
                                  int32_t vocab, const SamplingParams& params, Rng& rng,
                                  const std::vector<int32_t>& ctx) {
  VerifyOutcome out;
  std::vector<float> p, q;
  int32_t v = 0;
  for (;;) {
    ComputeProbs(logits.subspan(static_cast<size_t>(v) * vocab, vocab), params, p);
    std::vector<int32_t> path = ctx;
    for (int32_t tok : tree.TokensTo(v)) path.push_back(tok);
    ComputeProbs(GoodDraftLogits(path), params, q);  // the draft's distribution at v
    int32_t accepted = -1;
    for (const DraftTrial& t : tree.node(v).trials) {
      const int32_t x = tree.node(t.child).token;
      if (rng.Uniform() * q[x] < p[x]) {
        accepted = t.child;
        break;
      }
      double sum = 0;
      for (int32_t i = 0; i < vocab; ++i) sum += p[i] = std::max(0.0f, p[i] - q[i]);
      for (float& f : p) f = static_cast<float>(f / sum);
    }
    if (accepted < 0) {
      out.next_token = SampleFromProbs(p, rng);
      return out;
    }
    out.accepted.push_back(accepted);
    v = accepted;
  }
}

TEST(MultiStepSpeculativeSampling, TheTestCatchesAVerifierWithoutResiduals) {
  const Deviation d = Measure({{GoodDraftLogits, false}, {PoorDraftLogits, false}},
                              *TreeShape::Parse("2,1"), Temperature(1), VerifyWithoutResidual,
                              kSamples);
  EXPECT_GT(d.max_z, 5) << "the statistical test did not notice a biased verifier";
}

TEST(MultiStepSpeculativeSampling, TheTestCatchesTopKChoicesTreatedAsSamples) {
  const Deviation d = Measure({{GoodDraftLogits, true}}, *TreeShape::Parse("2"), Temperature(1),
                              VerifyTopKAsSamples, kSamples);
  EXPECT_GT(d.max_z, 5) << "the statistical test did not notice a biased verifier";
}

// --- Greedy ---

TEST(VerifyGreedy, FollowsTheArgmaxAndAppendsTheLlmsOwnToken) {
  // Tree: root -> {1 -> {2, 3}, 4}. LLM argmax: at root 1, at node "1" 3, at node "3" 7.
  TokenTree t(0);
  const int32_t n1 = t.Propose(0, 1, 0);
  t.Propose(n1, 2, 0);
  const int32_t n3 = t.Propose(n1, 3, 0);
  t.Propose(0, 4, 0);
  std::vector<float> logits(static_cast<size_t>(t.size()) * kVocab, 0.0f);
  auto set_argmax = [&](int32_t node, int32_t tok) { logits[node * kVocab + tok] = 1.0f; };
  set_argmax(0, 1);
  set_argmax(n1, 3);
  set_argmax(n3, 7);
  VerifyOutcome o = VerifyGreedy(t, logits, kVocab);
  EXPECT_EQ(o.accepted, (std::vector<int32_t>{n1, n3}));
  EXPECT_EQ(o.next_token, 7);

  // Root's argmax is not a child: nothing accepted, the LLM's token comes next.
  std::fill(logits.begin(), logits.end(), 0.0f);
  set_argmax(0, 5);
  o = VerifyGreedy(t, logits, kVocab);
  EXPECT_TRUE(o.accepted.empty());
  EXPECT_EQ(o.next_token, 5);
}

// The walk given only each node's argmax (what ForwardArgmax brings back) is the logits walk.
TEST(VerifyGreedy, FromArgmaxIdsEqualsFromLogits) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    // A random tree of up to 12 nodes over tokens 0..3 (so that argmaxes often hit children).
    TokenTree t(0);
    const int32_t size = 1 + static_cast<int32_t>(gen() % 12);
    while (t.size() < size) {
      const auto parent = static_cast<int32_t>(gen() % static_cast<uint32_t>(t.size()));
      t.Propose(parent, static_cast<int32_t>(gen() % 4), 0);
    }
    std::vector<float> logits(static_cast<size_t>(t.size()) * kVocab);
    std::vector<int32_t> ids;
    for (int32_t v = 0; v < t.size(); ++v) {
      for (int32_t x = 0; x < kVocab; ++x)
        logits[static_cast<size_t>(v) * kVocab + x] = static_cast<float>(gen() % 5);  // ties
      ids.push_back(
          Argmax(std::span<const float>(logits).subspan(static_cast<size_t>(v) * kVocab, kVocab)));
    }
    const VerifyOutcome want = VerifyGreedy(t, logits, kVocab);
    const VerifyOutcome got = VerifyGreedy(t, std::span<const int32_t>(ids));
    EXPECT_EQ(got.accepted, want.accepted) << "trial " << trial;
    EXPECT_EQ(got.next_token, want.next_token) << "trial " << trial;
  }
}

TEST(VerifyStochastic, ALeafOrAnEmptyTreeSamplesFromTheLlm) {
  TokenTree t(0);
  std::vector<float> logits(kVocab, -100.0f);
  logits[6] = 100.0f;  // all mass on 6
  Rng rng(1);
  VerifyOutcome o = VerifyStochastic(t, logits, kVocab, Temperature(1), rng);
  EXPECT_TRUE(o.accepted.empty());
  EXPECT_EQ(o.next_token, 6);
}

TEST(VerifyStochastic, NeverAcceptsATokenTheLlmCannotProduce) {
  // Top-k 2 at the LLM leaves tokens 0 and 1; the draft proposes 5.
  TokenTree t(0);
  const int32_t d = t.AddDistribution(std::vector<float>{0, 0, 0, 0, 0, 1, 0, 0});
  t.Propose(0, 5, 0, d);
  std::vector<float> logits = {3, 2, 1, 0, 0, 0.5f, 0, 0};
  logits.resize(2 * kVocab, 0.0f);
  Rng rng(2);
  for (int i = 0; i < 1000; ++i) {
    VerifyOutcome o = VerifyStochastic(t, logits, kVocab, Temperature(1, 2), rng);
    ASSERT_TRUE(o.accepted.empty());
    ASSERT_TRUE(o.next_token == 0 || o.next_token == 1);
  }
}

// --- Never a token of probability zero (issue #18) ---

// The LLM's probabilities at one row, as the verifier computes them.
std::vector<float> LlmProbs(const std::vector<float>& row, const SamplingParams& params) {
  std::vector<float> p;
  ComputeProbs(row, params, p);
  return p;
}

TEST(VerifyStochastic, AProposalRecordedWithZeroDraftProbabilityIsRejected) {
  // Top-k 2 at the LLM leaves tokens 0 and 1; the draft "drew" 5 although its q(5) = 0 (and
  // then 6 with q(6) = NaN, 7 with q(7) = inf). p(5)/q(5) must not become inf and accept.
  const SamplingParams params = Temperature(1, 2);
  std::vector<float> row = {3, 2, 1, 0, 0, 0.5f, 0, 0};
  for (float bad : {0.0f, std::nanf(""), INFINITY}) {
    TokenTree t(0);
    std::vector<float> q = {0.5f, 0.5f, 0, 0, 0, 0, 0, 0};
    q[5] = bad;
    t.Propose(0, 5, 0, t.AddDistribution(q));
    std::vector<float> logits = row;
    logits.resize(2 * kVocab, 0.0f);
    const std::vector<float> p = LlmProbs(row, params);
    Rng rng(3);
    for (int i = 0; i < 1000; ++i) {
      const VerifyOutcome o = VerifyStochastic(t, logits, kVocab, params, rng);
      ASSERT_TRUE(o.accepted.empty()) << "q(x) = " << bad;
      ASSERT_GT(p[static_cast<size_t>(o.next_token)], 0.0f) << "q(x) = " << bad;
    }
  }
}

TEST(VerifyStochastic, AZeroDraftProbabilityTrialIsSkippedNotAccepted) {
  // Without truncation p(5) > 0, so accepting would not emit p = 0, but it would be biased
  // (accepted every time); the trial must be skipped and the token drawn from p: token 5 must
  // come out at about p(5), not always.
  const SamplingParams params = Temperature(1);
  const std::vector<float> row = {3, 2, 1, 0, 0, 0.5f, 0, 0};
  TokenTree t(0);
  const int32_t n5 = t.Propose(0, 5, 0, t.AddDistribution(std::vector<float>(kVocab, 0.0f)));
  std::vector<float> logits = row;
  logits.resize(2 * kVocab, 0.0f);
  const std::vector<float> p = LlmProbs(row, params);
  Rng rng(4);
  constexpr int kN = 20000;
  int fives = 0;
  for (int i = 0; i < kN; ++i) {
    const VerifyOutcome o = VerifyStochastic(t, logits, kVocab, params, rng);
    ASSERT_TRUE(o.accepted.empty() || o.accepted[0] != n5);
    fives += o.next_token == 5;
  }
  const double sd = std::sqrt(kN * p[5] * (1 - p[5]));
  EXPECT_NEAR(fives, kN * p[5], 5 * sd);
}

TEST(VerifyStochastic, AnAllZeroResidualFallsBackToTheLlmsDistribution) {
  // q >= p everywhere and q(x) > p(x): a rejection leaves max(0, p - q) = 0 everywhere. The
  // next token must come from the LLM's distribution (support {0, 1, 2} under top-k 3).
  const SamplingParams params = Temperature(1, 3);
  const std::vector<float> row = {2, 1, 0.5f, -1, -1, -1, -1, -1};
  const std::vector<float> p = LlmProbs(row, params);
  std::vector<float> q = p;
  q[1] = 2 * p[1];  // proposals of 1 are rejected half of the time
  TokenTree t(0);
  t.Propose(0, 1, 0, t.AddDistribution(q));
  std::vector<float> logits = row;
  logits.resize(2 * kVocab, 0.0f);
  Rng rng(5);
  int drawn = 0;
  for (int i = 0; i < 2000; ++i) {
    const VerifyOutcome o = VerifyStochastic(t, logits, kVocab, params, rng);
    if (!o.accepted.empty()) continue;
    ++drawn;
    ASSERT_GT(p[static_cast<size_t>(o.next_token)], 0.0f);
  }
  EXPECT_GT(drawn, 500);
}

TEST(VerifyStochastic, AResidualOfRoundingNoiseDoesNotBecomeNaN) {
  // Top-k 3 keeps tokens 0, 1 and 2, where p(2) = e^-100 ~ 3.7e-44 is a denormal. The draft's q
  // equals p except q(1) = 2 p(1) (so proposals of 1 can be rejected) and q(2) = 0: the residual
  // is p(2) alone, all zero but for rounding noise; its sum is far below 1 / FLT_MAX, so a float
  // normaliser is inf and p would become inf and NaN (0 * inf), and the draw garbage.
  const SamplingParams params = Temperature(1, 3);
  const std::vector<float> row = {100, 99, 0, -1000, -1000, -1000, -1000, -1000};
  const std::vector<float> p = LlmProbs(row, params);
  ASSERT_GT(p[2], 0.0f);
  ASSERT_LT(p[2], 1e-40f);
  std::vector<float> q = p;
  q[1] = 2 * p[1];
  q[2] = 0.0f;
  TokenTree t(0);
  t.Propose(0, 1, 0, t.AddDistribution(q));
  std::vector<float> logits = row;
  logits.resize(2 * kVocab, 0.0f);
  Rng rng(6);
  int drawn = 0;
  for (int i = 0; i < 2000; ++i) {
    const VerifyOutcome o = VerifyStochastic(t, logits, kVocab, params, rng);
    if (!o.accepted.empty()) continue;
    ++drawn;
    ASSERT_GT(p[static_cast<size_t>(o.next_token)], 0.0f) << "token " << o.next_token;
  }
  EXPECT_GT(drawn, 100);
}

TEST(VerifyStochastic, TruncatedLlmNeverEmitsAZeroProbabilityToken) {
  // Under top-k and top-p, proposals outside the LLM's kept set (deterministic and sampled,
  // several per node, two levels deep) are never accepted and the LLM's own token is inside it.
  const std::vector<float> row = {1.5f, 1.2f, 0.3f, 2.0f, -0.5f, 0.9f, 0.1f, -2.0f};
  for (const SamplingParams& params :
       {Temperature(0.8f, 3), Temperature(1.2f, 0, 0.6f), Temperature(1, 4, 0.7f)}) {
    const std::vector<float> p = LlmProbs(row, params);
    TokenTree t(0);
    const int32_t qd =
        t.AddDistribution(std::vector<float>{0, 0, 0.25f, 0, 0.25f, 0, 0.25f, 0.25f});
    std::vector<int32_t> level1;
    for (int32_t x = 0; x < kVocab; ++x) {
      level1.push_back(x % 2 == 0 ? t.Propose(0, x, 0) : t.Propose(0, x, 1, qd));
    }
    for (int32_t c : level1) {
      for (int32_t x = 0; x < kVocab; ++x) x % 3 == 0 ? t.Propose(c, x, 0) : t.Propose(c, x, 1, qd);
    }
    std::vector<float> logits;
    for (int32_t v = 0; v < t.size(); ++v) logits.insert(logits.end(), row.begin(), row.end());
    Rng rng(7);
    for (int i = 0; i < 3000; ++i) {
      const VerifyOutcome o = VerifyStochastic(t, logits, kVocab, params, rng);
      for (int32_t v : o.accepted) ASSERT_GT(p[static_cast<size_t>(t.node(v).token)], 0.0f);
      ASSERT_GT(p[static_cast<size_t>(o.next_token)], 0.0f);
    }
  }
}

}  // namespace
}  // namespace specinfer
