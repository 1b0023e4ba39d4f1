// Fuzz target: a Hugging Face tokenizer.json (byte-level BPE; tokenizer/bpe_tokenizer.h), then
// encoding and decoding a fixed text with the tokenizer it describes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto vocab = BpeTokenizer::ParseTokenizerJson(json);
  if (!vocab.ok()) return 0;
  auto tok = BpeTokenizer::Create(std::move(*vocab));
  if (!tok.ok()) return 0;
  for (bool special : {false, true}) {
    auto ids =
        (*tok)->Encode("Hello <|im_start|>world's 123 \xff\xfe caf\xc3\xa9\n\n  x", true, special);
    if (!ids.ok()) continue;
    int32_t prev = -1;
    for (int32_t id : *ids) {
      (void)(*tok)->TokenBytes(prev, id);
      prev = id;
    }
  }
  return 0;
}
