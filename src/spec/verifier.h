// Token-tree verification (SpecInfer §4): given the LLM's logits at every node of a token tree
// (computed in one pass), choose the longest path the LLM accepts and the LLM's own next token.
//
// Greedy (VerifyGreedy, the paper's VerifyGreedy): from the root, follow the child whose token is
// the argmax of the LLM's logits at the current node; where no child matches, the argmax itself
// is the next token. The output is the incremental greedy output, token for token (the backend's
// batch-invariant kernels make the tree pass's logits bit-identical to incremental decoding's).
//
// Stochastic (VerifyStochastic, multi-step speculative sampling). At the current node v let p be
// the distribution the LLM samples from at v (sampler.h's ComputeProbs: temperature, top-k,
// top-p — the very function applied to the draft logits, so p and every q are the distributions
// actually sampled from). Try v's proposals (trials) in order:
//   - a proposal x drawn from a draft distribution q: accept with probability min(1, p(x)/q(x));
//     on rejection p <- normalise(max(0, p - q));
//   - a deterministic proposal x (top-k of a draft under greedy expansion, prompt lookup): that
//     is a draw from the point mass at x, so the same rule with q = delta_x: accept with
//     probability p(x); on rejection p <- normalise(p with p(x) set to 0);
// on acceptance move to the child and start again there with the LLM's fresh p; when every
// trial at a node is rejected (or the node is a leaf), draw the next token from what remains of p.
//
// Why this is lossless: one trial is standard speculative sampling. For a draw x ~ q accepted
// with probability min(1, p(x)/q(x)) and, on rejection, a draw from r = max(0, p - q) / Z,
//   P(out = y) = min(q(y), p(y)) + P(reject) * r(y),  P(reject) = sum_x max(0, q(x) - p(x)) = Z
//             = min(q(y), p(y)) + max(0, p(y) - q(y)) = p(y).
// Multi-step sampling replaces "a draw from r" by another trial targeting r with a fresh,
// independent proposal, which by the same identity yields exactly r; by induction over the
// trials the token chosen at the node has distribution p, whichever speculators proposed the
// trials and whatever their q. Proposals must be independent of one another given the context
// (i.i.d. draws, separate speculators, deterministic functions of the context); a child's
// subtree is drawn conditioned on the child only, so moving into it repeats the argument at the
// next position. Hence every generated token has the LLM's conditional distribution.
//
// The subtleties the published implementations got wrong, and what is done here instead:
//   - a top-k choice is not a sample from q: treating it as one (accepting with p(x)/q(x))
//     favours the draft's top tokens; here it is a deterministic proposal (q = delta_x);
//   - residuals are over the whole vocabulary, never truncated to a top-N;
//   - p and q are computed by the same function with the same temperature, top-k and top-p;
//   - several speculators' proposals at one node are trials in turn, each with its own q;
//   - no token of probability zero is ever emitted: a token with p(x) = 0 is never accepted; a
//     sampled proposal recorded with q(x) = 0 (or not finite) was not drawn from q, so its
//     trial is skipped (rejected, p unchanged) rather than accepted with p(x)/0; a residual that
//     is all zero (p == q up to rounding, a rejection of probability ~0) falls back to the LLM's
//     distribution at that trial; residuals are normalised in double, as rounding noise sums
//     below 1 / FLT_MAX.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sampling/dist_rows.h"
#include "sampling/sampler.h"
#include "spec/token_tree.h"

namespace specinfer {

struct VerifyOutcome {
  std::vector<int32_t> accepted;  // accepted nodes, root excluded, from depth 1 down
  int32_t next_token = -1;        // the LLM's own token after the last accepted node
};

// `logits` is [tree.size(), vocab]: row v holds the LLM's logits after reading the sequence up
// to and including node v.
VerifyOutcome VerifyGreedy(const TokenTree& tree, std::span<const float> logits, int32_t vocab);
// The same walk given only each node's argmax ([tree.size()]: what ModelRunner::ForwardArgmax
// brings back instead of the logits rows).
VerifyOutcome VerifyGreedy(const TokenTree& tree, std::span<const int32_t> argmax);

// Multi-step speculative sampling as described above; `params` must not be greedy.
VerifyOutcome VerifyStochastic(const TokenTree& tree, std::span<const float> logits,
                               int32_t vocab, const SamplingParams& params, Rng& rng);

// The same given the LLM's distributions themselves: node v's is row first + v of `dists`
// (computed where the logits are: ModelRunner::ForwardArgmax with ForwardBatch::dist_rows, under
// the request's sampling settings).
VerifyOutcome VerifyStochastic(const TokenTree& tree, const DistRows& dists, int32_t first,
                               Rng& rng);

// Greedy or stochastic, as `params` asks.
VerifyOutcome Verify(const TokenTree& tree, std::span<const float> logits, int32_t vocab,
                     const SamplingParams& params, Rng& rng);

}  // namespace specinfer
