// The adaptive speculation controller (engine/spec_controller.h): its cost model's interpolation,
// and the depth it chooses on synthetic cost curves and acceptance: zero when the pass is
// compute-bound or the drafts fail, deep when a pass costs about the same for more tokens and
// the drafts are accepted, and probes that let a failed speculator come back.
#include "engine/spec_controller.h"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

namespace specinfer {
namespace {

TEST(PassCostModel, InterpolatesAndExtrapolates) {
  PassCostModel m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.Predict(4), 0);
  m.Observe(1, 0.010);
  EXPECT_DOUBLE_EQ(m.Predict(1), 0.010);
  EXPECT_DOUBLE_EQ(m.Predict(8), 0.010);  // one point: flat (optimistic)
  m.Observe(5, 0.014);
  EXPECT_NEAR(m.Predict(3), 0.012, 1e-12);             // between the two
  EXPECT_NEAR(m.Predict(9), 0.014 + 4 * 0.001, 1e-12);  // past the largest: the range's slope
  EXPECT_NEAR(m.Predict(0.5), 0.010, 1e-12);            // below the smallest: flat
  // EWMA: a new observation moves the value a fifth of the way.
  m.Observe(5, 0.024);
  EXPECT_NEAR(m.Predict(5), 0.016, 1e-12);
}

TEST(PassCostModel, MoreTokensNeverCostLess) {
  // A count measured in a slow moment must not make a larger count look cheaper.
  PassCostModel m;
  for (int k = 0; k < 3; ++k) {
    m.Observe(8, 0.010);
    m.Observe(16, 0.030);  // slow
    m.Observe(32, 0.020);
  }
  EXPECT_NEAR(m.Predict(16), 0.030, 1e-9);
  EXPECT_NEAR(m.Predict(24), 0.030, 1e-9);
  EXPECT_NEAR(m.Predict(32), 0.030, 1e-9);
  for (double t = 1; t <= 64; t += 0.5) EXPECT_LE(m.Predict(t), m.Predict(t + 0.5)) << t;
}

TEST(PassCostModel, CalibrationCurveFollowsTheLoad) {
  PassCostModel m;
  m.Set(1, 0.010);
  m.Set(9, 0.018);
  EXPECT_FALSE(m.empty());
  EXPECT_NEAR(m.Predict(5), 0.014, 1e-12);
  // Online passes twice as slow as calibrated (a loaded machine): uncalibrated counts and
  // counts seen online once follow the curve times the load factor, which moves towards 2.
  for (int i = 0; i < 60; ++i) m.Observe(1, 0.020);
  EXPECT_NEAR(m.load_factor(), 2.0, 0.01);
  EXPECT_NEAR(m.Predict(1), 0.020, 1e-9);        // seen online: its own value
  EXPECT_NEAR(m.Predict(5), 2 * 0.014, 0.0005);  // never seen: the curve, scaled
  EXPECT_NEAR(m.Predict(9), 2 * 0.018, 0.0005);
}

// A controller whose cost model holds t(T) = a + b * T for T in [1, 64].
void WithCost(SpecController& c, double a, double b) {
  for (int t = 1; t <= 64; ++t)
    for (int k = 0; k < 2; ++k) c.ObserveStep(nullptr, t, a + b * t, a + b * t, 0, 0, 0);
}

// A sequence that saw `trees` trees of a chain of `depth`, each accepting `accepted` tokens.
AcceptanceModel Seen(int trees, int32_t depth, int32_t accepted) {
  AcceptanceModel m;
  std::vector<int32_t> nodes(static_cast<size_t>(depth), 1);
  for (int i = 0; i < trees; ++i) m.Observe(depth, nodes, accepted, SpecController::kSeqAlpha);
  return m;
}

std::vector<SpecController::Candidate> Candidates(const std::vector<AcceptanceModel>& own,
                                                  const std::string& key,
                                                  const std::vector<int64_t>& shape) {
  std::vector<SpecController::Candidate> cs;
  for (size_t i = 0; i < own.size(); ++i) {
    SpecController::Candidate c;
    c.key = &key;
    c.own = &own[i];
    c.shape_nodes = shape;
    c.max_depth = static_cast<int32_t>(shape.size());
    c.id = 1 + 2 * i;  // never probing at the controller's first step ((0 + id) % 16 != 0)
    cs.push_back(c);
  }
  return cs;
}

const std::vector<int64_t> kChain4 = {1, 1, 1, 1};

TEST(SpecController, SpeculatesDeepWhenPassesAreMemoryBoundAndDraftsHit) {
  // 20 ms per pass plus 0.1 ms per token: four more tokens cost 2%.
  SpecController c;
  WithCost(c, 0.020, 0.0001);
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(1, Seen(20, 4, 4));
  auto choice = c.Choose(Candidates(own, key, kChain4), 1, 0, 512);
  ASSERT_EQ(choice.depth.size(), 1u);
  EXPECT_EQ(choice.depth[0], 4);
  EXPECT_GT(choice.predicted_gain, 3.0);
  EXPECT_EQ(choice.budget_tokens, 4);
}

TEST(SpecController, PlainDecodingWhenComputeBound) {
  // A pass costs 1 ms per token and nothing else: a speculated token costs as much as a plain
  // step but is accepted 80% of the time, so 16 sequences are better off without.
  SpecController c;
  WithCost(c, 0.0, 0.001);
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(16, Seen(20, 4, 3));
  auto choice = c.Choose(Candidates(own, key, kChain4), 16, 0, 512);
  for (int32_t d : choice.depth) EXPECT_EQ(d, 0);
  EXPECT_EQ(choice.budget_tokens, 0);
  EXPECT_DOUBLE_EQ(choice.predicted_gain, 1.0);
}

TEST(SpecController, PlainDecodingWhenDraftsFail) {
  SpecController c;
  WithCost(c, 0.020, 0.0005);
  const std::string key = "layers:4";
  std::vector<AcceptanceModel> own(4, Seen(30, 4, 0));
  for (int i = 0; i < 30; ++i) c.ObserveTree(key, 4, std::vector<int32_t>{1, 1, 1, 1}, 0, 0.001);
  auto choice = c.Choose(Candidates(own, key, kChain4), 4, 0, 512);
  for (int32_t d : choice.depth) EXPECT_EQ(d, 0);
}

TEST(SpecController, DraftCostCountsAgainstSpeculation) {
  // Cheap passes, good acceptance, but each drafted level costs as much as the pass itself.
  SpecController c;
  WithCost(c, 0.010, 0.0001);
  const std::string key = "model:draft";
  for (int i = 0; i < 30; ++i)
    c.ObserveTree(key, 4, std::vector<int32_t>{1, 1, 1, 1}, 1, 4 * 0.012);
  std::vector<AcceptanceModel> own(1, Seen(20, 4, 1));
  auto choice = c.Choose(Candidates(own, key, kChain4), 1, 0, 512);
  EXPECT_EQ(choice.depth[0], 0);
}

TEST(SpecController, GrowsWithAcceptanceBetweenTheExtremes) {
  // 10 ms + 1 ms per token for 8 sequences: the break-even acceptance of a token is about
  // 1 / (10 / 8 + 1) = 0.44: drafts accepted at depth 1 only go one deep.
  SpecController c;
  WithCost(c, 0.010, 0.001);
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(8, Seen(40, 4, 1));
  auto choice = c.Choose(Candidates(own, key, kChain4), 8, 0, 512);
  for (int32_t d : choice.depth) EXPECT_EQ(d, 1);
}

TEST(SpecController, ProbesOneLevelDeeperEveryPeriod) {
  SpecController c;
  WithCost(c, 0.020, 0.0001);
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(1, Seen(20, 4, 0));
  int probes = 0;
  for (int32_t step = 0; step < 4 * SpecController::kProbePeriod; ++step) {
    auto choice = c.Choose(Candidates(own, key, kChain4), 1, 0, 512);
    EXPECT_LE(choice.depth[0], 1);
    probes += choice.depth[0];
  }
  EXPECT_EQ(probes, 4);
}

TEST(SpecController, ProbesThinOutWhileTheSpeculatorSetFails) {
  // Probes of a speculator set whose trees are never accepted come kMaxProbeBackoff times less
  // often; once its trees hit again, at the base period.
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(1, Seen(20, 4, 0));
  auto count_probes = [&](SpecController& c) {
    int probes = 0;
    for (int32_t step = 0; step < 16 * SpecController::kProbePeriod; ++step)
      probes += c.Choose(Candidates(own, key, kChain4), 1, 0, 512).probed ? 1 : 0;
    return probes;
  };
  SpecController failing;
  WithCost(failing, 0.020, 0.0001);
  for (int i = 0; i < 30; ++i)
    failing.ObserveTree(key, 1, std::vector<int32_t>{1}, 0, 0.0001);
  EXPECT_EQ(count_probes(failing), 16 / SpecController::kMaxProbeBackoff);
  SpecController hitting;
  WithCost(hitting, 0.020, 0.0001);
  for (int i = 0; i < 30; ++i)
    hitting.ObserveTree(key, 1, std::vector<int32_t>{1}, i % 2, 0.0001);  // half hit
  EXPECT_EQ(count_probes(hitting), 16);
}

TEST(SpecController, ProbesWithoutADraftDoNotThinTheProbes) {
  // A prompt lookup without a match drafts nothing (no cost, nothing learnt about acceptance):
  // such trees, static or dynamic, leave the probe rate alone, so a sequence whose first probes
  // found no match still probes at the base period.
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(1, Seen(20, 4, 0));
  SpecController c;
  WithCost(c, 0.020, 0.0001);
  for (int i = 0; i < 30; ++i) c.ObserveTree(key, 1, std::vector<int32_t>{0}, 0, 0.0001);
  int probes = 0;
  for (int32_t step = 0; step < 16 * SpecController::kProbePeriod; ++step)
    probes += c.Choose(Candidates(own, key, kChain4), 1, 0, 512).probed ? 1 : 0;
  EXPECT_EQ(probes, 16);

  SpecController d;
  WithCost(d, 0.020, 0.0001);
  for (int i = 0; i < 30; ++i) d.ObserveBudgetTree(key, 2, {}, 0, 0.0001);
  std::vector<SpecController::Candidate> cs = Candidates(own, key, kChain4);
  BudgetAcceptanceModel own_budget;  // past its young probes (kYoungTrees)
  for (int i = 0; i < SpecController::kYoungTrees; ++i)
    own_budget.Observe(2, {}, 0, SpecController::kSeqAlpha);
  cs[0].own_budget = &own_budget;
  cs[0].max_nodes = 16;
  probes = 0;
  for (int32_t step = 0; step < 16 * SpecController::kProbePeriod; ++step)
    probes += d.ChooseBudgets(cs, 1, 0, 512).probed ? 1 : 0;
  EXPECT_EQ(probes, 16);
}

TEST(SpecController, AGoodDraftWhoseFirstTreesMissedIsBackWithinAFewProbes) {
  // A lone sequence on a CPU (5 ms + 0.4 ms per pass token, 0.7 ms of drafting per level) whose
  // draft misses its first four trees and then hits every other one (worth about 1.25x at
  // depth 1). Seen with a trained draft: the first misses switched it off, and one probe in 16
  // steps (each moving an EWMA started at 0 by a tenth) never brought it back in 200 tokens.
  SpecController c;
  WithCost(c, 0.005, 0.0004);
  const std::string key = "model:ssm";
  std::vector<AcceptanceModel> own(1);
  const std::vector<int64_t> shape = {1};
  const auto cands = Candidates(own, key, shape);
  int trees = 0, late = 0;
  for (int step = 0; step < 300; ++step) {
    const SpecController::Choice ch = c.Choose(cands, 1, 0, 512);
    if (ch.depth[0] == 0) continue;
    const int32_t accepted = trees >= 4 && trees % 2 == 0 ? 1 : 0;
    ++trees;
    own[0].Observe(1, std::vector<int32_t>{1}, accepted, SpecController::kSeqAlpha);
    c.ObserveTree(key, 1, std::vector<int32_t>{1}, accepted, 0.0007);
    if (step >= 100) ++late;
  }
  EXPECT_GE(late, 150);  // of the last 200 steps
}

TEST(SpecController, ProbesOfAComputeBoundBatchStayWithinTheirShareOfTheStepTime) {
  // 16 sequences whose drafts never hit, so every deeper level is a probe. Memory-bound passes
  // (20 ms + 0.1 ms per token): the base rate, one probe every kProbeEvery steps. Compute-bound
  // passes (1 ms per token, a probe's tokens ~12% of a 16-token pass): probes so rare that their
  // tokens cost at most kProbeShare of the steps' time.
  const std::string key = "ngram";
  const std::vector<AcceptanceModel> own(16, Seen(20, 4, 0));
  const int32_t steps = 64 * 16;
  auto probe_tokens = [&](SpecController& c) {
    int64_t tokens = 0, probes = 0;
    for (int32_t step = 0; step < steps; ++step) {
      const SpecController::Choice ch = c.Choose(Candidates(own, key, kChain4), 16, 0, 512);
      tokens += ch.budget_tokens;
      probes += ch.probed ? 1 : 0;
    }
    return std::pair{tokens, probes};
  };
  SpecController memory_bound;
  WithCost(memory_bound, 0.020, 0.0001);
  const auto [m_tokens, m_probes] = probe_tokens(memory_bound);
  EXPECT_EQ(m_tokens, steps / SpecController::kProbeEvery);  // one token each
  EXPECT_GE(m_probes, steps / SpecController::kProbeEvery / 2);

  SpecController compute_bound;
  WithCost(compute_bound, 0.0, 0.001);
  const auto [c_tokens, c_probes] = probe_tokens(compute_bound);
  EXPECT_GT(c_tokens, 0);  // still exploring
  // Each probe token costs 1 ms beside a 16 ms step.
  const double share = static_cast<double>(c_tokens) * 0.001 / (steps * 0.016);
  EXPECT_LE(share, SpecController::kProbeShare) << c_tokens << " probe tokens";
  EXPECT_LT(c_tokens, m_tokens / 4);
}

TEST(SpecController, PrefillTokensInThePassDoNotMakeTreesLookCheap) {
  // Compute-bound passes (1 ms per token): one decoding sequence whose drafts are accepted 75%
  // of the time loses by speculating, whether or not a 100-token prefill chunk shares its pass
  // (beside it, a 1-token tree adds 1% to the step's time and 75% to its emitted tokens).
  SpecController c;
  WithCost(c, 0.0, 0.001);
  for (int t = 65; t <= 128; ++t)
    for (int k = 0; k < 2; ++k) c.ObserveStep(nullptr, t, 0.001 * t, 0.001 * t, 0, 0, 0);
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(1, Seen(20, 4, 3));
  EXPECT_EQ(c.Choose(Candidates(own, key, kChain4), 1, 0, 512).depth[0], 0);
  EXPECT_EQ(c.Choose(Candidates(own, key, kChain4), 1, 100, 512).depth[0], 0);
  // Memory-bound passes (20 ms + 0.1 ms per token): it speculates beside the chunk too.
  SpecController m;
  WithCost(m, 0.020, 0.0001);
  for (int t = 65; t <= 128; ++t) {
    const double seconds = 0.02 + 0.0001 * t;
    for (int k = 0; k < 2; ++k) m.ObserveStep(nullptr, t, seconds, seconds, 0, 0, 0);
  }
  EXPECT_GT(m.Choose(Candidates(own, key, kChain4), 1, 100, 512).depth[0], 0);
}

TEST(SpecController, SpeculationThatDoesNotDeliverIsCutBackAndRetriedLater) {
  // The model predicts a gain (20 ms passes, 0.1 ms per token, half the drafts accepted) and the
  // passes take what it predicts, but speculating steps take four times their predicted time
  // (what the model cannot see, e.g. drafts competing with the LLM for the same cores).
  SpecController c;
  WithCost(c, 0.020, 0.0001);
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(1, Seen(20, 4, 2));
  const auto cands = Candidates(own, key, kChain4);
  auto step = [&](bool hidden_cost) {
    SpecController::Choice ch = c.Choose(cands, 1, 0, 512);
    const int32_t tokens = 1 + static_cast<int32_t>(ch.budget_tokens);
    const double pass = c.cost().Predict(tokens);
    const bool speculating = ch.budget_tokens > 0 && !ch.probed;
    const double seconds = speculating && hidden_cost ? 4 * ch.predicted_seconds : pass;
    const int64_t emitted = speculating ? std::llround(ch.predicted_tokens) : 1;
    c.ObserveStep(&ch, tokens, pass, seconds, 0, emitted, 1);
    return speculating;
  };
  EXPECT_TRUE(step(true));  // the model alone: speculate
  int speculating = 0;
  for (int i = 0; i < 100; ++i) speculating += step(true) ? 1 : 0;
  EXPECT_LT(speculating, 20);  // cut back after the first few
  int late = 0;
  for (int i = 0; i < 200; ++i) late += step(true) ? 1 : 0;
  EXPECT_LT(late, 20);  // a retry now and then
  // Once speculating steps deliver what the model predicts, the retries find it out.
  int recent = 0;
  for (int i = 0; i < 3000; ++i) {
    const bool s = step(false);
    if (i >= 2900) recent += s ? 1 : 0;
  }
  EXPECT_GE(recent, 80);
}

TEST(SpecController, RespectsTheTokenBudget) {
  SpecController c;
  WithCost(c, 0.020, 0.00001);
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(8, Seen(20, 4, 4));
  // 8 roots + 4 other tokens leave 4 speculated tokens in a pass of 16.
  auto choice = c.Choose(Candidates(own, key, kChain4), 8, 4, 16);
  int32_t total = 0;
  for (int32_t d : choice.depth) total += d;
  EXPECT_EQ(total, 4);
  EXPECT_EQ(choice.budget_tokens, 4);
}

TEST(SpecController, SnapshotFollowsTheSteps) {
  SpecController c;
  WithCost(c, 0.020, 0.0001);
  const std::string key = "ngram";
  std::vector<AcceptanceModel> own(1, Seen(20, 4, 4));
  auto choice = c.Choose(Candidates(own, key, kChain4), 1, 0, 512);
  c.ObserveStep(&choice, 5, 0.0205, 0.0205, 0, 5, 1);
  const SpecControllerSnapshot s = c.Snapshot();
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.speculating_steps, 1);
  EXPECT_EQ(s.budget_tokens, 4);
  EXPECT_GT(s.predicted_gain, 3.0);
  EXPECT_NEAR(s.measured_gain, (5 / 0.0205) / (1 / choice.plain_seconds), 1e-9);
}

