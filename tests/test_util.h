// Helpers shared by the test binaries: where the test data lives.
#pragma once

#include <string>

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

}  // namespace specinfer::testing
