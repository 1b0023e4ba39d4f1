// Fuzz target: a safetensors file (8-byte header length, header JSON, tensor table and data
// offsets; model/safetensors.h), opened by path as the Hugging Face loader does.
#include <cstddef>
#include <cstdint>

#include "fuzz_file.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  fuzz::FuzzFile file(data, size);
  if (!file.ok()) return 0;
  auto st = SafetensorsFile::Open(file.path());
  if (!st.ok()) return 0;
  for (const SafetensorsTensor& t : (*st)->tensors()) {
    (void)t.num_elements();
    (void)(*st)->Get(t.name);
  }
  return 0;
}
