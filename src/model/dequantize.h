// Float32 copies of models: every weight matrix dequantised to F32 (a reference mode: the same
// architecture and weights, without activation quantisation, so a forward pass can be compared
// with an independent float implementation to float precision).
#pragma once

#include <memory>

#include "specinfer/status.h"
#include "model/model.h"

namespace specinfer {

// A new Model with `m`'s configuration whose matrices are all F32 (and whose vectors are
// copied) in buffers the new Model owns: it does not depend on `m` after returning. A tied
// output matrix stays shared with the token embedding. InvalidArgument for a matrix type the
// CPU backend cannot read. Memory: 4 bytes per weight (SmolLM2-135M: ~540 MB).
StatusOr<std::unique_ptr<Model>> DequantizeToF32(const Model& m);

}  // namespace specinfer
