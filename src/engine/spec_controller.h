// Adaptive speculation: an online cost model and the per-step choice of how far each sequence
// speculates, so that speculation is never slower than plain decoding.
//
// Each step the controller picks, for every decoding sequence, a depth cap D (0..the depth its
// tree shape and request allow): the sequence's tree is its shape's expansion cut at depth D
// (D = 0: the root alone, i.e. plain decoding). The choice maximises the predicted tokens per
// second of the whole batch,
//
//            n + sum_i sum_{d <= D_i} r_i(d)
//   max  ------------------------------------------------      n: decoding sequences
//         t(T0 + sum_i sum_{d <= D_i} m_i(d)) + sum_i s_i D_i   T0: the pass's other tokens
//
// from three measured quantities:
//   r(d)  expected accepted tokens at depth d when the tree may reach d (= P(accepted >= d));
//   m(d)  expected tree nodes at depth d when the tree may reach d (a prompt lookup without a
//         match proposes none, so costs nothing);
//   t(T)  seconds of a step whose pass holds T tokens (pass, verification and commit; EWMA per
//         token count, interpolated between measured counts), and s seconds of drafting per level.
// r and m are kept per speculator set (the prior of new sequences) and per sequence (what its
// text does), blended by how much each has seen. The increments (sequence i, depth d) are taken
// greedily by gain per cost and the best prefix of that order wins, so the choice goes to zero
// when the batch is compute-bound (t grows as fast as the tokens) or the drafts fail (r small).
//
// Exploration: a sequence whose cap sits below what it may use probes one level deeper every
// kProbePeriod of the controller's steps, or every kProbeEvery x (candidates) steps when the batch
// is larger (staggered across sequences by id, so that short requests probe too; about one
// probe every kProbeEvery steps then), so a speculator that failed for a while can come back and
// t(T) keeps being measured beyond the chosen counts. A sequence with fewer than kYoungTrees
// trees of its own probes every kProbeEvery steps instead (YoungPeriod), and acceptance rates
// are plain means until they have 1 / alpha observations (Ewma::Average), so a draft whose
// first guesses missed is not written off on them. Where a batch of several sequences is
// compute-bound, probes come rarer still, so that they cost at most kProbeShare of the step
// time (ProbePeriod). A
// speculator set whose drafts mostly fail probes up to kMaxProbeBackoff times less often
// (ProbeBackoff): on free text the probes were the whole cost of having speculation on (1-5%
// more pass tokens, none accepted).
//
// Dynamic trees (SpecBudgetMode::kDynamic, spec/dynamic_tree.h): the controller picks a node
// budget b_i per sequence instead of a depth (0: plain decoding), by the same greedy increments
// with the k-th node of a tree as the increment: its expected accepted tokens are the cumulative
// draft probability of the k-th most probable node of the sequence's recent trees (EWMA by rank)
// times a measured ratio of accepted tokens to the trees' summed probabilities (the draft's
// confidence, calibrated), its cost one pass token and the draft's time per node. A probe doubles
// the budget now and then.
//
// Realism: the model's errors are measured too. Speculating steps' realised tok/s over their
// prediction, against the same ratio of plain steps, scales the predicted tok/s of speculative
// options (at most 1; it drifts back towards 1 while nothing speculates), so speculation that the
// model says pays but the steps say does not is cut back.
//
// Exactness: the caps are decided from past passes only, before anything is drafted, so each
// step's tree is still a tree of its shape drawn as before; greedy output is identical to plain
// decoding and multi-step speculative sampling stays exact (spec/verifier.h).
//
// Thread safety: one thread at a time (the engine core's loop); Snapshot() from any thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace specinfer {

// How the engine decides each step's tree.
enum class SpecBudgetMode {
  kAuto,     // the controller caps each tree's depth to maximise throughput (default)
  kStatic,   // every step expands the full tree shape the request asked for
  kDynamic,  // dynamic trees (spec/dynamic_tree.h) of a node budget the controller chooses
};
// "auto", "static" or "dynamic"; false for anything else.
bool ParseSpecBudgetMode(std::string_view text, SpecBudgetMode* mode);
const char* SpecBudgetModeName(SpecBudgetMode mode);

// Exponentially weighted mean with a count (the first observation sets it).
struct Ewma {
  double value = 0;
  int64_t count = 0;
  void Add(double x, double alpha) {
    value = count == 0 ? x : value + alpha * (x - value);
    ++count;
  }
  // The same, but the plain mean of the first 1 / alpha observations (each weighs 1 / count),
  // for rates: with alpha from the start, a sequence's first two misses made its acceptance 0
  // and the next hit only 0.1, so a good draft that missed twice at first stayed switched off
  // for hundreds of steps.
  void Average(double x, double alpha) {
    ++count;
    value += std::max(alpha, 1.0 / static_cast<double>(count)) * (x - value);
  }
};

