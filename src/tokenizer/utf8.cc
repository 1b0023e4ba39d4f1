#include "tokenizer/utf8.h"

#include <cstdint>

namespace specinfer {

int Utf8Classify(std::string_view s) {
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

}  // namespace specinfer
