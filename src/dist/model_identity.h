// What a worker serves, as checked when it registers with the request manager: a worker whose
// model or vocabulary differs from the deployment's is refused before it gets any traffic.
//
// The vocabulary fingerprint is a 64-bit FNV-1a hash over every token's piece in id order (each
// piece prefixed by its length, so "ab","c" and "a","bc" differ), plus the BOS and EOS ids. Two
// tokenizers with equal fingerprints map ids to the same text.
#pragma once

#include <cstdint>
#include <string>

#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

uint64_t VocabFingerprint(const Tokenizer& tokenizer);

// A short, stable description of a model's shape (architecture, dims, layers, heads, vocab) for
// logs and registration checks, e.g. "llama dim=64 hidden=172 layers=5 heads=8/4 vocab=512".
std::string ModelShapeString(const ModelConfig& config);

}  // namespace specinfer
