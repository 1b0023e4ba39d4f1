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
// min(shape.depth(), max_depth). The root alone when nothing matches.
TokenTree PromptLookupTree(std::span<const int32_t> tokens, const TreeShape& shape,
                           int32_t max_depth, int32_t max_ngram, int32_t speculator);

}  // namespace specinfer
