// Hyper-parameters of a Llama-family decoder, whatever file format they came from.
#pragma once

#include <cstdint>
#include <string>

#include "specinfer/status.h"

namespace specinfer {

// How rotary embedding pairs the elements of a head.
enum class RopeStyle : uint8_t {
  kInterleaved,  // pairs (2i, 2i+1): llama2.c checkpoints and GGUF "llama" (Q/K pre-permuted)
  kHalf,         // pairs (i, i + head_dim/2): Hugging Face checkpoints ("neox" style)
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
  bool attention_bias = false;  // q/k/v projections carry biases (Qwen2)

  int32_t kv_dim() const { return n_kv_heads * head_dim; }
  int32_t q_dim() const { return n_heads * head_dim; }

  // Checks that the sizes are positive, consistent (n_heads a multiple of n_kv_heads, even
  // head_dim...) and not absurd. InvalidArgument/DataLoss naming the offending field.
  Status Validate() const;

  std::string ToString() const;
};

}  // namespace specinfer
