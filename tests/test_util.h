// Helpers shared by the test binaries: where the test data lives.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"

namespace specinfer::testing {

// Absolute path of a file under the repository (e.g. "tests/data/stories260K/stories260K.bin").
std::string SourcePath(const std::string& relative);

// Path of the stories260K checkpoint and tokenizer shipped under tests/data.
std::string Stories260KModel();
std::string Stories260KTokenizer();
// The Llama 2 32000-token tokenizer (../shared/models/llama2-tokenizer beside the checkout, or
// tests/data if copied there). Empty string if absent.
std::string Llama2TokenizerBin();
std::string Llama2TokenizerModel();

// The default model (SmolLM2-135M-Instruct Q4_1 GGUF, placed by scripts/fetch_model.sh), or an
// empty string when it is absent (tests that need it skip).
std::string DefaultModel();

// Decodes base64 (padding ignored) of little-endian float32 values, as the reference generators
// store logits.
std::vector<float> DecodeBase64Floats(std::string_view b64);

// A fresh, empty directory `name` under this process's scratch folder (in the system temp
// directory, removed when the test binary exits).
std::filesystem::path ScratchDir(const std::string& name);

// Writes `bytes` to `path`, creating its parent directories.
void WriteFile(const std::filesystem::path& path, const std::string& bytes);

// A GGUF draft model with its own vocabulary (spec/draft_vocab.h) made from the llama2.c
// checkpoint `llama2c_path` (float32, shared classifier): row r of its embedding is the
// checkpoint's row table[r] (zeros for -1, the "other tokens" row, and for ids the checkpoint
// lacks, so that bad tables can be written too), with
// `specinfer.draft_token_ids` = table and the same layers. So for a context of tokens in the
// table it computes the checkpoint's logits at those tokens. Written to `path`, with
// `specinfer.vocab_fingerprint` = `fingerprint` when given.
void WriteDraftVocabGguf(const std::string& llama2c_path, const std::vector<int32_t>& table,
                         const std::filesystem::path& path,
                         std::optional<uint64_t> fingerprint = std::nullopt);

// Runs `tokens` as the prompt of a fresh sequence in one pass (positions 0..n-1) and returns the
// logits of `rows` ([rows.size(), vocab], row-major); the sequence is removed afterwards. Test
// failures are reported through gtest; an empty vector comes back on error.
std::vector<float> PromptLogits(ModelRunner& runner, KvCacheManager& kv,
                                const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& rows);

// ModelRunner::ForwardArgmax's contract on `runner`: for a prompt of `tokens` (one pass, a tree
// over its last four tokens, positions by depth), the argmax rows (every row, in shuffled
// order) are the Argmax of the same rows' logits from Forward, and the logits rows asked
// for beside them are bit-identical to Forward's. Reports through gtest.
void ExpectArgmaxRowsMatchLogits(ModelRunner& runner, KvCacheManager& kv,
                                 const std::vector<int32_t>& tokens);

// The logits after the last of `tokens`, on a fresh single-threaded CPU runner for `model`.
std::vector<float> LastLogits(std::shared_ptr<const Model> model,
                              const std::vector<int32_t>& tokens);

}  // namespace specinfer::testing
