// Random rows of every supported weight type (K-quants included), for the kernel tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/quants.h"
#include "tensor/dtype.h"
#include "tensor/half.h"

namespace specinfer::testing {

// The weight types the CPU backend supports.
inline const std::vector<DType>& SupportedWeightTypes() {
  static const std::vector<DType> kTypes = {DType::kF32,  DType::kF16,  DType::kBF16,
                                            DType::kQ8_0, DType::kQ8_1, DType::kQ4_0,
                                            DType::kQ4_1, DType::kQ5_0, DType::kQ5_1};
  return kTypes;
}

inline bool HasMinField(DType t) { return t == DType::kQ4_1 || t == DType::kQ5_1; }

inline void PutHalf(uint8_t* p, float v) {
  const uint16_t h = Fp32ToFp16(v);
  std::memcpy(p, &h, 2);
}

inline float GetHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// Byte offsets of the fp16 fields (d, dmin) of each K-quant block.
inline std::vector<size_t> HalfFields(DType t) {
  switch (t) {
    case DType::kQ2_K:
      return {80, 82};
    case DType::kQ3_K:
      return {108};
    case DType::kQ4_K:
    case DType::kQ5_K:
      return {0, 2};
    case DType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// n elements of K-quant type t: random quant bytes, d and dmin in +-[0.001, 0.05].
inline std::vector<uint8_t> RandomKRow(DType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(RowBytes(t, n));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  const size_t bb = GetDTypeTraits(t).block_bytes;
  for (size_t off = 0; off < row.size(); off += bb) {
    for (size_t f : HalfFields(t)) {
      testing::PutHalf(row.data() + off + f, scale(rng) * (byte(rng) < 32 ? -1.0f : 1.0f));
    }
  }
  return row;
}

// n elements of type t: Gaussian values for the float types; for block types random quant bytes
// with a scale d in +-[0.001, 0.05] and (Q4_1/Q5_1) a minimum m in [-0.5, 0.5].
// The K-quants (n a multiple of 256): RandomKRow.
inline std::vector<uint8_t> RandomRow(DType t, int64_t n, std::mt19937& rng) {
  if (!HalfFields(t).empty()) return RandomKRow(t, n, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> row(RowBytes(t, n));
  if (t == DType::kF32) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      std::memcpy(row.data() + 4 * i, &v, 4);
    }
    return row;
  }
  if (t == DType::kF16 || t == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      const uint16_t h = t == DType::kF16 ? Fp32ToFp16(v) : Fp32ToBf16(v);
      std::memcpy(row.data() + 2 * i, &h, 2);
    }
    return row;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.001f, 0.05f), minimum(-0.5f, 0.5f);
  const size_t bb = GetDTypeTraits(t).block_bytes;
  for (size_t off = 0; off < row.size(); off += bb) {
    PutHalf(row.data() + off, scale(rng) * (byte(rng) < 32 ? -1.0f : 1.0f));
    if (HasMinField(t)) PutHalf(row.data() + off + 2, minimum(rng));
  }
  return row;
}

// Activations: Gaussian with a per-32 scale between 0.01 and 10, plus a few outliers.
inline std::vector<float> RandomActivations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.01f, 10.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> x(n);
  float s = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) s = scale(rng);
    x[i] = normal(rng) * s * (pick(rng) == 0 ? 20.0f : 1.0f);
  }
  return x;
}

}  // namespace specinfer::testing
