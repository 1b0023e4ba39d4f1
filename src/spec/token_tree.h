// Token trees (SpecInfer §3): what speculators propose and the LLM verifies in one pass.
//
// Node 0 is the root: the sequence's last token, already chosen but not yet run through the
// LLM. Every other node is a guess at the token that follows its parent. A tree is built by
// *proposals*: speculator s proposes token x as a child of node v, either drawn from a draft
// distribution q (sampled expansion) or chosen deterministically (top-k of a draft model under
// greedy decoding, prompt lookup). Proposing a token a node already has as a child adds no node,
// only another proposal of it: the tree holds each distinct sequence once.
//
// Each node keeps its proposals in order ("trials"): that is the order in which multi-step
// speculative sampling tries them (see verifier.h), and it records, for every trial, the
// distribution it was really drawn from, which is what makes the verification exact.
//
// Merging (SpecInfer §3.2) adds every proposal of another tree, so the merged tree holds exactly
// the union of the input trees' sequences, shared prefixes once, with all their trials.
//
// A node may carry its proposer's confidence in it: the cumulative draft probability of its path
// (the product of q along it; spec/dynamic_tree.h, and a fixed per-match confidence for prompt
// lookup). It is the predicted acceptance the adaptive controller budgets trees with; it plays no
// part in verification.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "spec/spec_grammar.h"  // TreeShape
#include "specinfer/status.h"

namespace specinfer {

// KV blocks of `block_size` positions one sequence may need: a full `context` plus the largest
// token tree a pass appends after it. Sizes the LLM's cache and every model draft's.
inline int32_t KvBlocksPerSequence(int32_t context, int32_t block_size) {
  return static_cast<int32_t>((context + TreeShape::kMaxNodes + block_size) / block_size);
}

// One proposal of a child.
struct DraftTrial {
  int32_t child = 0;       // node index of the proposed token
  int32_t speculator = 0;  // index of the speculator that proposed it
  int32_t dist = -1;       // index of the draft distribution it was drawn from; -1: deterministic
};

struct TreeNode {
  int32_t token = 0;
  int32_t parent = -1;  // -1 for the root
  int32_t depth = 0;    // root 0
  uint64_t proposers = 0;          // bit s set: speculator s proposed this node
  float prob = 0;                  // cumulative draft probability (root 1; 0: unknown)
  std::vector<int32_t> children;   // distinct children, in order of first proposal
  std::vector<DraftTrial> trials;  // proposals of children, in the order verification tries them
};

class TokenTree {
 public:
  // Speculators one tree records (bits of TreeNode::proposers): the engine's draft limit.
  static constexpr int32_t kMaxSpeculators = kEngineLimits.max_drafts;
  static_assert(kMaxSpeculators <= 64);

  explicit TokenTree(int32_t root_token);

  int32_t size() const { return static_cast<int32_t>(nodes_.size()); }
  const TreeNode& node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
  int32_t root_token() const { return nodes_[0].token; }
  int32_t max_depth() const { return max_depth_; }

  // Records a proposal of `token` as a child of `parent` by `speculator`, drawn from draft
  // distribution `dist` (an index from AddDistribution) or deterministic (-1), with cumulative
  // draft probability `prob` (0: unknown; a node keeps the largest proposed). Returns the child's
  // node index (new, or the existing child with that token).
  int32_t Propose(int32_t parent, int32_t token, int32_t speculator, int32_t dist = -1,
                  float prob = 0);
  // Raises node's cumulative draft probability to `prob` if that is larger (no new trial).
  void RaiseProb(int32_t node, float prob);
  // The existing child of `parent` with `token`, or -1.
  int32_t FindChild(int32_t parent, int32_t token) const;

  // Stores a draft distribution over the whole vocabulary; returns its index.
  int32_t AddDistribution(std::vector<float> q);
  std::span<const float> distribution(int32_t i) const { return dists_[static_cast<size_t>(i)]; }

  // Adds every proposal of `other` (same root token, else InvalidArgument), in other's order,
  // after this tree's own.
  Status Merge(TokenTree&& other);

  // Depth-first layout for the LLM pass: order[i] is the node at layout position i (order[0] is
  // the root), parents[i] the layout position of its parent (-1 for the root). Ancestors always
  // come before descendants, so the layout's mask is TreeMask::FromParents(parents).
  void DepthFirstLayout(std::vector<int32_t>* order, std::vector<int32_t>* parents) const;

  // Tokens from the root's first child down to `node` (empty for the root).
  std::vector<int32_t> TokensTo(int32_t node) const;

  // Cumulative draft probabilities of the nodes past the root, largest first (what the adaptive
  // controller learns from, engine/spec_controller.h).
  std::vector<float> SortedProbs() const;

  // Every root-to-leaf token sequence (root excluded), in depth-first order. For tests and
  // debugging: two trees hold the same sequences iff these sets are equal.
  std::vector<std::vector<int32_t>> Sequences() const;

 private:
  std::vector<TreeNode> nodes_;
  std::vector<std::vector<float>> dists_;
  int32_t max_depth_ = 0;
};

}  // namespace specinfer
