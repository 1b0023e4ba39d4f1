#include "dist/model_identity.h"

#include <fmt/format.h>

namespace specinfer {
namespace {

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

std::string ModelShapeString(const ModelConfig& c) {
  return fmt::format("{} dim={} hidden={} layers={} heads={}/{} vocab={}", c.architecture, c.dim,
                     c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size);
}

}  // namespace specinfer
