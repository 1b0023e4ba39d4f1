// Reader for GGUF model files (versions 2 and 3, little-endian), over a memory mapping.
//
// Layout (ggml docs/gguf.md): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count;
// kv_count metadata pairs (string key, u32 value type, value); tensor_count tensor infos
// (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset); padding up to
// `general.alignment` (default 32); the tensor data section. Strings are a u64 length and bytes.
// Arrays are a u32 element type, a u64 count and the elements (arrays may nest).
//
// Dimensions are in ggml order: dims[0] is the innermost, contiguous one. A 2-D tensor with
// dims [576, 1536] is 1536 rows of 576 elements: WeightMatrix{rows = 1536, cols = 576}.
//
// Open() validates the whole header up front: every length, count, dimension, type and offset
// is checked against the bytes actually present, so a truncated or hostile file yields a Status
// (InvalidArgument when it is not a GGUF file we read, DataLoss when it is corrupt) naming the
// file and the field, never a crash, and memory use is bounded by a small multiple of the file
// size. Tensor data is used in place, never copied.
//
// Lifetime: string_views, GgufValue contents and tensor data point into the mapping, which the
// GgufFile owns (or, after ReleaseMappedFile, the caller does).
// Thread safety: immutable after Open; all const methods may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mapped_file.h"
#include "specinfer/status.h"
#include "tensor/dtype.h"
#include "tensor/weight.h"

namespace specinfer {

// Metadata value types; the numbering is the file format's (gguf_type).
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view GgufTypeName(GgufType t);

// ggml tensor type ids as stored in GGUF tensor infos (enum ggml_type).
namespace ggml_type_id {
inline constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
                          kQ8_1 = 9, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
                          kQ8_K = 15, kBF16 = 30;
}  // namespace ggml_type_id

// Our DType for a ggml type id; nullopt for ids specinfer has no DType for (IQ*, I8..I64, F64,
// removed or unknown ids).
std::optional<DType> DTypeFromGgmlType(uint32_t ggml_type);
// ggml's name for a type id ("Q4_1", "IQ2_XXS", ...), or "unknown".
std::string_view GgmlTypeName(uint32_t ggml_type);

// One metadata value. Scalars are held by value; strings and array elements point into the file.
class GgufValue {
 public:
  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::kArray; }
  bool is_integer() const;  // one of the eight integer types
  bool is_float() const { return type_ == GgufType::kFloat32 || type_ == GgufType::kFloat64; }

  // Scalar access with coercion. Integers convert between widths and signedness when the value
  // fits (OutOfRange otherwise); float32 and float64 convert to each other. Any other type:
  // InvalidArgument.
  template <typename T>
  StatusOr<T> AsInt() const;
  StatusOr<double> AsF64() const;
  StatusOr<float> AsF32() const;
  StatusOr<bool> AsBool() const;
  StatusOr<std::string_view> AsString() const;

  // Arrays. element_type() and size() are meaningful for arrays only.
  GgufType element_type() const { return elem_type_; }
  size_t size() const { return static_cast<size_t>(count_); }
  // Elements of an array of strings.
  StatusOr<std::span<const std::string_view>> AsStringArray() const;
  // Elements of an array of integers (coerced as AsInt) or of floats.
  template <typename T>
  StatusOr<std::vector<T>> AsIntArray() const;
  StatusOr<std::vector<float>> AsF32Array() const;
  // Elements of an array of arrays.
  StatusOr<std::span<const GgufValue>> AsArrayOfArrays() const;

  // Short human-readable rendering ("576", "\"gpt2\"", "[STRING x 49152: \"<|endoftext|>\", ...]").
  std::string ToString(size_t max_items = 4) const;

 private:
  friend class GgufParser;

  Status WrongType(std::string_view wanted) const;
  // The integer value of a scalar integer (or of element i of an integer array) as
  // (is_negative, magnitude) so every source type compares exactly against every target type.
  std::pair<bool, uint64_t> IntegerParts(GgufType t, const uint8_t* p) const;
  const uint8_t* ScalarBytes() const { return scalar_bytes_.data(); }

  GgufType type_ = GgufType::kUint8;
  GgufType elem_type_ = GgufType::kUint8;  // arrays only
  std::array<uint8_t, 8> scalar_bytes_{};  // scalar numbers and bools, as stored
  std::string_view str_;                   // kString
  uint64_t count_ = 0;                     // arrays: number of elements
  const uint8_t* elems_ = nullptr;         // arrays of numbers/bools: raw elements
  std::vector<std::string_view> strings_;  // arrays of strings
  std::vector<GgufValue> arrays_;          // arrays of arrays
};

struct GgufKeyValue {
  std::string_view key;
  GgufValue value;
};

struct GgufTensor {
  std::string_view name;
  uint32_t ggml_type = 0;                   // as stored
  std::optional<DType> dtype;               // nullopt: a valid ggml type that specinfer cannot use
  uint32_t n_dims = 0;                      // 0..4
  std::array<int64_t, 4> dims{1, 1, 1, 1};  // ggml order: dims[0] innermost; unused dims are 1
  uint64_t offset = 0;                      // from the start of the data section
  const void* data = nullptr;               // in the mapping
  size_t bytes = 0;

  int64_t num_elements() const { return dims[0] * dims[1] * dims[2] * dims[3]; }
  std::string ShapeString() const;  // "[576, 1536]"
};

