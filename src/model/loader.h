// Opens a model file of any supported format, chosen by its content:
//   - GGUF (magic "GGUF"): llama and qwen2 architectures, F32/F16/BF16/Q8_0/Q4_0/Q4_1 weights,
//   - llama2.c checkpoints (legacy version 0, float32),
//   - Hugging Face model directories (config.json + safetensors): llama and qwen2, F32/F16/BF16.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

enum class ModelFormat { kLlama2c, kGguf, kHfDirectory };

// Detects the format from the first bytes of `path`; a directory holding config.json is a
// Hugging Face model directory.
StatusOr<ModelFormat> DetectModelFormat(const std::string& path);

StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path);

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelFormat format = ModelFormat::kLlama2c;
  std::string chat_template;  // the model's own Jinja template, if it ships one
};

// Loads a model and its tokenizer. `tokenizer_path` empty: the vocabulary inside the model file
// (GGUF), tokenizer.json inside a Hugging Face directory, or tokenizer.bin beside a llama2.c
// checkpoint (NotFound, saying so, if absent).
StatusOr<LoadedModel> LoadModelAndTokenizer(const std::string& model_path,
                                            const std::string& tokenizer_path);

}  // namespace specinfer
