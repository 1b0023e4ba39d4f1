// Fuzz target: a GGUF file (header, metadata, tensor infos and their offsets; model/gguf.h), then
// what the loader builds from it: the model (model/gguf_loader.h) and the tokenizer vocabulary.
// The input is an in-memory file opened by path, as the loader opens models (it keeps the
// mapping alive in the Model).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "fuzz_file.h"
#include "model/gguf.h"
#include "model/gguf_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  fuzz::FuzzFile input(data, size);
  if (!input.ok()) return 0;
  auto gguf = GgufFile::Open(input.path());
  if (!gguf.ok()) return 0;
  GgufFile& file = **gguf;
  for (const GgufKeyValue& kv : file.metadata()) (void)kv.value.ToString();
  for (const GgufTensor& t : file.tensors()) {
    (void)file.GetWeightMatrix(t.name);
    (void)file.GetF32Vector(t.name);
  }
  auto model = ModelFromGguf(file);
  if (model.ok()) (void)TokenizerFromGguf(file, (*model)->config().vocab_size);
  return 0;
}
