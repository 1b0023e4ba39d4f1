// Hyper-parameters of a Llama-family decoder, whatever file format they came from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

// How rotary embedding pairs the elements of a head.
enum class RopeStyle : uint8_t {
  kInterleaved,  // pairs (2i, 2i+1): llama2.c checkpoints and GGUF "llama" (Q/K pre-permuted)
  kHalf,         // pairs (i, i + head_dim/2): Hugging Face checkpoints ("neox" style)
};

// RoPE frequency scaling (context extension) as declared by the checkpoint.
enum class RopeScalingType : uint8_t {
  kNone,    // plain RoPE
  kLinear,  // position interpolation: every inverse frequency divided by `factor`
  kLlama3,  // Llama 3.1/3.2: low frequencies divided by `factor`, high ones kept, smooth between
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;            // linear and llama3
  float low_freq_factor = 1.0f;   // llama3 only
  float high_freq_factor = 4.0f;  // llama3 only
  int32_t original_max_position_embeddings = 8192;  // llama3 only: pre-extension context

  // Checks the parameters the type uses (factor >= 1, positive values, low < high for llama3).
  // DataLoss naming the offending field, like ModelConfig::Validate.
  Status Validate() const;
  std::string ToString() const;
};

// The feed-forward block's gate activation: gate = act(x Wg^T) * (x Wu^T).
enum class FfnActivation : uint8_t {
  kSilu,      // SwiGLU (Llama, Qwen, Mistral)
  kGeluTanh,  // GeGLU with the tanh approximation of GELU (Gemma: gelu_pytorch_tanh)
};

struct ModelConfig {
  std::string architecture = "llama";
  int32_t dim = 0;         // hidden size
  int32_t hidden_dim = 0;  // feed-forward inner size
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;    // usually dim / n_heads
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;  // context length the model was trained for
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::kInterleaved;
  bool tied_output = true;  // output matrix is the token embedding
  // A draft model's own vocabulary (GGUF `specinfer.draft_token_ids`, spec/draft_vocab.h): row
  // r of its embedding and output is the LLM's token draft_token_ids[r] (-1: any other token).
  // Empty: rows are token ids, as in every ordinary model.
  std::vector<int32_t> draft_token_ids;
  // A draft model's record of the vocabulary it was made for (GGUF `specinfer.vocab_fingerprint`,
  // VocabFingerprint in tokenizer/tokenizer.h): it stands in for a tokenizer the file leaves out,
  // and a draft is refused for an LLM whose tokenizer has another fingerprint.
  std::optional<uint64_t> vocab_fingerprint;
  bool attention_bias = false;  // q/k/v projections carry biases (Qwen2)
  RopeScaling rope_scaling;     // from config.json's rope_scaling / GGUF rope.scaling.*
  // Per-pair divisors of the inverse frequencies (GGUF `rope_freqs.weight`, llama.cpp's
  // "freq_factors": theta_i = pos * base^(-2i/d) / rope_freq_factors[i]). Empty: none.
  // Applied on top of rope_scaling.
  std::vector<float> rope_freq_factors;

  // Switches of the Llama program for the other decoder families (all off: plain Llama).
  FfnActivation ffn_activation = FfnActivation::kSilu;
  // Token embeddings are multiplied by this (Gemma: sqrt(dim), rounded to float32).
  float embedding_scale = 1.0f;
  // Per-head RMSNorm of q and k (weights [head_dim] per layer) after the projections, before
  // RoPE (Qwen3, Gemma 3).
  bool qk_norm = false;
  // RMSNorm of the attention block's and the feed-forward block's outputs before each residual
  // add (Gemma 2/3: post_attention_norm, post_feedforward_norm).
  bool post_norms = false;
  // Attention scores are q.k * attention_scale; 0 means 1 / sqrt(head_dim).
  float attention_scale = 0.0f;
  // Soft-capping (Gemma 2): scores = cap * tanh(scores / cap), logits likewise. 0: none.
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // Sliding-window attention: layers with sliding_layers[i] != 0 see only the keys at positions
  // p with query_pos - p < sliding_window (Mistral: every layer; Gemma 2/3: interleaved with
  // global layers). Empty, or sliding_window 0: every layer is global.
  int32_t sliding_window = 0;
  std::vector<uint8_t> sliding_layers;  // [n_layers]
  // RoPE base of the sliding-window layers (Gemma 3's rope_local_base_freq), unscaled; 0: the
  // same frequencies as the global layers.
  float rope_theta_local = 0.0f;

  int32_t kv_dim() const { return n_kv_heads * head_dim; }
  int32_t q_dim() const { return n_heads * head_dim; }

  // Checks that the sizes are positive, consistent (n_heads a multiple of n_kv_heads, even
  // head_dim...) and not absurd. InvalidArgument/DataLoss naming the offending field.
  Status Validate() const;

  std::string ToString() const;

  bool IsSlidingLayer(int32_t layer) const {
    return sliding_window > 0 && layer >= 0 && static_cast<size_t>(layer) < sliding_layers.size() &&
           sliding_layers[layer] != 0;
  }
  float AttentionScale() const;
  // The names of the switches above that `c` turns on ("qk_norm", "post_norms", ...), for
  // backends that implement only the plain Llama program to refuse the model by name.
  std::vector<std::string> ExtendedFeatures() const;
};

// The head_dim / 2 rotary inverse frequencies of `c`, scaling included: the one place they are
// computed. Unscaled: 1.0f / powf(rope_theta, 2i / head_dim) in float (bit-identical to the
// reference llama2.c numbers); then rope_scaling (linear: / factor; llama3: transformers'
// _compute_llama3_parameters); then / rope_freq_factors[i] when present.
// Assumes c.Validate() passed (head_dim even and positive).
std::vector<float> RopeInvFrequencies(const ModelConfig& c);
// The inverse frequencies of the sliding-window layers: those of rope_theta_local without
// scaling, or RopeInvFrequencies(c) when rope_theta_local is 0.
std::vector<float> RopeInvFrequenciesLocal(const ModelConfig& c);

}  // namespace specinfer
