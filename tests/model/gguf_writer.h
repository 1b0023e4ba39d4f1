// Test helper: a little-endian writer of GGUF v3 files, enough of the format for llama models
// with float32 tensors (or any ggml type given as raw bytes). Shared by the GGUF and Hugging Face
// loader tests and the CUDA backend's K-quant test.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specinfer {
namespace testing_gguf {

// Little-endian writer of GGUF v3 files (enough of the format for llama models).
class GgufWriter {
 public:
  void KvString(const std::string& k, const std::string& v) {
    Key(k);
    U32(8);
    Str(v);
    ++kvs_;
  }
  void KvU32(const std::string& k, uint32_t v) {
    Key(k);
    U32(4);
    U32(v);
    ++kvs_;
  }
  void KvU64(const std::string& k, uint64_t v) {
    Key(k);
    U32(10);
    Raw(&v, 8);
    ++kvs_;
  }
  void KvF32(const std::string& k, float v) {
    Key(k);
    U32(6);
    Raw(&v, 4);
    ++kvs_;
  }
  void KvI32Array(const std::string& k, const std::vector<int32_t>& v) {
    Key(k);
    U32(9);  // array
    U32(5);  // of int32
    const uint64_t n = v.size();
    Raw(&n, 8);
    Raw(v.data(), v.size() * sizeof(int32_t));
    ++kvs_;
  }
  // A float32 tensor with ggml dims (dims[0] innermost).
  void Tensor(const std::string& name, std::vector<int64_t> dims, const float* data) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    const uint8_t* p = reinterpret_cast<const uint8_t*>(data);
    tensors_.push_back({name, dims, 0, std::vector<uint8_t>(p, p + n * 4)});
  }
  // A tensor of ggml type `ggml_type` (e.g. 12 for Q4_K) whose bytes, in ggml's layout, the
  // caller provides.
  void TensorBytes(const std::string& name, std::vector<int64_t> dims, uint32_t ggml_type,
                   const uint8_t* data, size_t bytes) {
    tensors_.push_back({name, dims, ggml_type, std::vector<uint8_t>(data, data + bytes)});
  }
  std::string Finish() const {
    std::string out = "GGUF";
    auto u32 = [&](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
    auto u64 = [&](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
    u32(3);
    u64(tensors_.size());
    u64(kvs_);
    out += kv_bytes_;
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      u64(t.name.size());
      out += t.name;
      u32(static_cast<uint32_t>(t.dims.size()));
      for (int64_t d : t.dims) u64(static_cast<uint64_t>(d));
      u32(t.type);
      u64(offset);
      offset += (t.data.size() + 31) / 32 * 32;
    }
    out.resize((out.size() + 31) / 32 * 32, '\0');
    for (const auto& t : tensors_) {
      size_t start = out.size();
      out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
      out.resize(start + (t.data.size() + 31) / 32 * 32, '\0');
    }
    return out;
  }

 private:
  struct T {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type;              // ggml type id (0: F32)
    std::vector<uint8_t> data;  // the tensor's bytes
  };
  void Raw(const void* p, size_t n) { kv_bytes_.append(static_cast<const char*>(p), n); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void Str(const std::string& s) {
    uint64_t n = s.size();
    Raw(&n, 8);
    kv_bytes_ += s;
  }
  void Key(const std::string& k) { Str(k); }
  std::string kv_bytes_;
  uint64_t kvs_ = 0;
  std::vector<T> tensors_;
};

}  // namespace testing_gguf
using testing_gguf::GgufWriter;
}  // namespace specinfer
