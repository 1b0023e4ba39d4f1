// Loader for llama2.c checkpoints (legacy version 0: a 7 x int32 header, then float32 arrays).
//
// The weights are used in place from a read-only mapping of the file. Every size in the header
// is validated against the file length before any pointer is formed, so a truncated file or a
// header with impossible sizes yields DataLoss, never an out-of-bounds read.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace specinfer {

StatusOr<std::unique_ptr<Model>> LoadLlama2cCheckpoint(const std::string& path);

}  // namespace specinfer
