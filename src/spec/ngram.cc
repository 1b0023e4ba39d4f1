#include "spec/ngram.h"

#include <algorithm>
#include <cmath>

namespace specinfer {

namespace {

// Calls fn(n, j) for each earlier occurrence of the last n tokens ending at j (n from max_ngram
// down to 1, then the most recent first) until fn returns false.
template <typename Fn>
void ForEachMatch(std::span<const int32_t> tokens, int32_t max_ngram, Fn fn) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int32_t n = static_cast<int32_t>(std::min<int64_t>(max_ngram, len - 1)); n >= 1; --n) {
    const int32_t* suffix = tokens.data() + (len - n);
    // Candidate ends j (the match is tokens[j - n + 1 .. j]), most recent first; the suffix
    // itself (j = len - 1) is not a match.
    for (int64_t j = len - 2; j >= n - 1; --j) {
      if (tokens[j] != suffix[n - 1] ||
          !std::equal(suffix, suffix + n, tokens.data() + (j - n + 1)))
        continue;
      if (!fn(n, j)) return;
    }
  }
}

}  // namespace

float PromptLookupConfidence(int32_t match_length) {
  const float n = static_cast<float>(std::max(match_length, 1));
  return n / (n + 1);
}

TokenTree PromptLookupTree(std::span<const int32_t> tokens, const TreeShape& shape,
                           int32_t max_depth, int32_t max_ngram, int32_t speculator,
                           int32_t max_nodes) {
  TokenTree tree(tokens.back());
  const int64_t len = static_cast<int64_t>(tokens.size());
  const int32_t depth = std::min(shape.depth(), max_depth);
  if (depth <= 0 || len < 2 || max_nodes <= 0) return tree;
  // Stop once the root is full and every branch has been tried at most this many times.
  int64_t leaves = 1;
  for (int32_t i = 0; i < depth; ++i) leaves = std::min<int64_t>(leaves * shape.widths[i], 64);
  int64_t inserted = 0;
  ForEachMatch(tokens, max_ngram, [&](int32_t n, int64_t j) {
    // Insert tokens[j + 1 ...] as a chain, within the shape's widths and the node budget.
    const float c = PromptLookupConfidence(n);
    float prob = 1;
    int32_t v = 0;
    bool added = false;
    for (int32_t d = 0; d < depth && j + 1 + d < len; ++d) {
      const int32_t tok = tokens[j + 1 + d];
      prob *= c;
      int32_t child = tree.FindChild(v, tok);
      if (child < 0) {
        if (static_cast<int32_t>(tree.node(v).children.size()) >= shape.widths[d]) break;
        if (tree.size() - 1 >= max_nodes) return false;
        child = tree.Propose(v, tok, speculator, -1, prob);
        added = true;
      } else {
        tree.RaiseProb(child, prob);
      }
      v = child;
    }
    return !(added && ++inserted >= leaves);
  });
  return tree;
}

TokenTree PromptLookupDynamicTree(std::span<const int32_t> tokens, int32_t max_depth,
                                  int32_t max_nodes, int32_t max_ngram, int32_t speculator) {
  TokenTree tree(tokens.back());
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (max_depth <= 0 || len < 2 || max_nodes <= 0) return tree;
  // Every match's continuation, in a candidate tree that keeps each node's best confidence.
  TokenTree cand(tokens.back());
  int32_t matches = 0;
  ForEachMatch(tokens, max_ngram, [&](int32_t n, int64_t j) {
    const float c = PromptLookupConfidence(n);
    float prob = 1;
    int32_t v = 0;
    for (int32_t d = 0; d < max_depth && j + 1 + d < len; ++d) {
      prob *= c;
      v = cand.Propose(v, tokens[j + 1 + d], speculator, -1, prob);
    }
    return ++matches < 64;
  });
  // The max_nodes best: a node's confidence is at most its parent's, and shallower wins ties,
  // so the kept nodes are closed under parents.
  std::vector<int32_t> order;
  for (int32_t v = 1; v < cand.size(); ++v) order.push_back(v);
  auto better = [&](int32_t a, int32_t b) {
    const TreeNode &na = cand.node(a), &nb = cand.node(b);
    if (na.prob != nb.prob) return na.prob > nb.prob;
    if (na.depth != nb.depth) return na.depth < nb.depth;
    return a < b;
  };
  const size_t keep = std::min(order.size(), static_cast<size_t>(max_nodes));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    better);
  order.resize(keep);
  std::sort(order.begin(), order.end());  // parents before children
  std::vector<int32_t> image(static_cast<size_t>(cand.size()), -1);
  image[0] = 0;
  for (int32_t v : order) {
    const TreeNode& n = cand.node(v);
    const int32_t parent = image[static_cast<size_t>(n.parent)];
    if (parent < 0) continue;  // cannot happen (closed under parents); never a dangling node
    image[static_cast<size_t>(v)] = tree.Propose(parent, n.token, speculator, -1, n.prob);
  }
  return tree;
}

}  // namespace specinfer
