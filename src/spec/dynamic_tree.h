// Dynamic token trees (EAGLE-2 / Sequoia style): a draft grows its tree where it is confident,
// instead of expanding a fixed shape ⟨k1..km⟩.
//
// Every node v carries its cumulative draft probability c(v) = the product of the draft's q along
// its path (TreeNode::prob). The tree grows best-first under a node budget: the next node added is
// the child, among those of nodes the draft has already run, with the highest c. Growth goes in
// rounds so that a model draft still runs one pass per round (the nodes added in a round are
// run together, with a tree mask, before their own children can be added): a round adds at most
// an even share of the budget left for the rounds left, and there are at most max_rounds rounds
// (max_rounds - 1 draft passes besides the one that gave the root's logits).
//
// What "the next child of v" is depends on the request (the same rule as static expansion,
// speculator.h ProposeChildren):
//   - greedy requests: v's next most probable token under the draft's softmax (a deterministic
//     proposal); its priority is c(v) * q_v(that token);
//   - sampled requests: a fresh draw x ~ q_v (q = ComputeProbs(logits, sampling), recorded with
//     the proposal for the verifier); its priority, fixed before the draw, is c(v) times the
//     largest q_v of a token v has no child for yet. A draw may repeat a child: another trial
//     of that node, no new node.
//
// Why multi-step speculative sampling stays exact (spec/verifier.h): the verifier needs, at every
// node, trials whose values follow their recorded q given everything that decided that they
// exist. Here whether v gets another draw is decided, before that draw, from earlier draws only
// (v's own earlier trials, and other nodes', which are independent of v's future draws), and
// nothing is ever removed afterwards: no trial is kept or dropped by its own value, so each is a
// genuine draw from its q (a stopping rule on the past, which the proof allows). Deterministic
// proposals are a function of the context and need nothing more. Depth and node limits are fixed
// before drafting.
//
// Thread safety: none needed (a function of its arguments).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "sampling/sampler.h"
#include "spec/token_tree.h"
#include "specinfer/status.h"

namespace specinfer {

struct DynamicTreeOptions {
  int32_t max_nodes = 0;      // nodes past the root (the step's token budget)
  int32_t max_depth = 0;      // no node deeper
  int32_t max_children = 8;   // trials per node at most (draws or next-best tokens)
  int32_t max_rounds = 0;     // rounds (draft passes + 1) at most; 0: max_depth
  float min_prob = 0;         // stop once the best remaining priority is below this
};

// Runs the draft on `nodes` of `tree` (new nodes of the last round, in order; the draft has run
// all their ancestors before) and writes their logits rows, [nodes.size(), vocab], to `logits`.
using DraftRunFn = std::function<Status(const TokenTree& tree, std::span<const int32_t> nodes,
                                        std::vector<float>& logits)>;

// Grows a tree rooted at `root_token` from the draft's logits after it, `root_logits` ([vocab]),
// as described above, proposals recorded for `speculator`. Errors of `run` pass through.
StatusOr<TokenTree> GrowDynamicTree(int32_t root_token, std::span<const float> root_logits,
                                    const DynamicTreeOptions& options,
                                    const SamplingParams& sampling, Rng& rng, int32_t speculator,
                                    const DraftRunFn& run);

}  // namespace specinfer
