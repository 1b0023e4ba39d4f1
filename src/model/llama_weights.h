// The Llama weight layout read from a checkpoint by tensor name, written once for every format
// that names its tensors (GGUF: "blk.N.attn_q.weight", Hugging Face safetensors:
// "model.layers.N.self_attn.q_proj.weight"). Each format supplies its names and how it reads one
// matrix or vector (type and shape checks, in place or converted); the shapes asked for are those
// of model.h.
//
// Thread safety: a pure function of its arguments (the readers are called on the calling thread).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "model/model.h"
#include "model/model_config.h"
#include "specinfer/status.h"

namespace specinfer {

// One format's tensor names. Layer i's tensors are layer_prefix + i + "." + the layer name.
struct LlamaTensorNames {
  std::string_view token_embedding, final_norm, output;
  std::string_view layer_prefix;
  std::string_view attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down;
  // Read only when the config turns them on (qk_norm, post_norms); empty where a format has none.
  std::string_view q_norm = {}, k_norm = {}, post_attn_norm = {}, post_ffn_norm = {};
};

struct LlamaTensorReaders {
  // A [rows, cols] matrix named `name`.
  std::function<StatusOr<WeightMatrix>(const std::string& name, int64_t rows, int64_t cols)>
      matrix;
  // A [size] vector named `name`, as float32.
  std::function<StatusOr<WeightVector>(const std::string& name, int64_t size)> vector;
};

// Reads every weight of a Llama model with config `c`: the embedding, the final norm, the output
// matrix (the embedding when c.tied_output), and per layer the attention (with biases when
// c.attention_bias, q/k norms with c.qk_norm) and the feed-forward block (post-norms of both
// blocks with c.post_norms). The first reader error passes through.
StatusOr<ModelWeights> ReadLlamaWeights(const ModelConfig& c, const LlamaTensorNames& names,
                                        const LlamaTensorReaders& read);

}  // namespace specinfer
