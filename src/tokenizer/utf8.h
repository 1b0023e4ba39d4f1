// UTF-8 well-formedness, shared by the tokenizers and the stream decoder.
#pragma once

#include <cstddef>
#include <string_view>

namespace specinfer {

// Classifies the bytes at the start of `s` (non-empty) by Unicode's Table 3-7 of well-formed
// UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF):
//   n > 0: a complete, valid sequence of n bytes;
//   0:     a valid but incomplete sequence that runs to the end of `s` (more bytes may come);
//   -n:    invalid; the first n bytes are a "maximal subpart" (the longest prefix of a valid
//          sequence, or 1 byte) to be replaced by ONE U+FFFD. This is the substitution practice
//          the Unicode Standard recommends (3.9, U+FFFD Substitution of Maximal Subparts) and
//          that WHATWG/Python decoders follow: e.g. E4 B8 41 -> U+FFFD 'A'; ED A0 80 (a
//          surrogate) -> three U+FFFD, since ED A0 is no prefix of any valid sequence.
int Utf8Classify(std::string_view s);

// Length of the complete, valid UTF-8 sequence at the start of `s` (non-empty), or 0 if the
// bytes there are not one.
inline size_t ValidUtf8Length(std::string_view s) {
  const int n = Utf8Classify(s);
  return n > 0 ? static_cast<size_t>(n) : 0;
}

}  // namespace specinfer
