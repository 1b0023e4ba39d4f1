// Llama models with random float32 weights of any shape, for benchmarks and tests that need a
// model of a realistic size without shipping one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/model.h"

namespace specinfer {

// Weights drawn from N(0, 0.02^2) (norm gains 1), seeded. The config must Validate().
StatusOr<std::unique_ptr<Model>> MakeRandomModel(const ModelConfig& config, uint64_t seed);

// Named shapes: "stories15M", "stories110M" (llama2.c's TinyStories models), "smollm2-135m".
StatusOr<ModelConfig> PresetConfig(const std::string& name);

}  // namespace specinfer
