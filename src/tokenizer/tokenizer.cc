#include "tokenizer/tokenizer.h"

#include <cstdint>

#include "tokenizer/utf8.h"

namespace specinfer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void Mix(uint64_t& h, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
}

void MixInt(uint64_t& h, int64_t v) { Mix(h, &v, sizeof(v)); }

}  // namespace

uint64_t VocabFingerprint(const Tokenizer& tokenizer) {
  uint64_t h = kFnvOffset;
  MixInt(h, tokenizer.vocab_size());
  MixInt(h, tokenizer.bos_id());
  MixInt(h, tokenizer.eos_id());
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string_view piece = tokenizer.TokenPiece(id);
    MixInt(h, static_cast<int64_t>(piece.size()));
    Mix(h, piece.data(), piece.size());
  }
  return h;
}

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
    const int n = Utf8Classify(view.substr(i));
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
