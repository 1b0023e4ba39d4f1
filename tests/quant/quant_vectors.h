// Loads the reference vectors made by tests/reference/make_quant_vectors.py (Python `gguf`
// package): tests/data/quant/index.json describes the cases, vectors.bin holds their arrays.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/quants.h"
#include "test_util.h"

namespace specinfer::testing {

struct QuantVectors {
  nlohmann::json index;
  std::string blob;

  // Bytes of array `field` ("raw", "expected", "input") of `c`.
  std::vector<uint8_t> Bytes(const nlohmann::json& c, const char* field) const {
    const size_t off = c.at(field).at("offset"), n = c.at(field).at("bytes");
    if (off > blob.size() || n > blob.size() - off) return {};
    return std::vector<uint8_t>(blob.begin() + off, blob.begin() + off + n);
  }
  template <typename T>
  std::vector<T> Array(const nlohmann::json& c, const char* field) const {
    std::vector<uint8_t> b = Bytes(c, field);
    std::vector<T> out(b.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), b.data(), out.size() * sizeof(T));
    return out;
  }
};

// Loads the vectors; fails the current test (and returns false) if they are missing.
inline bool LoadQuantVectors(QuantVectors* v) {
  std::ifstream idx(SourcePath("tests/data/quant/index.json"));
  std::ifstream bin(SourcePath("tests/data/quant/vectors.bin"), std::ios::binary);
  if (!idx || !bin) {
    ADD_FAILURE() << "tests/data/quant is missing; run tests/reference/make_quant_vectors.py";
    return false;
  }
  v->index = nlohmann::json::parse(idx);
  std::ostringstream ss;
  ss << bin.rdbuf();
  v->blob = ss.str();
  return true;
}

// Kernel sets this machine can run: scalar always, AVX2 when the CPU has it.
inline std::vector<cpu::KernelIsa> AvailableIsas() {
  std::vector<cpu::KernelIsa> isas = {cpu::KernelIsa::kScalar};
  if (cpu::GetTypeOpsForIsa(DType::kF32, cpu::KernelIsa::kAvx2) != nullptr) {
    isas.push_back(cpu::KernelIsa::kAvx2);
  }
  if (cpu::GetTypeOpsForIsa(DType::kF32, cpu::KernelIsa::kAvx512) != nullptr) {
    isas.push_back(cpu::KernelIsa::kAvx512);
  }
  return isas;
}

inline const char* IsaName(cpu::KernelIsa isa) {
  switch (isa) {
    case cpu::KernelIsa::kScalar: return "scalar";
    case cpu::KernelIsa::kAvx2: return "avx2";
    case cpu::KernelIsa::kAvx512: return "avx512";
  }
  return "?";
}

}  // namespace specinfer::testing