TEST(SpecBudgetMode, Parses) {
  SpecBudgetMode m = SpecBudgetMode::kStatic;
  EXPECT_TRUE(ParseSpecBudgetMode("auto", &m));
  EXPECT_EQ(m, SpecBudgetMode::kAuto);
  EXPECT_TRUE(ParseSpecBudgetMode("static", &m));
  EXPECT_EQ(m, SpecBudgetMode::kStatic);
  EXPECT_FALSE(ParseSpecBudgetMode("4", &m));
  EXPECT_STREQ(SpecBudgetModeName(SpecBudgetMode::kAuto), "auto");
}

// --- Node budgets for dynamic trees (ChooseBudgets) ---

// A sequence that saw `trees` dynamic trees with node probabilities `probs` (largest first),
// drafted with budget `budget`, each accepting `accepted` tokens.
BudgetAcceptanceModel SeenBudget(int trees, int32_t budget, const std::vector<float>& probs,
                                 int32_t accepted) {
  BudgetAcceptanceModel m;
  for (int i = 0; i < trees; ++i) m.Observe(budget, probs, accepted, SpecController::kSeqAlpha);
  return m;
}

std::vector<SpecController::Candidate> BudgetCandidates(
    const std::vector<BudgetAcceptanceModel>& own, const std::string& key, int32_t max_nodes) {
  std::vector<SpecController::Candidate> cs;
  for (size_t i = 0; i < own.size(); ++i) {
    SpecController::Candidate c;
    c.key = &key;
    c.own_budget = &own[i];
    c.max_depth = 8;
    c.max_nodes = max_nodes;
    c.id = 1 + 2 * i;  // never probing at the controller's first step
    cs.push_back(c);
  }
  return cs;
}

