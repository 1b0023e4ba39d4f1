#include "dist/model_identity.h"

#include <fmt/format.h>

namespace specinfer {

std::string ModelShapeString(const ModelConfig& c) {
  return fmt::format("{} dim={} hidden={} layers={} heads={}/{} vocab={}", c.architecture, c.dim,
                     c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size);
}

}  // namespace specinfer
