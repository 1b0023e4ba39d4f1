// Opens a model file of any supported format, chosen by its content:
//   - GGUF (magic "GGUF"): llama and qwen2 architectures, F32/F16/BF16/Q8_0/Q4_0/Q4_1 weights,
//   - llama2.c checkpoints (legacy version 0, float32),
//   - Hugging Face model directories (config.json + safetensors): llama and qwen2, F32/F16/BF16.
#pragma once

#include <functional>
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

// How a process that serves a model prepares it (LoadModelForServing).
struct ServingLoadOptions {
  std::string tokenizer_path;  // as LoadModelAndTokenizer
  // True: a model whose tokenizer cannot be loaded (a llama2.c draft without tokenizer.bin) is
  // loaded alone, LoadedModel::tokenizer null. False: that is an error.
  bool tokenizer_optional = false;
  // Serve with a context this short (saves KV memory); 0, or longer than the model's own: the
  // model's own (a model is not served beyond what it was trained for). Negative: InvalidArgument.
  int32_t context_length = 0;
  // Page every weight in now, reporting the fraction (0..1) to `progress` if set, so that the
  // first requests do not wait for the disk: for a process whose runner reads the whole model.
  // Off for a shard worker (it reads its part only) and for a remote runner's manager.
  bool prefault = false;
  std::function<void(double)> progress;
  // Converts every weight matrix to float32 (model/dequantize.h; 4 bytes per weight), after the
  // prefault.
  bool dequantize = false;
  // A draft model with its own vocabulary (ModelConfig::draft_token_ids) is refused unless this
  // says the model is loaded as a draft: as the LLM its output rows would be read as token ids.
  bool draft = false;
};

// Loads `model_path` and its tokenizer, then shortens the context, prefaults and dequantises as
// `options` say. Load errors pass through.
StatusOr<LoadedModel> LoadModelForServing(const std::string& model_path,
                                          const ServingLoadOptions& options);

}  // namespace specinfer
