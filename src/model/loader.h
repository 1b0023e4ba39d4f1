// Opens a model file of any supported format, chosen by its content:
//   - GGUF (magic "GGUF"),
//   - llama2.c checkpoints (legacy version 0, float32).
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace specinfer {

enum class ModelFormat { kLlama2c, kGguf };

// Detects the format from the first bytes of `path`.
StatusOr<ModelFormat> DetectModelFormat(const std::string& path);

StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path);

}  // namespace specinfer
