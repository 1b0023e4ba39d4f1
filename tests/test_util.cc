#include "test_util.h"

#include <filesystem>

namespace specinfer::testing {

std::string SourcePath(const std::string& relative) {
  return std::string(SPECINFER_SOURCE_DIR) + "/" + relative;
}

std::string Stories260KModel() { return SourcePath("tests/data/stories260K/stories260K.bin"); }
std::string Stories260KTokenizer() { return SourcePath("tests/data/stories260K/tok512.bin"); }

static std::string FirstExisting(const std::string& a, const std::string& b) {
  if (std::filesystem::exists(a)) return a;
  if (std::filesystem::exists(b)) return b;
  return "";
}

std::string Llama2TokenizerBin() {
  return FirstExisting(SourcePath("tests/data/llama2-tokenizer/tokenizer.bin"),
                       SourcePath("../shared/models/llama2-tokenizer/tokenizer.bin"));
}
std::string Llama2TokenizerModel() {
  return FirstExisting(SourcePath("tests/data/llama2-tokenizer/tokenizer.model"),
                       SourcePath("../shared/models/llama2-tokenizer/tokenizer.model"));
}

}  // namespace specinfer::testing
