#include "spec/verifier.h"

#include <cmath>

namespace specinfer {

namespace {

std::span<const float> Row(std::span<const float> logits, int32_t vocab, int32_t v) {
  return logits.subspan(static_cast<size_t>(v) * vocab, static_cast<size_t>(vocab));
}

// Divides p by its sum; returns false (leaving p alone) if nothing is left or the sum is not
// finite. The scale stays in double: a residual of rounding noise (denormal differences p - q)
// sums to far below 1 / FLT_MAX, where a float scale is inf and would turn p into inf and NaN.
bool Normalise(std::vector<float>& p) {
  double sum = 0;
  for (float x : p) sum += x;
  if (!(sum > 0) || !std::isfinite(sum)) return false;
  const double inv = 1.0 / sum;
  for (float& x : p) x = static_cast<float>(x * inv);
  return true;
}

// A recorded draft probability x could have been drawn with.
bool ValidDraftProbability(float qx) { return qx > 0.0f && std::isfinite(qx); }

// The greedy walk, with `target(v)` the LLM's argmax at node v.
template <typename Target>
VerifyOutcome FollowArgmax(const TokenTree& tree, Target target) {
  VerifyOutcome out;
  int32_t v = 0;
  for (;;) {
    const int32_t t = target(v);
    const int32_t child = tree.FindChild(v, t);
    if (child < 0) {
      out.next_token = t;
      return out;
    }
    out.accepted.push_back(child);
    v = child;
  }
}

}  // namespace

VerifyOutcome VerifyGreedy(const TokenTree& tree, std::span<const float> logits, int32_t vocab) {
  return FollowArgmax(tree, [&](int32_t v) { return Argmax(Row(logits, vocab, v)); });
}

VerifyOutcome VerifyGreedy(const TokenTree& tree, std::span<const int32_t> argmax) {
  return FollowArgmax(tree, [&](int32_t v) { return argmax[static_cast<size_t>(v)]; });
}

namespace {

// Multi-step speculative sampling with `probs_at(v, p)` setting p to the LLM's distribution at
// node v.
template <typename ProbsAt>
VerifyOutcome SampleWalk(const TokenTree& tree, ProbsAt probs_at, Rng& rng) {
  VerifyOutcome out;
  std::vector<float> p, before;
  int32_t v = 0;
  for (;;) {
    probs_at(v, p);
    const auto vocab = static_cast<int32_t>(p.size());
    int32_t accepted = -1;
    for (const DraftTrial& t : tree.node(v).trials) {
      const int32_t x = tree.node(t.child).token;
      const float px = p[static_cast<size_t>(x)];
      // p(x) = 0 (outside the LLM's top-k/top-p, or removed by an earlier trial) never accepts:
      // Uniform() is >= 0, so neither comparison below can hold.
      if (t.dist < 0) {
        // Deterministic proposal: q is the point mass at x.
        if (rng.Uniform() < px) {
          accepted = t.child;
          break;
        }
        p[static_cast<size_t>(x)] = 0.0f;
        // Empty only if p was all on x up to rounding (and a rejection of ~0 probability
        // happened): keep p, whose only token is x, rather than sample from nothing.
        if (!Normalise(p)) p[static_cast<size_t>(x)] = px;
      } else {
        std::span<const float> q = tree.distribution(t.dist);
        const float qx = q[static_cast<size_t>(x)];
        // Anything drawn from q has 0 < q(x) < inf. A proposal recorded with q(x) = 0, inf or
        // NaN was not drawn from q: p(x)/q(x) would be inf or NaN, and the residual update
        // assumes a genuine draw. Skip the trial (rejected, p unchanged), which is as if it had
        // never been proposed, so the token still has the LLM's distribution.
        if (!ValidDraftProbability(qx)) continue;
        if (rng.Uniform() * qx < px) {
          accepted = t.child;
          break;
        }
        before = p;
        // q < 0 or NaN (a remote draft's garbage) counts as 0, so the residual stays inside
        // p's support.
        for (int32_t i = 0; i < vocab; ++i) p[i] = std::max(0.0f, p[i] - std::max(0.0f, q[i]));
        // Nothing left means p <= q everywhere, i.e. p == q up to rounding, where a rejection
        // has probability ~0: fall back to the LLM's distribution at this node as the earlier
        // trials left it (the LLM's own p at the first trial) rather than divide by zero.
        if (!Normalise(p)) p.swap(before);
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

}  // namespace

VerifyOutcome VerifyStochastic(const TokenTree& tree, std::span<const float> logits, int32_t vocab,
                               const SamplingParams& params, Rng& rng) {
  return SampleWalk(
      tree,
      [&](int32_t v, std::vector<float>& p) { ComputeProbs(Row(logits, vocab, v), params, p); },
      rng);
}

VerifyOutcome VerifyStochastic(const TokenTree& tree, const DistRows& dists, int32_t first,
                               Rng& rng) {
  return SampleWalk(
      tree, [&](int32_t v, std::vector<float>& p) { dists.Expand(first + v, p); }, rng);
}

VerifyOutcome Verify(const TokenTree& tree, std::span<const float> logits, int32_t vocab,
                     const SamplingParams& params, Rng& rng) {
  return params.greedy() ? VerifyGreedy(tree, logits, vocab)
                         : VerifyStochastic(tree, logits, vocab, params, rng);
}

}  // namespace specinfer