// r(d) and m(d) of one sequence or one speculator set (index d - 1).
struct AcceptanceModel {
  std::vector<Ewma> accepted;  // r(d): P(accepted >= d) when the cap allowed d
  std::vector<Ewma> nodes;     // m(d): nodes at depth d when the cap allowed d
  Ewma drafted_hit;            // P(accepted >= 1) of the trees with a node at depth 1
  // One verified tree: it was drafted with cap `cap`, held `nodes_at_depth[d - 1]` nodes at
  // depth d and the LLM accepted `accepted` of them.
  void Observe(int32_t cap, std::span<const int32_t> nodes_at_depth, int32_t accepted,
               double alpha);
};

// For dynamic trees, by rank k of the node budget (index k - 1): the cumulative draft probability
// of a tree's k-th most probable node (0 when it had fewer) and whether it had one, when its
// budget allowed k; and the accepted tokens against the trees' summed probabilities, whose ratio
// turns the draft's confidence into predicted acceptance.
struct BudgetAcceptanceModel {
  static constexpr int32_t kMaxRanks = 64;
  std::vector<Ewma> prob;
  std::vector<Ewma> present;
  Ewma predicted;  // sum of a tree's probabilities
  Ewma accepted;   // its accepted tokens
  Ewma drafted_accepted;  // accepted tokens of the trees with at least one node
  // One verified tree drafted with node budget `budget`: its nodes' probabilities, largest
  // first, and the number of tokens the LLM accepted.
  void Observe(int32_t budget, std::span<const float> sorted_probs, int32_t accepted_tokens,
               double alpha);
};

// t(T): seconds of an LLM pass by its tokens. Two sources: a calibration curve (a few passes
// timed once) and online passes (an EWMA per token count; once a count has a few observations,
// one far off, a stall of the shared machine, moves it by at most a factor of 2). Counts seen
// online at least twice use their own value; the others the calibration curve times the load
// factor (EWMA of online / calibrated seconds), so both sources agree under a changing load.
class PassCostModel {
 public:
  void Observe(double tokens, double seconds);
  // Sets the calibration curve's value for `tokens` (replacing an earlier one).
  void Set(double tokens, double seconds);
  // Predicted seconds for `tokens`; interpolates between known counts (made non-decreasing),
  // extrapolates past the largest with the slope of the known range (never below flat). 0 when
  // nothing is known.
  double Predict(double tokens) const;
  bool empty() const { return table_.empty() && calibration_.empty(); }
  double load_factor() const { return load_.count > 0 ? load_.value : 1; }

 private:
  static int32_t Bucket(double tokens);
  static double Interpolate(const std::map<int32_t, double>& points, double x);
  std::map<int32_t, Ewma> table_;           // bucket (token count) -> seconds, online
  std::map<int32_t, double> calibration_;  // token count -> seconds
  Ewma load_;                               // online / calibrated seconds
  // The curve Predict interpolates, rebuilt after a change (the controller predicts hundreds of
  // times a step: rebuilding it each time cost a 64-sequence step 0.2 ms).
  void Merge() const;
  mutable std::map<int32_t, double> merged_;
  mutable bool dirty_ = true;
};

// What the controller did lately, for /metrics and the benchmarks.
struct SpecControllerSnapshot {
  int64_t steps = 0;              // decode steps with speculating sequences planned by it
  int64_t speculating_steps = 0;  // of those, steps where some sequence got a depth > 0
  int64_t budget_tokens = 0;      // speculated tokens (upper bound) chosen at the last step
  double budget_tokens_mean = 0;  // EWMA of that
  double predicted_gain = 1;      // EWMA of predicted tok/s over plain decoding's, per step
  double measured_gain = 1;       // EWMA of measured tok/s over plain decoding's predicted
};

