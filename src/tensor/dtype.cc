#include "tensor/dtype.h"

namespace specinfer {

const DTypeTraits& GetDTypeTraits(DType t) {
  static const DTypeTraits kTraits[] = {
      {"F32", 1, 4},          // kF32
      {"F16", 1, 2},          // kF16
      {"BF16", 1, 2},         // kBF16
      {"Q8_0", 32, 34},       // kQ8_0
      {"Q4_0", 32, 18},       // kQ4_0
      {"Q4_1", 32, 20},       // kQ4_1
      {"Q5_0", 32, 22},       // kQ5_0
      {"Q5_1", 32, 24},       // kQ5_1
      {"Q8_1", 32, 36},       // kQ8_1
      {"Q2_K", 256, 84},      // kQ2_K
      {"Q3_K", 256, 110},     // kQ3_K
      {"Q4_K", 256, 144},     // kQ4_K
      {"Q5_K", 256, 176},     // kQ5_K
      {"Q6_K", 256, 210},     // kQ6_K
      {"Q8_K", 256, 292},     // kQ8_K
  };
  static_assert(sizeof(kTraits) / sizeof(kTraits[0]) == static_cast<size_t>(DType::kCount));
  return kTraits[static_cast<size_t>(t)];
}

}  // namespace specinfer
