// Fuzz target: a llama2.c tokenizer file (tokenizer.bin / tok512.bin format;
// tokenizer/llama2c_tokenizer.h), then encoding and decoding a fixed text with it.
// Input: a little-endian int16, the vocabulary size the model expects, then the file.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_file.h"
#include "tokenizer/llama2c_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  if (size < 2) return 0;
  int16_t vocab;
  std::memcpy(&vocab, data, 2);
  fuzz::FuzzFile file(data + 2, size - 2);
  if (!file.ok()) return 0;
  auto tok = Llama2cTokenizer::Load(file.path(), vocab);
  if (!tok.ok()) return 0;
  for (bool special : {false, true}) {
    auto ids = (*tok)->Encode("Once upon a <s> time\xff\xc3 \xe2\x80\x87 </s>z", true, special);
    if (!ids.ok()) continue;
    int32_t prev = -1;
    for (int32_t id : *ids) {
      (void)(*tok)->TokenBytes(prev, id);
      (void)(*tok)->TokenPiece(id);
      prev = id;
    }
  }
  return 0;
}