class GgufFile {
 public:
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a GGUF image already in memory. The caller keeps `data` alive and unchanged for the
  // GgufFile's lifetime; `name` stands for the file in messages.
  static StatusOr<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size,
                                                   std::string name);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the tensor data
  size_t file_size() const { return size_; }

  // Hands the mapping to the caller (e.g. Model::AdoptFile) so the weights can outlive this
  // object. Everything this GgufFile returns stays valid as long as the caller keeps it alive.
  // nullptr if the file was Parse()d from memory or already released.
  std::unique_ptr<MappedFile> ReleaseMappedFile() { return std::move(file_); }

  // ---- metadata ----
  const std::vector<GgufKeyValue>& metadata() const { return kvs_; }  // in file order
  const GgufValue* Find(std::string_view key) const;                  // nullptr if absent
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  // Typed getters: NotFound if the key is absent, otherwise as the GgufValue accessors (with the
  // file and key named in the message). The overloads taking a default return it when the key
  // is absent (a present key of the wrong type is still an error).
  StatusOr<std::string_view> GetString(std::string_view key) const;
  StatusOr<uint32_t> GetU32(std::string_view key) const;
  StatusOr<uint64_t> GetU64(std::string_view key) const;
  StatusOr<int32_t> GetI32(std::string_view key) const;
  StatusOr<int64_t> GetI64(std::string_view key) const;
  StatusOr<float> GetF32(std::string_view key) const;
  StatusOr<bool> GetBool(std::string_view key) const;
  StatusOr<std::string_view> GetString(std::string_view key, std::string_view dflt) const;
  StatusOr<uint32_t> GetU32(std::string_view key, uint32_t dflt) const;
  StatusOr<int32_t> GetI32(std::string_view key, int32_t dflt) const;
  StatusOr<float> GetF32(std::string_view key, float dflt) const;
  StatusOr<bool> GetBool(std::string_view key, bool dflt) const;

  // Any array (NotFound if absent, InvalidArgument if not an array).
  StatusOr<const GgufValue*> GetArray(std::string_view key) const;
  StatusOr<std::span<const std::string_view>> GetStringArray(std::string_view key) const;
  StatusOr<std::vector<float>> GetF32Array(std::string_view key) const;
  StatusOr<std::vector<int32_t>> GetI32Array(std::string_view key) const;
  StatusOr<std::vector<uint32_t>> GetU32Array(std::string_view key) const;

  // ---- tensors ----
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // in file order
  const GgufTensor* FindTensor(std::string_view name) const;           // nullptr if absent
  StatusOr<const GgufTensor*> GetTensor(std::string_view name) const;  // NotFound if absent

  // A 2-D tensor as a matrix of dims[1] rows by dims[0] columns. NotFound if absent,
  // InvalidArgument if not 2-D (trailing dims of 1 are allowed) or not the expected shape (when
  // rows/cols >= 0), Unimplemented if its type has no DType, FailedPrecondition if its data is
  // misaligned for the type.
  StatusOr<WeightMatrix> GetWeightMatrix(std::string_view name, int64_t rows = -1,
                                         int64_t cols = -1) const;
  // A float32 tensor of `size` elements (any size when -1) as a vector; same errors.
  StatusOr<WeightVector> GetF32Vector(std::string_view name, int64_t size = -1) const;

 private:
  friend class GgufParser;
  GgufFile() = default;

  std::unique_ptr<MappedFile> file_;  // null when parsed from caller-owned memory
  std::string name_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> kvs_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

// ---- template definitions ----

template <typename T>
StatusOr<T> GgufValue::AsInt() const {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (!is_integer()) return WrongType("an integer");
  const auto [neg, mag] = IntegerParts(type_, ScalarBytes());
  if (neg) {
    if constexpr (std::is_signed_v<T>) {
      // |min| of T as unsigned: max + 1.
      if (mag <= static_cast<uint64_t>(std::numeric_limits<T>::max()) + 1u) {
        return static_cast<T>(-static_cast<int64_t>(mag - 1) - 1);
      }
    }
  } else if (mag <= static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    return static_cast<T>(mag);
  }
  return OutOfRangeError("value " + std::string(neg ? "-" : "") + std::to_string(mag) +
                         " does not fit the requested integer type");
}

template <typename T>
StatusOr<std::vector<T>> GgufValue::AsIntArray() const {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (type_ != GgufType::kArray) return WrongType("an array of integers");
  GgufValue tmp;
  tmp.type_ = elem_type_;
  if (!tmp.is_integer()) return WrongType("an array of integers");
  size_t width = 1;
  switch (elem_type_) {
    case GgufType::kUint16:
    case GgufType::kInt16:
      width = 2;
      break;
    case GgufType::kUint32:
    case GgufType::kInt32:
      width = 4;
      break;
    case GgufType::kUint64:
    case GgufType::kInt64:
      width = 8;
      break;
    default:
      break;
  }
  std::vector<T> out;
  out.reserve(size());  // count_ was checked against the file's bytes when parsed
  for (uint64_t i = 0; i < count_; ++i) {
    tmp.scalar_bytes_ = {};
    std::memcpy(tmp.scalar_bytes_.data(), elems_ + i * width, width);
    StatusOr<T> v = tmp.AsInt<T>();
    if (!v.ok()) return v.status().WithContext("element " + std::to_string(i));
    out.push_back(*v);
  }
  return out;
}

}  // namespace specinfer
