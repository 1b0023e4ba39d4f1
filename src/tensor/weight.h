// A read-only weight matrix as the model holds it: row-major, `rows` rows of `cols` elements of
// one DType. The bytes live in the model file's mapping (or an owned buffer); a WeightMatrix does
// not own them.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace specinfer {

struct WeightMatrix {
  DType type = DType::kF32;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features
  const void* data = nullptr;  // [rows, RowBytes(type, cols)]

  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * RowBytes(type, cols);
  }
  bool empty() const { return data == nullptr; }
};

// A weight vector (norm gains, biases): always float32 after loading.
struct WeightVector {
  const float* data = nullptr;  // [size]
  int64_t size = 0;
};

}  // namespace specinfer