class SpecController {
 public:
  static constexpr int32_t kProbePeriod = 16;
  // A sequence with fewer own trees than this at depth 1 probes every kProbeEvery steps where
  // the base period applies (its first trees say little: one probe in 16 steps was too few to
  // bring back a draft that missed at first).
  static constexpr int64_t kYoungTrees = 8;
  static constexpr int32_t kProbeEvery = 4;  // steps per probe, at least, across the batch
  static constexpr double kProbeHit = 0.3;       // first-level hit rate below which probes thin
  static constexpr int64_t kMaxProbeBackoff = 16;  // out, down to 1/16 of the base rate
  static constexpr double kProbeShare = 0.005;  // of step time that probes may cost at most
  static constexpr double kProbeTokens = 2;     // pass tokens a probe adds, about
  static constexpr int64_t kMaxProbePeriod = 1024;  // steps; before the backoff
  static constexpr double kMinGain = 1.1;       // predicted tok/s over plain needed to speculate
  static constexpr double kSeqAlpha = 0.1;      // per-sequence acceptance
  static constexpr double kGlobalAlpha = 0.05;  // per-speculator-set acceptance
  static constexpr double kTimeAlpha = 0.2;     // step times
  static constexpr double kPriorWeight = 4;     // observations the global prior counts for
  static constexpr double kOwnWeight = 16;      // and a sequence's own at most
  static constexpr double kRealismAlpha = 0.1;   // realised / predicted tok/s of steps
  static constexpr int64_t kRealismSteps = 8;    // of each kind before Realism() applies
  static constexpr double kMinRealism = 0.25;
  static constexpr double kRealismDrift = 0.001;  // per plain step, back towards 1

  // One decoding sequence that may speculate this step.
  struct Candidate {
    const std::string* key = nullptr;        // its speculator set (e.g. "ngram|layers:4")
    const AcceptanceModel* own = nullptr;    // its own observations
    std::span<const int64_t> shape_nodes;    // nodes of its shape's full expansion per depth
    int32_t max_depth = 0;                   // deepest tree allowed now (0: cannot speculate)
    uint64_t id = 0;                         // staggers the probes across sequences
    // Dynamic trees (ChooseBudgets): its own observations by rank, and the largest budget.
    const BudgetAcceptanceModel* own_budget = nullptr;
    int32_t max_nodes = 0;
  };
  struct Choice {
    std::vector<int32_t> depth;  // per candidate: the depth cap (0: plain decoding)
    std::vector<int32_t> nodes;  // per candidate, dynamic trees: the node budget (0: plain)
    double predicted_gain = 1;   // predicted tok/s over plain decoding's
    double predicted_tokens = 0; // expected tokens emitted
    double predicted_seconds = 0;
    double plain_seconds = 0;    // predicted seconds of the plain step
    int64_t budget_tokens = 0;   // speculated tokens at most (full expansion to the caps)
    bool probed = false;         // a probe raised some candidate's depth or budget
  };

  // `other_tokens`: tokens of the pass besides the decoding sequences' (prefill chunks, and
  // roots of sequences that do not speculate). `max_tokens`: the pass's token budget.
  Choice Choose(std::span<const Candidate> candidates, int32_t decoding, int32_t other_tokens,
                int32_t max_tokens);

  // The same for dynamic trees: a node budget per candidate (Choice::nodes, at most its
  // max_nodes; Choice::depth its max_depth where the budget is positive, else 0).
  Choice ChooseBudgets(std::span<const Candidate> candidates, int32_t decoding,
                       int32_t other_tokens, int32_t max_tokens);

  // After a step planned by `choice` (null: one without decoding sequences that may
  // speculate): its pass held `tokens` tokens and took `pass_seconds`, the whole step (planning,
  // pass, verification, commit; drafts excluded) `step_seconds`, its drafts `draft_seconds`
  // (summed over sequences), and its `decoding` sequences emitted `emitted` tokens. The step's
  // time beyond the pass is the overhead, which the choice adds to every option alike.
  void ObserveStep(const Choice* choice, int32_t tokens, double pass_seconds, double step_seconds,
                   double draft_seconds, int64_t emitted, int32_t decoding);
  // A verified tree of a sequence of speculator set `key` (the global prior): drafted with depth
  // cap `cap` in `draft_seconds`, `nodes_at_depth[d - 1]` nodes at depth d, `accepted` accepted.
  // A negative `draft_seconds`: its drafting time is not a step's (the drafts ran the prompt or
  // the tokens of plain steps too, SpeculativeStep::TreeReport::draft_steady), so it is not
  // counted; its acceptance is.
  void ObserveTree(const std::string& key, int32_t cap, std::span<const int32_t> nodes_at_depth,
                   int32_t accepted, double draft_seconds);

  // A verified dynamic tree of a sequence of speculator set `key`: node budget `budget`, its
  // nodes' probabilities largest first, `accepted` accepted, drafted in `draft_seconds`
  // (negative: not counted, as in ObserveTree).
  void ObserveBudgetTree(const std::string& key, int32_t budget,
                         std::span<const float> sorted_probs, int32_t accepted,
                         double draft_seconds);

