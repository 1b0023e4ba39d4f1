#include "model/model_config.h"

#include <cmath>
#include <sstream>

namespace specinfer {

Status ModelConfig::Validate() const {
  auto bad = [](const std::string& what) {
    return DataLossError("model header has an impossible value: " + what);
  };
  // Generous upper bounds: anything beyond these is a corrupt header, not a model.
  constexpr int32_t kMaxDim = 1 << 16, kMaxLayers = 1024, kMaxHeads = 1024;
  constexpr int32_t kMaxVocab = 1 << 22, kMaxSeq = 1 << 24;
  if (dim <= 0 || dim > kMaxDim) return bad("dim=" + std::to_string(dim));
  if (hidden_dim <= 0 || hidden_dim > 8 * kMaxDim)
    return bad("hidden_dim=" + std::to_string(hidden_dim));
  if (n_layers <= 0 || n_layers > kMaxLayers) return bad("n_layers=" + std::to_string(n_layers));
  if (n_heads <= 0 || n_heads > kMaxHeads) return bad("n_heads=" + std::to_string(n_heads));
  if (n_kv_heads <= 0 || n_kv_heads > n_heads || n_heads % n_kv_heads != 0)
    return bad("n_kv_heads=" + std::to_string(n_kv_heads) + " with n_heads=" +
               std::to_string(n_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 1024)
    return bad("head_dim=" + std::to_string(head_dim));
  if (vocab_size <= 0 || vocab_size > kMaxVocab)
    return bad("vocab_size=" + std::to_string(vocab_size));
  if (max_seq_len <= 0 || max_seq_len > kMaxSeq)
    return bad("max_seq_len=" + std::to_string(max_seq_len));
  if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta))
    return bad("rope_theta=" + std::to_string(rope_theta));
  if (!(norm_eps > 0.0f) || norm_eps > 1.0f) return bad("norm_eps=" + std::to_string(norm_eps));
  return Status::Ok();
}

std::string ModelConfig::ToString() const {
  std::ostringstream s;
  s << architecture << ": dim=" << dim << " hidden=" << hidden_dim << " layers=" << n_layers
    << " heads=" << n_heads << " kv_heads=" << n_kv_heads << " head_dim=" << head_dim
    << " vocab=" << vocab_size << " ctx=" << max_seq_len << " rope_theta=" << rope_theta
    << (tied_output ? " tied" : "");
  return s.str();
}

}  // namespace specinfer
