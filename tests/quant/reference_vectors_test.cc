// The block routines against the Python gguf package (tests/reference/make_quant_vectors.py):
// to_float of every supported type, activation quantisation (Q8_0, Q8_1) and the fp16/bf16
// conversions must reproduce the reference bit for bit, with every kernel set.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include "backend/cpu/quants.h"
#include "model/gguf.h"
#include "quant_vectors.h"
#include "tensor/half.h"

namespace specinfer {
namespace {

using testing::AvailableIsas;
using testing::IsaName;
using testing::QuantVectors;

std::string ModelPath() { return testing::SourcePath("models/SmolLM2-135M-Instruct.Q4_1.gguf"); }

// Bitwise float comparison where any NaN matches any NaN. Reports the first mismatches.
void ExpectSameFloats(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same = (std::isnan(want[i]) && std::isnan(got[i])) ||
                      std::bit_cast<uint32_t>(want[i]) == std::bit_cast<uint32_t>(got[i]);
    if (!same && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size()
                    << " values differ; first at index " << first << ": got " << got[first]
                    << ", want " << want[first];
}

TEST(QuantReferenceTest, VectorsCoverEveryType) {
  QuantVectors v;
  if (!LoadQuantVectors(&v)) return;
  std::set<std::string> names;
  for (const auto& c : v.index["cases"]) names.insert(c["name"].get<std::string>());
  for (const char* want : {"random_F32", "random_F16", "random_BF16", "random_Q4_0", "random_Q4_1",
                           "random_Q5_0", "random_Q5_1", "random_Q8_0", "quantize_Q8_0",
                           "quantize_Q8_1", "f32_to_f16", "f32_to_bf16"}) {
    EXPECT_TRUE(names.count(want)) << want;
  }
}

TEST(QuantReferenceTest, ToFloatMatchesPythonGguf) {
  QuantVectors v;
  if (!LoadQuantVectors(&v)) return;
  int checked = 0;
  for (const auto& c : v.index["cases"]) {
    if (c["kind"] != "to_float") continue;
    const std::string name = c["name"];
    const std::optional<DType> t = DTypeFromGgmlType(c["ggml_type"].get<uint32_t>());
    ASSERT_TRUE(t.has_value()) << name;
    const int64_t n = c["n"];
    const std::vector<uint8_t> raw = v.Bytes(c, "raw");
    const std::vector<float> want = v.Array<float>(c, "expected");
    ASSERT_EQ(raw.size(), RowBytes(*t, n)) << name;
    ASSERT_EQ(want.size(), static_cast<size_t>(n)) << name;
    for (cpu::KernelIsa isa : AvailableIsas()) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(*t, isa);
      ASSERT_NE(ops, nullptr) << name;
      // Unaligned-by-design source: copy into a fresh buffer offset by 2 bytes (block alignment).
      std::vector<uint8_t> src(raw.size() + 2);
      std::memcpy(src.data() + (*t == DType::kF32 ? 0 : 2), raw.data(), raw.size());
      const void* p = src.data() + (*t == DType::kF32 ? 0 : 2);
      std::vector<float> got(n);
      ops->to_float(p, got.data(), n);
      ExpectSameFloats(got, want, name + " (" + IsaName(isa) + ")");
      ++checked;
    }
  }
  EXPECT_GE(checked, 14);
}

// The model rows in the vectors are the bytes our GGUF reader finds for those tensors, and
// dequantising them straight from the mapping gives the reference values.
TEST(QuantReferenceTest, ModelTensorRowsMatchPythonGguf) {
  const std::string path = ModelPath();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not present: " << path;
  QuantVectors v;
  if (!LoadQuantVectors(&v)) return;
  StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  int checked = 0;
  for (const auto& c : v.index["cases"]) {
    if (c["kind"] != "to_float" || c["source"] != "model") continue;
    const std::string tensor = c["tensor"];
    const int64_t first = c["first_row"], rows = c["rows"], cols = c["cols"];
    const std::vector<uint8_t> raw = v.Bytes(c, "raw");
    const std::vector<float> want = v.Array<float>(c, "expected");
    const GgufTensor* t = (*f)->FindTensor(tensor);
    ASSERT_NE(t, nullptr) << tensor;
    ASSERT_TRUE(t->dtype.has_value());
    ASSERT_EQ(t->ggml_type, c["ggml_type"].get<uint32_t>()) << tensor;
    ASSERT_EQ(t->dims[0], cols) << tensor;
    const size_t row_bytes = RowBytes(*t->dtype, cols);
    ASSERT_EQ(row_bytes, c["row_bytes"].get<size_t>()) << tensor;
    const uint8_t* p = static_cast<const uint8_t*>(t->data) + first * row_bytes;
    ASSERT_EQ(std::memcmp(p, raw.data(), raw.size()), 0)
        << tensor << ": the model file differs from the one the vectors were made from";
    for (cpu::KernelIsa isa : AvailableIsas()) {
      std::vector<float> got(rows * cols);
      cpu::GetTypeOpsForIsa(*t->dtype, isa)->to_float(p, got.data(), rows * cols);
      ExpectSameFloats(got, want, tensor + " (" + IsaName(isa) + ")");
      ++checked;
    }
  }
  EXPECT_GE(checked, 6);
}

TEST(QuantReferenceTest, ActivationQuantizationMatchesPythonGguf) {
  QuantVectors v;
  if (!LoadQuantVectors(&v)) return;
  int checked = 0;
  for (const auto& c : v.index["cases"]) {
    if (c["kind"] != "quantize") continue;
    const std::string name = c["name"];
    const DType t = *DTypeFromGgmlType(c["ggml_type"].get<uint32_t>());
    const int64_t n = c["n"];
    const std::vector<float> x = v.Array<float>(c, "input");
    const std::vector<uint8_t> want = v.Bytes(c, "expected");
    ASSERT_EQ(want.size(), RowBytes(t, n)) << name;
    for (cpu::KernelIsa isa : AvailableIsas()) {
      const cpu::TypeOps* ops = cpu::GetTypeOpsForIsa(t, isa);
      ASSERT_NE(ops, nullptr);
      ASSERT_EQ(ops->vec_dot_type, t);
      std::vector<uint8_t> got(want.size(), 0xAB);
      ops->from_float(x.data(), got.data(), n);
      const int bs = GetDTypeTraits(t).block_bytes;
      for (size_t b = 0; b < want.size() / bs; ++b) {
        ASSERT_EQ(std::memcmp(got.data() + b * bs, want.data() + b * bs, bs), 0)
            << name << " (" << IsaName(isa) << "): block " << b << " differs";
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 2);
}

TEST(QuantReferenceTest, HalfConversionsMatchNumpy) {
  QuantVectors v;
  if (!LoadQuantVectors(&v)) return;
  for (const auto& c : v.index["cases"]) {
    const bool f16 = c["kind"] == "f32_to_f16", bf16 = c["kind"] == "f32_to_bf16";
    if (!f16 && !bf16) continue;
    const std::vector<float> x = v.Array<float>(c, "input");
    const std::vector<uint16_t> want = v.Array<uint16_t>(c, "expected");
    ASSERT_EQ(x.size(), want.size());
    ASSERT_GT(x.size(), 1000u);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t got = f16 ? Fp32ToFp16(x[i]) : Fp32ToBf16(x[i]);
      if (got != want[i] && bad++ < 5) {
        ADD_FAILURE() << c["kind"] << ": " << x[i] << " (0x" << std::hex
                      << std::bit_cast<uint32_t>(x[i]) << ") -> 0x" << got << ", want 0x" << want[i]
                      << std::dec;
      }
    }
    EXPECT_EQ(bad, 0) << c["kind"];
  }
}

}  // namespace
}  // namespace specinfer
