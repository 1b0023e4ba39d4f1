// What a worker serves, as checked when it registers with the request manager: a worker whose
// model or vocabulary (VocabFingerprint, tokenizer/tokenizer.h) differs from the deployment's is
// refused before it gets any traffic.
#pragma once

#include <cstdint>
#include <string>

#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

// A short, stable description of a model's shape (architecture, dims, layers, heads, vocab) for
// logs and registration checks, e.g. "llama dim=64 hidden=172 layers=5 heads=8/4 vocab=512".
std::string ModelShapeString(const ModelConfig& config);

}  // namespace specinfer
