// Builds a Model from a Hugging Face model directory: config.json plus model.safetensors (or the
// shards listed by model.safetensors.index.json).
//
// Supported: model_type "llama" and "qwen2" (q/k/v biases), F32/F16/BF16 weights. Matrices are
// used in place from the mappings in their stored type; norm gains and biases stored as F16/BF16
// are widened to F32 into buffers the Model owns. Hugging Face checkpoints rotate the halves of
// each head (pairs (i, i + head_dim/2)), so the config gets RopeStyle::kHalf and the Q/K weights
// are used as they are (no permutation, unlike GGUF "llama"). rope_scaling: null/"default",
// "linear" (factor) and "llama3" (factor, low/high_freq_factor, original_max_position_embeddings).
//
// Errors: NotFound for a missing config.json or weights file; InvalidArgument for a config key
// that is missing or of the wrong type; Unimplemented for an unsupported model_type, rope_scaling
// type (yarn, dynamic, longrope...),
// sliding window, activation or weight dtype; DataLoss for corrupt safetensors or tensors of the
// wrong shape. Every message names the file and the key or tensor.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"
#include "model/model_config.h"

namespace specinfer {

// Parses config.json's text (`where` names it in messages).
StatusOr<ModelConfig> ModelConfigFromHfJson(std::string_view json_text, const std::string& where);

// Loads `dir`. The Model's source() is `dir`; it keeps every mapping it points into alive.
StatusOr<std::unique_ptr<Model>> ModelFromHfDirectory(const std::string& dir);

// The chat template in `dir`/tokenizer_config.json ("chat_template" as a string, or the entry
// named "default" of a list of {name, template}); empty if there is none or the file is unusable
// (the tokenizer loader reports a malformed file).
std::string HfChatTemplate(const std::string& dir);

}  // namespace specinfer
