#include "spec/ngram.h"

#include <algorithm>

namespace specinfer {

TokenTree PromptLookupTree(std::span<const int32_t> tokens, const TreeShape& shape,
                           int32_t max_depth, int32_t max_ngram, int32_t speculator) {
  TokenTree tree(tokens.back());
  const int64_t len = static_cast<int64_t>(tokens.size());
  const int32_t depth = std::min(shape.depth(), max_depth);
  if (depth <= 0 || len < 2) return tree;
  // Stop once the root is full and every branch has been tried at most this many times.
  int64_t leaves = 1;
  for (int32_t i = 0; i < depth; ++i) leaves = std::min<int64_t>(leaves * shape.widths[i], 64);
  int64_t inserted = 0;

  for (int32_t n = static_cast<int32_t>(std::min<int64_t>(max_ngram, len - 1)); n >= 1; --n) {
    const int32_t* suffix = tokens.data() + (len - n);
    // Candidate ends j (the match is tokens[j - n + 1 .. j]), most recent first; the suffix
    // itself (j = len - 1) is not a match.
    for (int64_t j = len - 2; j >= n - 1; --j) {
      if (tokens[j] != suffix[n - 1] ||
          !std::equal(suffix, suffix + n, tokens.data() + (j - n + 1)))
        continue;
      // Insert tokens[j + 1 ...] as a chain, within the shape's widths.
      int32_t v = 0;
      bool added = false;
      for (int32_t d = 0; d < depth && j + 1 + d < len; ++d) {
        const int32_t tok = tokens[j + 1 + d];
        int32_t child = tree.FindChild(v, tok);
        if (child < 0) {
          if (static_cast<int32_t>(tree.node(v).children.size()) >= shape.widths[d]) break;
          child = tree.Propose(v, tok, speculator);
          added = true;
        }
        v = child;
      }
      if (added && ++inserted >= leaves) return tree;
    }
  }
  return tree;
}

}  // namespace specinfer
