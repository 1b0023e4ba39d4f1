#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace specinfer {

namespace {

std::string Num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

Status RopeScaling::Validate() const {
  auto bad = [](const std::string& what) {
    return DataLossError("model header has an impossible value: rope_scaling." + what);
  };
  if (type == RopeScalingType::kNone) return Status::Ok();
  if (!std::isfinite(factor) || !(factor >= 1.0f) || factor > 1e6f)
    return bad("factor=" + Num(factor) + " (must be >= 1)");
  if (type == RopeScalingType::kLinear) return Status::Ok();
  if (!std::isfinite(low_freq_factor) || !(low_freq_factor > 0.0f))
    return bad("low_freq_factor=" + Num(low_freq_factor) + " (must be > 0)");
  if (!std::isfinite(high_freq_factor) || !(high_freq_factor > 0.0f))
    return bad("high_freq_factor=" + Num(high_freq_factor) + " (must be > 0)");
  if (!(low_freq_factor < high_freq_factor))
    return bad("low_freq_factor=" + Num(low_freq_factor) + " must be below high_freq_factor=" +
               Num(high_freq_factor));
  if (original_max_position_embeddings <= 0)
    return bad("original_max_position_embeddings=" +
               std::to_string(original_max_position_embeddings) + " (must be > 0)");
  return Status::Ok();
}

std::string RopeScaling::ToString() const {
  switch (type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear(factor=" + Num(factor) + ")";
    case RopeScalingType::kLlama3:
      return "llama3(factor=" + Num(factor) + " low=" + Num(low_freq_factor) +
             " high=" + Num(high_freq_factor) +
             " original_ctx=" + std::to_string(original_max_position_embeddings) + ")";
  }
  return "?";
}

std::vector<float> RopeInvFrequencies(const ModelConfig& c) {
  const int32_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(std::max<int32_t>(half, 0)));
  for (int32_t i = 0; i < half; ++i) {
    // Exactly the historical float formula: the llama2.c test vectors depend on it bit for bit.
    inv[i] = 1.0f / std::pow(c.rope_theta,
                             static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
  }
  const RopeScaling& r = c.rope_scaling;
  if (r.type == RopeScalingType::kLinear) {
    for (float& f : inv) f /= r.factor;  // transformers: inv_freq /= factor (float32)
  } else if (r.type == RopeScalingType::kLlama3) {
    // transformers' modeling_rope_utils._compute_llama3_parameters.
    constexpr double kPi = 3.14159265358979323846;
    const double factor = r.factor, low = r.low_freq_factor, high = r.high_freq_factor;
    const double old_ctx = r.original_max_position_embeddings;
    const double low_freq_wavelen = old_ctx / low;
    const double high_freq_wavelen = old_ctx / high;
    for (float& f : inv) {
      const double freq = f;
      const double wavelen = 2.0 * kPi / freq;
      double out;
      if (wavelen > low_freq_wavelen) {
        out = freq / factor;  // long wavelengths: interpolated
      } else if (wavelen < high_freq_wavelen) {
        out = freq;  // short wavelengths: untouched
      } else {
        const double smooth = (old_ctx / wavelen - low) / (high - low);
        out = (1.0 - smooth) * freq / factor + smooth * freq;
      }
      f = static_cast<float>(out);
    }
  }
  if (!c.rope_freq_factors.empty()) {
    for (int32_t i = 0; i < half && i < static_cast<int32_t>(c.rope_freq_factors.size()); ++i)
      inv[i] /= c.rope_freq_factors[i];
  }
  return inv;
}

std::vector<float> RopeInvFrequenciesLocal(const ModelConfig& c) {
  if (c.rope_theta_local == 0.0f) return RopeInvFrequencies(c);
  ModelConfig local;
  local.head_dim = c.head_dim;
  local.rope_theta = c.rope_theta_local;
  return RopeInvFrequencies(local);
}

float ModelConfig::AttentionScale() const {
  if (attention_scale != 0.0f) return attention_scale;
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}

std::vector<std::string> ModelConfig::ExtendedFeatures() const {
  std::vector<std::string> f;
  if (ffn_activation != FfnActivation::kSilu) f.push_back("gelu_tanh");
  if (embedding_scale != 1.0f) f.push_back("embedding_scale");
  if (qk_norm) f.push_back("qk_norm");
  if (post_norms) f.push_back("post_norms");
  if (attention_scale != 0.0f) f.push_back("attention_scale");
  if (attn_softcap != 0.0f || final_softcap != 0.0f) f.push_back("softcap");
  if (sliding_window > 0) f.push_back("sliding_window");
  if (rope_theta_local != 0.0f) f.push_back("rope_theta_local");
  return f;
}

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
  SI_RETURN_IF_ERROR(rope_scaling.Validate());
  if (!std::isfinite(embedding_scale) || !(embedding_scale > 0.0f))
    return bad("embedding_scale=" + Num(embedding_scale));
  if (!std::isfinite(attention_scale) || attention_scale < 0.0f)
    return bad("attention_scale=" + Num(attention_scale));
  if (!std::isfinite(attn_softcap) || attn_softcap < 0.0f || !std::isfinite(final_softcap) ||
      final_softcap < 0.0f)
    return bad("softcap " + Num(attn_softcap) + " / " + Num(final_softcap));
  if (sliding_window < 0) return bad("sliding_window=" + std::to_string(sliding_window));
  if (!sliding_layers.empty() && sliding_layers.size() != static_cast<size_t>(n_layers))
    return bad("sliding_layers has " + std::to_string(sliding_layers.size()) + " entries for " +
               std::to_string(n_layers) + " layers");
  if (!std::isfinite(rope_theta_local) || rope_theta_local < 0.0f)
    return bad("rope_theta_local=" + Num(rope_theta_local));
  if (!rope_freq_factors.empty()) {
    if (rope_freq_factors.size() != static_cast<size_t>(head_dim / 2))
      return bad("rope_freq_factors has " + std::to_string(rope_freq_factors.size()) +
                 " values, expected head_dim/2=" + std::to_string(head_dim / 2));
    for (size_t i = 0; i < rope_freq_factors.size(); ++i) {
      const float f = rope_freq_factors[i];
      if (!std::isfinite(f) || !(f > 0.0f))
        return bad("rope_freq_factors[" + std::to_string(i) + "]=" + Num(f) + " (must be > 0)");
    }
  }
  return Status::Ok();
}

std::string ModelConfig::ToString() const {
  std::ostringstream s;
  s << architecture << ": dim=" << dim << " hidden=" << hidden_dim << " layers=" << n_layers
    << " heads=" << n_heads << " kv_heads=" << n_kv_heads << " head_dim=" << head_dim
    << " vocab=" << vocab_size << " ctx=" << max_seq_len << " rope_theta=" << rope_theta
    << (rope_scaling.type != RopeScalingType::kNone ? " rope_scaling=" + rope_scaling.ToString()
                                                    : "")
    << (rope_freq_factors.empty() ? "" : " rope_freq_factors")
    << (tied_output ? " tied" : "");
  for (const std::string& f : ExtendedFeatures()) {
    s << " " << f;
    if (f == "sliding_window") s << "=" << sliding_window;
  }
  return s.str();
}

}  // namespace specinfer
