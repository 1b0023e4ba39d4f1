// Fuzz target: a cluster configuration (YAML; dist/cluster_config.h) parsed, validated and
// checked against this build.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dist/cluster_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  auto config =
      ParseClusterConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  if (config.ok()) (void)CheckClusterRunnable(*config);
  return 0;
}
