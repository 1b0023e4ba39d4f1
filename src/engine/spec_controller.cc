#include "engine/spec_controller.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include <spdlog/spdlog.h>

namespace specinfer {

bool ParseSpecBudgetMode(std::string_view text, SpecBudgetMode* mode) {
  if (text == "auto") *mode = SpecBudgetMode::kAuto;
  else if (text == "static") *mode = SpecBudgetMode::kStatic;
  else if (text == "dynamic") *mode = SpecBudgetMode::kDynamic;
  else return false;
  return true;
}

const char* SpecBudgetModeName(SpecBudgetMode mode) {
  switch (mode) {
    case SpecBudgetMode::kAuto: return "auto";
    case SpecBudgetMode::kStatic: return "static";
    case SpecBudgetMode::kDynamic: return "dynamic";
  }
  return "auto";
}

void BudgetAcceptanceModel::Observe(int32_t budget, std::span<const float> sorted_probs,
                                    int32_t accepted_tokens, double alpha) {
  if (budget <= 0) return;
  const int32_t ranks = std::min(budget, kMaxRanks);
  if (prob.size() < static_cast<size_t>(ranks)) {
    prob.resize(static_cast<size_t>(ranks));
    present.resize(static_cast<size_t>(ranks));
  }
  double sum = 0;
  for (float p : sorted_probs) sum += p;
  for (int32_t k = 0; k < ranks; ++k) {
    const bool has = static_cast<size_t>(k) < sorted_probs.size();
    prob[static_cast<size_t>(k)].Average(has ? sorted_probs[static_cast<size_t>(k)] : 0.0, alpha);
    present[static_cast<size_t>(k)].Average(has ? 1.0 : 0.0, alpha);
  }
  predicted.Average(sum, alpha);
  accepted.Average(accepted_tokens, alpha);
  if (!sorted_probs.empty()) drafted_accepted.Average(accepted_tokens, alpha);
}

void AcceptanceModel::Observe(int32_t cap, std::span<const int32_t> nodes_at_depth,
                              int32_t accepted_tokens, double alpha) {
  if (cap <= 0) return;
  if (accepted.size() < static_cast<size_t>(cap)) {
    accepted.resize(static_cast<size_t>(cap));
    nodes.resize(static_cast<size_t>(cap));
  }
  for (int32_t d = 1; d <= cap; ++d) {
    const size_t i = static_cast<size_t>(d - 1);
    accepted[i].Average(accepted_tokens >= d ? 1.0 : 0.0, alpha);
    nodes[i].Average(i < nodes_at_depth.size() ? nodes_at_depth[i] : 0, alpha);
  }
  if (!nodes_at_depth.empty() && nodes_at_depth[0] > 0)
    drafted_hit.Average(accepted_tokens >= 1 ? 1.0 : 0.0, alpha);
}

int32_t PassCostModel::Bucket(double tokens) {
  const auto t = static_cast<int32_t>(std::lround(std::max(tokens, 1.0)));
  if (t <= 64) return t;
  if (t <= 256) return (t + 4) / 8 * 8;
  return (t + 16) / 32 * 32;
}

void PassCostModel::Observe(double tokens, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  if (!calibration_.empty()) {
    const double cal = Interpolate(calibration_, tokens);
    if (cal > 0) {
      const double ratio = std::clamp(seconds / cal, 0.2, 20.0);
      load_.Add(load_.count >= 2 ? std::clamp(ratio, 0.5 * load_.value, 2 * load_.value) : ratio,
                0.1);
    }
  }
  dirty_ = true;
  Ewma& e = table_[Bucket(tokens)];
  if (e.count >= 2) seconds = std::clamp(seconds, 0.5 * e.value, 2 * e.value);
  e.Add(seconds, 0.2);
}

void PassCostModel::Set(double tokens, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  calibration_[Bucket(tokens)] = seconds;
  dirty_ = true;
}

double PassCostModel::Interpolate(const std::map<int32_t, double>& points, double x) {
  if (points.empty()) return 0;
  x = std::max(x, 1.0);
  auto hi = points.lower_bound(static_cast<int32_t>(std::ceil(x)));
  if (hi == points.begin()) return hi->second;  // below every known count: flat
  auto lo = std::prev(hi);
  if (hi != points.end()) {
    const double x0 = lo->first, x1 = hi->first;
    return x1 > x0 ? lo->second + (hi->second - lo->second) * (x - x0) / (x1 - x0) : hi->second;
  }
  // Past the largest known count: the known range's slope (flat with one point, which is
  // optimistic, so the controller tries and measures the larger count).
  const auto first = points.begin();
  const double xl = lo->first, yl = lo->second;
  double slope = 0;
  if (lo != first && xl > first->first)
    slope = std::max(0.0, (yl - first->second) / (xl - first->first));
  return yl + slope * (x - xl);
}

double PassCostModel::Predict(double tokens) const {
  if (dirty_) Merge();
  return Interpolate(merged_, tokens);
}

void PassCostModel::Merge() const {
  std::map<int32_t, double>& points = merged_;
  points.clear();
  dirty_ = false;
  const double load = load_factor();
  for (const auto& [t, v] : calibration_) points[t] = v * load;
  for (const auto& [t, e] : table_)
    if (e.count >= 2 || calibration_.empty()) points[t] = e.value;
  // More tokens never cost less: counts measured under other conditions (a step of long
  // prefill contexts, a busy moment) must not make a larger pass look cheaper than a smaller
  // one (seen: 81 tokens predicted 3.6 ms faster than 61, so 20 speculated tokens looked free).
  double floor = 0;
  for (auto& [t, v] : points) floor = v = std::max(v, floor);
}

void SpecController::ObserveTree(const std::string& key, int32_t cap,
                                 std::span<const int32_t> nodes_at_depth, int32_t accepted,
                                 double draft_seconds) {
  if (cap <= 0) return;
  global_[key].Observe(cap, nodes_at_depth, accepted, kGlobalAlpha);
  if (draft_seconds >= 0) draft_level_seconds_[key].Add(draft_seconds / cap, kGlobalAlpha * 4);
}

std::vector<int32_t> SpecController::Allocate(const std::vector<std::vector<double>>& r,
                                              const std::vector<std::vector<double>>& m,
                                              const std::vector<double>& s, double base_tokens,
                                              int32_t max_tokens, Choice& ch) const {
  const size_t n = r.size();
  std::vector<int32_t> count(n, 0);
  if (cost_.empty()) return count;
  const double overhead = overhead_.value;
  // Greedy increments by gain per cost, keeping the best prefix.
  const double slope =
      std::max((cost_.Predict(base_tokens + 16) + overhead - ch.plain_seconds) / 16, 1e-7);
  struct Inc {
    double ratio;
    size_t i;
    int32_t d;
    bool operator<(const Inc& o) const { return ratio < o.ratio; }
  };
  // The pass's other tokens (prefill chunks, roots of sequences that do not speculate) are there
  // whatever the choice, and emit nothing counted here: the objective leaves their time out.
  // Otherwise a step carrying a long prefill chunk made extra tree tokens look cheap beside it
  // (measured: 20 speculated tokens beside a 138-token chunk, predicted 1.25x, brought none).
  const double others =
      std::max(cost_.Predict(base_tokens) - cost_.Predict(ch.predicted_tokens), 0.0);
  auto rate = [&](double toks, double seconds) {
    return seconds - others > 0 ? toks / (seconds - others) : 0;
  };
  std::priority_queue<Inc> heap;
  auto push = [&](size_t i, int32_t d) {
    if (d > static_cast<int32_t>(r[i].size())) return;
    const size_t k = static_cast<size_t>(d - 1);
    heap.push(Inc{r[i][k] / (m[i][k] * slope + s[i] + 1e-9), i, d});
  };
  for (size_t i = 0; i < n; ++i) push(i, 1);
  double tokens = ch.predicted_tokens, extra = 0, draft = 0;
  const double plain_rate = rate(tokens, ch.plain_seconds);
  const double realism = Realism();
  double best = plain_rate;
  std::vector<Inc> taken;
  size_t best_prefix = 0;
  double best_tokens = tokens, best_seconds = ch.plain_seconds;
  while (!heap.empty()) {
    const Inc inc = heap.top();
    heap.pop();
    const size_t k = static_cast<size_t>(inc.d - 1);
    if (base_tokens + extra + m[inc.i][k] > max_tokens) continue;
    tokens += r[inc.i][k];
    extra += m[inc.i][k];
    draft += s[inc.i];
    taken.push_back(inc);
    const double seconds = cost_.Predict(base_tokens + extra) + overhead + draft;
    const double tput = rate(tokens, seconds) * realism;
    spdlog::trace("  take {} d{}: {:.3f} tokens, T {:.2f}, {:.3f} ms, tput {:.3f} best {:.3f}",
                  inc.i, inc.d, tokens, base_tokens + extra, seconds * 1e3, tput, best);
    if (tput > best * (1 + 1e-9)) {
      best = tput;
      best_prefix = taken.size();
      best_tokens = tokens;
      best_seconds = seconds;
    }
    push(inc.i, inc.d + 1);
  }
  // The model is an estimate: speculate only for a clear predicted gain, so its errors do not
  // make speculation a loss (measured: the prediction ran 5-15% high on a busy CPU).
  if (plain_rate > 0 && best < kMinGain * plain_rate) {
    best_prefix = 0;
    best_tokens = ch.predicted_tokens;
    best_seconds = ch.plain_seconds;
  }
  for (size_t t = 0; t < best_prefix; ++t)
    count[taken[t].i] = std::max(count[taken[t].i], taken[t].d);
  ch.predicted_tokens = best_tokens;
  ch.predicted_seconds = best_seconds;
  return count;
}

double SpecController::Realism() const {
  if (spec_realised_.count < kRealismSteps) return 1;
  // Plain steps' own ratio once there are a few (a batch that always speculated has none).
  const double plain =
      plain_realised_.count >= kRealismSteps ? std::max(plain_realised_.value, 1e-3) : 1;
  return std::clamp(spec_realised_.value / plain, kMinRealism, 1.0);
}

void SpecController::ObserveBudgetTree(const std::string& key, int32_t budget,
                                       std::span<const float> sorted_probs, int32_t accepted,
                                       double draft_seconds) {
  if (budget <= 0) return;
  global_budget_[key].Observe(budget, sorted_probs, accepted, kGlobalAlpha);
  const double nodes = std::max<double>(static_cast<double>(sorted_probs.size()), 1);
  if (draft_seconds >= 0) draft_node_seconds_[key].Add(draft_seconds / nodes, kGlobalAlpha * 4);
}

int64_t SpecController::ProbePeriod(size_t n, double base_tokens) const {
  const auto candidates = static_cast<int64_t>(n);
  int64_t period = std::max<int64_t>(kProbePeriod, candidates * kProbeEvery);
  // A lone sequence keeps the base period: its probe is at most a few tokens every 16 steps,
  // and whether its drafts pay is what it has to find out (on a model whose passes are
  // compute-bound, a 2-token probe there was measured as no loss at concurrency 1).
  if (candidates <= 1) return period;
  const double step = cost_.Predict(base_tokens) + overhead_.value;
  if (step <= 0) return period;
  // A token's marginal pass time here, over 8 tokens (the cost model's points are per count).
  const double per_token =
      std::max(cost_.Predict(base_tokens + 8) - cost_.Predict(base_tokens), 0.0) / 8;
  // n candidates probing once per `period` steps add n * kProbeTokens * per_token / period.
  const double needed = static_cast<double>(candidates) * kProbeTokens * per_token /
                        (kProbeShare * step);
  if (needed > static_cast<double>(period))
    period = std::min<int64_t>(static_cast<int64_t>(std::ceil(needed)), kMaxProbePeriod);
  return std::max<int64_t>(period, 1);
}

int64_t SpecController::ProbeBackoff(const std::string& key, bool dynamic) const {
  // Only trees that drafted something count: a prompt lookup without a match proposes nothing
  // and costs nothing, so it is no reason to probe less (it was, and a sequence whose first
  // probes found no match stopped probing for good).
  const Ewma* h = nullptr;
  if (dynamic) {
    if (auto it = global_budget_.find(key); it != global_budget_.end())
      h = &it->second.drafted_accepted;
  } else if (auto it = global_.find(key); it != global_.end()) {
    h = &it->second.drafted_hit;
  }
  // Only after 2 x kYoungTrees drafted trees: four misses in a row, 6% likely for a draft
  // accepted half the time, thinned its probes 16-fold and it never came back in an answer.
  if (h == nullptr || h->count < 2 * kYoungTrees) return 1;
  const double hit = h->value;
  if (hit >= kProbeHit) return 1;
  return std::clamp<int64_t>(static_cast<int64_t>(kProbeHit / std::max(hit, 1e-3)), 1,
                             kMaxProbeBackoff);
}

SpecController::Choice SpecController::PlainChoice(size_t n, int32_t decoding,
                                                   double base_tokens) const {
  Choice ch;
  ch.depth.assign(n, 0);
  ch.plain_seconds = cost_.Predict(base_tokens) + overhead_.value;
  ch.predicted_seconds = ch.plain_seconds;
  ch.predicted_tokens = decoding;
  return ch;
}

void SpecController::SetPredictedGain(Choice& ch, int32_t decoding) {
  if (ch.plain_seconds > 0 && ch.predicted_seconds > 0 && decoding > 0) {
    ch.predicted_gain =
        (ch.predicted_tokens / ch.predicted_seconds) / (decoding / ch.plain_seconds);
  }
}

SpecController::Choice SpecController::ChooseBudgets(std::span<const Candidate> candidates,
                                                     int32_t decoding, int32_t other_tokens,
                                                     int32_t max_tokens) {
  const size_t n = candidates.size();
  const double base_tokens = std::max(decoding, 0) + std::max(other_tokens, 0);
  Choice ch = PlainChoice(n, decoding, base_tokens);
  ch.nodes.assign(n, 0);

  // Per candidate and rank k: r(k) = calibration * prob(k) (non-increasing), m(k) = P(k-th node
  // exists), s per node. Pseudo-counts as in Choose: an optimistic guess (0.6^k, every node
  // there, confidence taken at its word) once, the speculator set's up to kPriorWeight times, the
  // sequence's own up to kOwnWeight times.
  std::vector<std::vector<double>> r(n), m(n);
  std::vector<double> s(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Candidate& c = candidates[i];
    if (c.max_depth <= 0) continue;
    const BudgetAcceptanceModel* g = nullptr;
    if (auto it = global_budget_.find(*c.key); it != global_budget_.end()) g = &it->second;
    if (auto it = draft_node_seconds_.find(*c.key); it != draft_node_seconds_.end())
      s[i] = it->second.value;
    // Calibration: accepted tokens per unit of summed probability.
    double wsum = 1, csum = 1;
    auto add_calibration = [&](const BudgetAcceptanceModel* a, double cap) {
      if (a == nullptr || a->predicted.count == 0) return;
      const double w = std::min<double>(static_cast<double>(a->predicted.count), cap);
      wsum += w;
      csum += w * std::clamp(a->accepted.value / std::max(a->predicted.value, 1e-3), 0.0, 4.0);
    };
    add_calibration(g, kPriorWeight);
    add_calibration(c.own_budget, kOwnWeight);
    const double calibration = csum / wsum;
    double prev = 1;
    const int32_t ranks = std::min(c.max_nodes, BudgetAcceptanceModel::kMaxRanks);
    for (int32_t k = 1; k <= ranks; ++k) {
      const size_t j = static_cast<size_t>(k - 1);
      double w = 1, psum = std::pow(0.6, k), msum = 1;
      for (const auto& [a, cap] :
           {std::pair{g, kPriorWeight}, std::pair{c.own_budget, kOwnWeight}}) {
        if (a == nullptr || j >= a->prob.size() || a->prob[j].count == 0) continue;
        const double wa = std::min<double>(static_cast<double>(a->prob[j].count), cap);
        w += wa;
        psum += wa * a->prob[j].value;
        msum += wa * a->present[j].value;
      }
      const double rk = std::min(calibration * psum / w, prev);
      prev = rk;
      r[i].push_back(rk);
      m[i].push_back(std::clamp(msum / w, 0.0, 1.0));
    }
  }
  const std::vector<int32_t> taken = Allocate(r, m, s, base_tokens, max_tokens, ch);
  const int64_t period = ProbePeriod(n, base_tokens);
  for (size_t i = 0; i < n; ++i) {
    const Candidate& c = candidates[i];
    int32_t b = taken[i];
    // Probes: twice the budget (at least 2), now and then, staggered across sequences.
    if (Probes(c,
               YoungPeriod(period, c.own_budget != nullptr && !c.own_budget->prob.empty()
                                       ? c.own_budget->prob[0].count
                                       : 0),
               ProbeBackoff(*c.key, /*dynamic=*/true))) {
      b = std::max(2 * b, 2);
      ch.probed = true;
    }
    b = std::min(b, std::min(c.max_nodes, BudgetAcceptanceModel::kMaxRanks));
    if (c.max_depth <= 0) b = 0;
    ch.nodes[i] = b;
    ch.depth[i] = b > 0 ? c.max_depth : 0;
    ch.budget_tokens += b;
  }
  ++choices_;
  SetPredictedGain(ch, decoding);
  return ch;
}

SpecController::Choice SpecController::Choose(std::span<const Candidate> candidates,
                                              int32_t decoding, int32_t other_tokens,
                                              int32_t max_tokens) {
  const size_t n = candidates.size();
  const double base_tokens = std::max(decoding, 0) + std::max(other_tokens, 0);
  Choice ch = PlainChoice(n, decoding, base_tokens);

  // Per candidate: r(d) (made non-increasing: accepting d needs d - 1), m(d), s per level.
  std::vector<std::vector<double>> r(n), m(n);
  std::vector<double> s(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Candidate& c = candidates[i];
    const AcceptanceModel* g = nullptr;
    if (auto it = global_.find(*c.key); it != global_.end()) g = &it->second;
    if (auto it = draft_level_seconds_.find(*c.key); it != draft_level_seconds_.end())
      s[i] = it->second.value;
    double prev = 1;
    for (int32_t d = 1; d <= c.max_depth; ++d) {
      const size_t k = static_cast<size_t>(d - 1);
      const double shape_m = k < c.shape_nodes.size() ? static_cast<double>(c.shape_nodes[k]) : 1;
      // Pseudo-counts: an optimistic guess that makes new speculators try (0.6^d accepted, a
      // full level of nodes), the speculator set's measurements up to kPriorWeight times, the
      // sequence's own up to kOwnWeight times. The guess counts kPriorWeight + 1 times while
      // neither has measurements, fading to once as they gain kPriorWeight: a good draft whose
      // first two trees missed (an EWMA's first values are the observations themselves) was
      // taken for a failing one, and probes every kProbePeriod steps took hundreds of steps to
      // bring it back.
      int64_t seen = 0;
      for (const AcceptanceModel* a : {g, c.own})
        if (a != nullptr && k < a->accepted.size()) seen = std::max(seen, a->accepted[k].count);
      const double guess = 1 + std::max(kPriorWeight - static_cast<double>(seen), 0.0);
      double wsum = guess, rsum = guess * std::pow(0.6, d), msum = guess * shape_m;
      for (const auto& [a, cap] : {std::pair{g, kPriorWeight}, std::pair{c.own, kOwnWeight}}) {
        if (a == nullptr || k >= a->accepted.size() || a->accepted[k].count == 0) continue;
        const double w = std::min<double>(static_cast<double>(a->accepted[k].count), cap);
        wsum += w;
        rsum += w * a->accepted[k].value;
        msum += w * a->nodes[k].value;
      }
      double rd = rsum / wsum;
      const double md = msum / wsum;
      rd = std::min(rd, prev);
      prev = rd;
      r[i].push_back(rd);
      m[i].push_back(std::clamp(md, 0.0, shape_m));
    }
  }

  if (n > 0 && !r[0].empty())
    spdlog::trace("spec controller: r(1) {:.3f} m(1) {:.3f} s {:.6f}", r[0][0], m[0][0], s[0]);
  const std::vector<int32_t> taken = Allocate(r, m, s, base_tokens, max_tokens, ch);
  for (size_t i = 0; i < n; ++i) ch.depth[i] = taken[i];

  // Probes: one level deeper than chosen, now and then, staggered across sequences.
  const int64_t period = ProbePeriod(n, base_tokens);
  for (size_t i = 0; i < n; ++i) {
    const Candidate& c = candidates[i];
    const int64_t seen =
        c.own != nullptr && !c.own->accepted.empty() ? c.own->accepted[0].count : 0;
    if (ch.depth[i] < c.max_depth &&
        Probes(c, YoungPeriod(period, seen), ProbeBackoff(*c.key, /*dynamic=*/false))) {
      ++ch.depth[i];
      ch.probed = true;
    }
  }
  ++choices_;
  for (size_t i = 0; i < n; ++i)
    for (int32_t d = 1; d <= ch.depth[i]; ++d) {
      const size_t k = static_cast<size_t>(d - 1);
      ch.budget_tokens += k < candidates[i].shape_nodes.size() ? candidates[i].shape_nodes[k] : 0;
    }
  SetPredictedGain(ch, decoding);
  return ch;
}

void SpecController::ObserveStep(const Choice* choice, int32_t tokens, double pass_seconds,
                                 double step_seconds, double draft_seconds, int64_t emitted,
                                 int32_t decoding) {
  const double plain_step = choice != nullptr ? choice->plain_seconds : 0;
  spdlog::debug("spec controller: step of {} tokens: pass {:.2f} ms (predicted {:.2f}), step "
                "{:.2f} ms, {} emitted by {} decoding",
                tokens, pass_seconds * 1e3, cost_.Predict(tokens) * 1e3, step_seconds * 1e3,
                emitted, decoding);
  cost_.Observe(tokens, pass_seconds);
  overhead_.Add(std::max(step_seconds - pass_seconds, 0.0), 0.1);
  const double seconds = step_seconds;
  if (choice == nullptr) return;
  // How the step's realised tok/s compares with its prediction, for speculating steps (probes
  // aside: their extra tokens are not in the prediction) and plain ones (Realism).
  const double realised_rate = emitted / std::max(seconds + draft_seconds, 1e-9);
  const double predicted_rate =
      choice->predicted_tokens / std::max(choice->predicted_seconds, 1e-9);
  if (choice->predicted_seconds > 0 && choice->predicted_tokens > 0 && decoding > 0) {
    const double ratio = std::clamp(realised_rate / predicted_rate, 0.1, 10.0);
    if (choice->budget_tokens == 0) {
      plain_realised_.Add(ratio, kRealismAlpha);
      // Drift back towards trusting the model while nothing speculates, so that a penalty
      // earned under one load is retried under another.
      if (spec_realised_.count > 0) {
        const double plain = plain_realised_.count >= kRealismSteps ? plain_realised_.value : 1;
        spec_realised_.value += kRealismDrift * (plain - spec_realised_.value);
      }
    } else if (!choice->probed) {
      spec_realised_.Add(ratio, kRealismAlpha);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  SpecControllerSnapshot& s = snapshot_;
  constexpr double a = 0.05;
  const bool first = s.steps == 0;
  ++s.steps;
  if (choice->budget_tokens > 0) ++s.speculating_steps;
  s.budget_tokens = choice->budget_tokens;
  s.budget_tokens_mean = first ? static_cast<double>(choice->budget_tokens)
                               : s.budget_tokens_mean +
                                     a * (static_cast<double>(choice->budget_tokens) -
                                          s.budget_tokens_mean);
  s.predicted_gain = first ? choice->predicted_gain
                           : s.predicted_gain + a * (choice->predicted_gain - s.predicted_gain);
  const double total = seconds + draft_seconds;
  if (plain_step > 0 && total > 0 && decoding > 0) {
    const double measured = (static_cast<double>(emitted) / total) / (decoding / plain_step);
    s.measured_gain = s.steps == 1 ? measured : s.measured_gain + a * (measured - s.measured_gain);
  }
}

SpecControllerSnapshot SpecController::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

}  // namespace specinfer
