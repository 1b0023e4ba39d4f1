// Builds a Model (and its tokenizer) from a GGUF file: Llama-family architectures ("llama",
// "qwen2"), weights used in place from the mapping in whatever type they are stored (quantized
// weights stay quantized), the vocabulary from the tokenizer.ggml.* metadata.
#pragma once

#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

// Reads the configuration and maps the weights. The Model keeps the file's mapping alive, so
// `gguf` may be destroyed afterwards (it is left without its mapping).
StatusOr<std::unique_ptr<Model>> ModelFromGguf(GgufFile& gguf);

// The tokenizer described by tokenizer.ggml.* ("gpt2": byte-level BPE; "llama": SentencePiece
// BPE with byte fallback). `vocab_size` is the model's, which the vocabulary must match.
StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufFile& gguf, int32_t vocab_size);

}  // namespace specinfer