TEST(SpecController, ChoosesANodeBudgetFromTheDraftsConfidence) {
  // 20 ms per pass plus 0.1 ms per token; a confident draft (node probabilities 0.9, 0.8, ...
  // whose trees are accepted as predicted) earns a budget of several nodes, the total budget
  // is what the choice reports, and depth is the candidate's whole depth.
  SpecController c;
  WithCost(c, 0.020, 0.0001);
  const std::string key = "ngram";
  const std::vector<float> probs = {0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.3f, 0.2f};
  const std::vector<BudgetAcceptanceModel> own = {SeenBudget(40, 8, probs, 4)};
  const auto cs = BudgetCandidates(own, key, 64);
  const SpecController::Choice ch = c.ChooseBudgets(cs, 1, 0, 512);
  ASSERT_EQ(ch.nodes.size(), 1u);
  EXPECT_GE(ch.nodes[0], 4);
  EXPECT_EQ(ch.depth[0], 8);
  EXPECT_EQ(ch.budget_tokens, ch.nodes[0]);
  EXPECT_GT(ch.predicted_gain, 1.5);
  // What /metrics shows (specinfer_spec_budget_tokens) is that node budget.
  c.ObserveStep(&ch, 1 + ch.nodes[0], 0.021, 0.022, 0.0, 3, 1);
  EXPECT_EQ(c.Snapshot().budget_tokens, ch.nodes[0]);
  EXPECT_EQ(c.Snapshot().speculating_steps, 1);
}

