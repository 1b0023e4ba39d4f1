// Prompt lookup (n-gram) drafting: guesses that the text goes on as it did after an earlier
// occurrence of its last few tokens. Summaries, edits, code changes and answers that quote their
// input repeat long spans of the prompt, which this finds at no model cost.
#pragma once

#include <cstdint>
#include <span>

#include "spec/token_tree.h"

namespace specinfer {

// A tree rooted at tokens.back() from the continuations of earlier occurrences of the last
// n tokens (n from max_ngram down to 1; longer matches first, then the most recent first).
// Each continuation is inserted as a chain of deterministic proposals by `speculator`; a node at
// depth d - 1 takes at most shape.widths[d - 1] children, and no branch goes deeper than
// min(shape.depth(), max_depth), and the tree holds at most `max_nodes` nodes past the root (the
// first ones in that order). The root alone when nothing matches.
TokenTree PromptLookupTree(std::span<const int32_t> tokens, const TreeShape& shape,
                           int32_t max_depth, int32_t max_ngram, int32_t speculator,
                           int32_t max_nodes = TreeShape::kMaxNodes);

// Confidence of a prompt-lookup guess: prompt lookup has no distribution, so each token of a
// continuation found after a match of n tokens counts as a guess of conditional probability
// n / (n + 1) (1/2 for one matching token, 3/4 for three), a node's cumulative probability being
// the product along its path (the largest over the matches that reach it). Only the ranking and
// the controller's first guess use it; the controller rescales it by the acceptance it measures.
float PromptLookupConfidence(int32_t match_length);

// The dynamic tree of prompt lookup (spec/dynamic_tree.h): the continuations of up to 64
// matches (the order above), of which the `max_nodes` nodes of highest cumulative confidence are
// kept (shallower first, then in match order, among equals), no deeper than `max_depth`; any
// number of children per node. Deterministic proposals, each node recording its confidence.
TokenTree PromptLookupDynamicTree(std::span<const int32_t> tokens, int32_t max_depth,
                                  int32_t max_nodes, int32_t max_ngram, int32_t speculator);

}  // namespace specinfer