  // A calibration pass (engine/core_scheduler.h): `tokens` took `seconds`. The first of each
  // count replaces what was there (a warm-up's slow pass must not linger).
  void ObserveCalibration(int32_t tokens, double seconds) { cost_.Set(tokens, seconds); }

  // Whether the cost model was calibrated (CoreScheduler calibrates once per controller).
  bool calibrated() const { return calibrated_; }
  void set_calibrated() { calibrated_ = true; }

  const PassCostModel& cost() const { return cost_; }
  SpecControllerSnapshot Snapshot() const;

 private:
  // The plain step's choice, the start of Choose and ChooseBudgets: n candidates at depth 0,
  // `decoding` tokens emitted in the predicted time of `base_tokens` pass tokens.
  Choice PlainChoice(size_t n, int32_t decoding, double base_tokens) const;
  // predicted_gain: the choice's tok/s over the plain step's.
  static void SetPredictedGain(Choice& ch, int32_t decoding);
  // The greedy increments shared by Choose and ChooseBudgets: increment k (index k - 1) of
  // candidate i brings r[i][k - 1] expected tokens for m[i][k - 1] pass tokens and s[i] seconds
  // of drafting, and needs increment k - 1. Sets ch.predicted_tokens / _seconds and returns the
  // increments taken per candidate (the best prefix; none below kMinGain).
  std::vector<int32_t> Allocate(const std::vector<std::vector<double>>& r,
                                const std::vector<std::vector<double>>& m,
                                const std::vector<double>& s, double base_tokens,
                                int32_t max_tokens, Choice& ch) const;
  // The probe clock: whether candidate `c` probes at this choice, once per `period` choices
  // (ProbePeriod) times `backoff` (1..kMaxProbeBackoff, for a speculator set whose drafts fail:
  // ProbeBackoff), staggered across sequences by id.
  bool Probes(const Candidate& c, int64_t period, int64_t backoff) const {
    period *= backoff;
    return (choices_ + static_cast<int64_t>(c.id % static_cast<uint64_t>(period))) % period == 0;
  }
  // Choices between two probes of one of `n` candidates in a pass of `base_tokens` other tokens:
  // at least kProbePeriod, and kProbeEvery x n for a larger batch (one probe every kProbeEvery
  // steps on average; the speculator set's shared prior learns from every probe), and with
  // several candidates as many more as keep the probes' predicted pass time within kProbeShare
  // of the step's. In a compute-bound batch of 16 a probe's two tokens cost ~12% of a pass, and
  // one every 4 steps was the 1-3% that speculation lost there against plain decoding.
  int64_t ProbePeriod(size_t n, double base_tokens) const;
  // The period of a candidate with `seen` own trees: kProbeEvery while it has fewer than
  // kYoungTrees and `period` is the base one (a batch whose probes were made rarer to keep
  // within kProbeShare keeps its period).
  static int64_t YoungPeriod(int64_t period, int64_t seen) {
    return seen < kYoungTrees && period == kProbePeriod ? kProbeEvery : period;
  }
  // How much rarer probes of speculator set `key` are: kProbeHit over the share of its drafted
  // trees whose first level was accepted (for dynamic trees: accepted tokens per drafted tree;
  // a tree without nodes costs nothing and does not count), between 1 and
  // kMaxProbeBackoff. A draft that keeps failing (prompt lookup on free text) costs its batch
  // a probe's tokens for nothing; the probes that still come (and new sequences' own
  // observations) bring the rate back as soon as its drafts hit again.
  int64_t ProbeBackoff(const std::string& key, bool dynamic) const;

  // How far the model's predictions are borne out: realised tok/s of speculating steps over
  // their prediction, divided by the same ratio of plain steps, at most 1. Whatever the model
  // misses (a cost model that underrates tree tokens in a large batch, drafts that compete with
  // the LLM for the same cores, optimistic acceptance) shows up here, and the speculative
  // options' predicted tok/s are scaled by it.
  double Realism() const;

  PassCostModel cost_;
  Ewma spec_realised_, plain_realised_;
  int64_t choices_ = 0;  // Choose calls (the probe clock)
  Ewma overhead_;  // seconds of a step beyond its pass and drafts
  bool calibrated_ = false;
  std::map<std::string, AcceptanceModel> global_;
  std::map<std::string, Ewma> draft_level_seconds_;  // per speculator set
  std::map<std::string, BudgetAcceptanceModel> global_budget_;
  std::map<std::string, Ewma> draft_node_seconds_;   // per speculator set, dynamic trees
  mutable std::mutex mu_;  // guards snapshot_
  SpecControllerSnapshot snapshot_;
};

}  // namespace specinfer