TEST(SpecController, ChoosesNoNodesWhenDraftsFailOrPassesAreComputeBound) {
  const std::string key = "layers:4";
  const std::vector<float> probs = {0.9f, 0.8f, 0.7f, 0.6f};
  {
    // Confident but never accepted: the calibration brings the prediction near 0, below what
    // a token costs (a tenth of a step here).
    SpecController c;
    WithCost(c, 0.020, 0.002);
    const std::vector<BudgetAcceptanceModel> own = {SeenBudget(60, 4, probs, 0)};
    const SpecController::Choice ch = c.ChooseBudgets(BudgetCandidates(own, key, 64), 1, 0, 512);
    EXPECT_EQ(ch.nodes[0], 0);
    EXPECT_EQ(ch.depth[0], 0);
    EXPECT_EQ(ch.budget_tokens, 0);
  }
  {
    // Accepted, but every token costs as much as a plain step.
    SpecController c;
    WithCost(c, 0.0, 0.010);
    const std::vector<BudgetAcceptanceModel> own = {SeenBudget(60, 4, probs, 2)};
    const SpecController::Choice ch = c.ChooseBudgets(BudgetCandidates(own, key, 64), 1, 0, 512);
    EXPECT_EQ(ch.nodes[0], 0);
  }
}

TEST(SpecController, NodeBudgetsOfAGoodDraftWhoseFirstTreesMissedComeBack) {
  // As AGoodDraftWhoseFirstTreesMissedIsBackWithinAFewProbes, for dynamic trees of one node: a
  // lone sequence on a CPU (5 ms + 0.4 ms per pass token, 0.7 ms of drafting per node) whose
  // draft gives its node probability 0.5, misses its first four trees, then hits every other
  // one (its confidence right; about 1.2x with one node).
  SpecController c;
  WithCost(c, 0.005, 0.0004);
  const std::string key = "model:ssm";
  std::vector<BudgetAcceptanceModel> own(1);
  const auto cs = BudgetCandidates(own, key, 1);
  const std::vector<float> probs = {0.5f};
  int trees = 0, late = 0;
  for (int step = 0; step < 300; ++step) {
    const SpecController::Choice ch = c.ChooseBudgets(cs, 1, 0, 512);
    if (ch.nodes[0] == 0) continue;
    const int32_t accepted = trees >= 4 && trees % 2 == 0 ? 1 : 0;
    ++trees;
    own[0].Observe(1, probs, accepted, SpecController::kSeqAlpha);
    c.ObserveBudgetTree(key, 1, probs, accepted, 0.0007);
    if (step >= 100) ++late;
  }
  EXPECT_GE(late, 150);  // of the last 200 steps
}

TEST(SpecController, NodeBudgetsProbeNowAndThen) {
  // A draft that failed gets budget 0, but within kProbePeriod choices a probe of 2 nodes.
  SpecController c;
  WithCost(c, 0.020, 0.0001);
  const std::string key = "ngram";
  const std::vector<BudgetAcceptanceModel> own = {SeenBudget(60, 4, {0.9f, 0.9f}, 0)};
  const auto cs = BudgetCandidates(own, key, 64);
  int probes = 0;
  for (int i = 0; i < SpecController::kProbePeriod; ++i) {
    const SpecController::Choice ch = c.ChooseBudgets(cs, 1, 0, 512);
    if (ch.nodes[0] > 0) {
      ++probes;
      EXPECT_EQ(ch.nodes[0], 2);
    }
  }
  EXPECT_EQ(probes, 1);
}

}  // namespace
}  // namespace specinfer
