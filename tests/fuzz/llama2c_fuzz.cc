// Fuzz target: a llama2.c checkpoint (7 x int32 header, then the float32 weights whose sizes it
// implies; model/llama2c_loader.h), loaded by path.
#include <cstddef>
#include <cstdint>

#include "fuzz_file.h"
#include "model/llama2c_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specinfer::fuzz::FuzzFile file(data, size);
  if (file.ok()) (void)specinfer::LoadLlama2cCheckpoint(file.path());
  return 0;
}
