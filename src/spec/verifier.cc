#include "spec/verifier.h"

namespace specinfer {

namespace {

std::span<const float> Row(std::span<const float> logits, int32_t vocab, int32_t v) {
  return logits.subspan(static_cast<size_t>(v) * vocab, static_cast<size_t>(vocab));
}

// Divides p by its sum; returns false (leaving p alone) if nothing is left.
bool Normalise(std::vector<float>& p) {
  double sum = 0;
  for (float x : p) sum += x;
  if (!(sum > 0)) return false;
  const float inv = static_cast<float>(1.0 / sum);
  for (float& x : p) x *= inv;
  return true;
}

}  // namespace

VerifyOutcome VerifyGreedy(const TokenTree& tree, std::span<const float> logits, int32_t vocab) {
  VerifyOutcome out;
  int32_t v = 0;
  for (;;) {
    const int32_t target = Argmax(Row(logits, vocab, v));
    const int32_t child = tree.FindChild(v, target);
    if (child < 0) {
      out.next_token = target;
      return out;
    }
    out.accepted.push_back(child);
    v = child;
  }
}

VerifyOutcome VerifyStochastic(const TokenTree& tree, std::span<const float> logits,
                               int32_t vocab, const SamplingParams& params, Rng& rng) {
  VerifyOutcome out;
  std::vector<float> p, before;
  int32_t v = 0;
  for (;;) {
    ComputeProbs(Row(logits, vocab, v), params, p);
    int32_t accepted = -1;
    for (const DraftTrial& t : tree.node(v).trials) {
      const int32_t x = tree.node(t.child).token;
      if (t.dist < 0) {
        // Deterministic proposal: q is the point mass at x.
        if (rng.Uniform() < p[static_cast<size_t>(x)]) {
          accepted = t.child;
          break;
        }
        p[static_cast<size_t>(x)] = 0.0f;
        Normalise(p);  // cannot be empty: the rejection had probability 1 - p(x) > 0
      } else {
        std::span<const float> q = tree.distribution(t.dist);
        const float qx = q[static_cast<size_t>(x)], px = p[static_cast<size_t>(x)];
        // q(x) > 0 for anything drawn from q; min(1, p/0) would be 1.
        if (qx <= 0.0f || rng.Uniform() * qx < px) {
          accepted = t.child;
          break;
        }
        before = p;
        for (int32_t i = 0; i < vocab; ++i) p[i] = std::max(0.0f, p[i] - q[i]);
        // Nothing left means p <= q everywhere, i.e. p == q up to rounding, where a rejection
        // has probability ~0; keep p as it was rather than divide by zero.
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

VerifyOutcome Verify(const TokenTree& tree, std::span<const float> logits, int32_t vocab,
                     const SamplingParams& params, Rng& rng) {
  return params.greedy() ? VerifyGreedy(tree, logits, vocab)
                         : VerifyStochastic(tree, logits, vocab, params, rng);
}

}  // namespace specinfer
