#include "tokenizer/tokenizer.h"

#include <cstdint>

namespace specinfer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Classifies the bytes at the start of `s` (non-empty) by Unicode's Table 3-7 of well-formed
// UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF):
//   n > 0: a complete, valid sequence of n bytes;
//   0:     a valid but incomplete sequence that runs to the end of `s` (more bytes may come);
//   -n:    invalid; the first n bytes are a "maximal subpart" (the longest prefix of a valid
//          sequence, or 1 byte) to be replaced by ONE U+FFFD. This is the substitution practice
//          the Unicode Standard recommends (3.9, U+FFFD Substitution of Maximal Subparts) and
//          that WHATWG/Python decoders follow: e.g. E4 B8 41 -> U+FFFD 'A'; ED A0 80 (a
//          surrogate) -> three U+FFFD, since ED A0 is no prefix of any valid sequence.
int Classify(std::string_view s) {
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return -1;  // 80..C1 (continuation or overlong lead), F5..FF
  }
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= s.size()) return 0;
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < lo || c > hi) return -i;
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

}  // namespace

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  int32_t prev = -1;
  for (const int32_t id : ids) {
    out += TokenBytes(prev, id);
    prev = id;
  }
  return out;
}

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  out.reserve(pending_.size());
  const std::string_view view(pending_);
  size_t i = 0;
  while (i < view.size()) {
    const int n = Classify(view.substr(i));
    if (n == 0) break;  // incomplete: hold back for the next Push
    if (n > 0) {
      out.append(view.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += -n;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8StreamDecoder::Flush() {
  std::string out = Push("");
  // What is left is one incomplete (but so far valid) sequence: one maximal subpart.
  if (!pending_.empty()) out.append(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace specinfer
