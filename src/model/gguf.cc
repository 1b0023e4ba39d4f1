#include "model/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace specinfer {

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;
constexpr size_t kDefaultAlignment = 32;
// The fewest bytes an entry can take in the file, used to reject counts the file cannot hold
// before anything is allocated for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims = 0, type, offset
constexpr uint64_t kMinStringBytes = 8;                  // length only
constexpr uint64_t kMinArrayBytes = 4 + 8;               // element type and count
// Counts are checked against the bytes left before anything is read, but an in-memory entry is
// larger than its smallest encoding (a GgufValue is ~100 bytes, an empty nested array 12), so
// containers are reserved only up to this many entries up front and otherwise grow as entries
// are actually parsed: a lying count costs at most a few times the bytes really present.
constexpr uint64_t kMaxReserve = 1 << 16;

size_t ReserveCount(uint64_t count) { return static_cast<size_t>(std::min(count, kMaxReserve)); }

struct GgmlTypeInfo {
  std::string_view name;  // empty: no such id
  uint32_t block_size;
  uint32_t type_size;
  std::optional<DType> dtype;
};

// Every ggml type id with its block geometry (ggml.c type_traits). Ids 4, 5 and 31-33, 36-38
// were removed from ggml and never appear in GGUF files.
const GgmlTypeInfo& LookupGgmlType(uint32_t id) {
  static const GgmlTypeInfo kNone{"", 0, 0, std::nullopt};
  static const GgmlTypeInfo kTypes[] = {
      {"F32", 1, 4, DType::kF32},          // 0
      {"F16", 1, 2, DType::kF16},          // 1
      {"Q4_0", 32, 18, DType::kQ4_0},      // 2
      {"Q4_1", 32, 20, DType::kQ4_1},      // 3
      {"", 0, 0, std::nullopt},            // 4 (Q4_2, removed)
      {"", 0, 0, std::nullopt},            // 5 (Q4_3, removed)
      {"Q5_0", 32, 22, DType::kQ5_0},      // 6
      {"Q5_1", 32, 24, DType::kQ5_1},      // 7
      {"Q8_0", 32, 34, DType::kQ8_0},      // 8
      {"Q8_1", 32, 36, DType::kQ8_1},      // 9 (2 x fp16 + 32 x int8)
      {"Q2_K", 256, 84, DType::kQ2_K},     // 10
      {"Q3_K", 256, 110, DType::kQ3_K},    // 11
      {"Q4_K", 256, 144, DType::kQ4_K},    // 12
      {"Q5_K", 256, 176, DType::kQ5_K},    // 13
      {"Q6_K", 256, 210, DType::kQ6_K},    // 14
      {"Q8_K", 256, 292, DType::kQ8_K},    // 15
      {"IQ2_XXS", 256, 66, std::nullopt},  // 16
      {"IQ2_XS", 256, 74, std::nullopt},   // 17
      {"IQ3_XXS", 256, 98, std::nullopt},  // 18
      {"IQ1_S", 256, 50, std::nullopt},    // 19
      {"IQ4_NL", 32, 18, std::nullopt},    // 20
      {"IQ3_S", 256, 110, std::nullopt},   // 21
      {"IQ2_S", 256, 82, std::nullopt},    // 22
      {"IQ4_XS", 256, 136, std::nullopt},  // 23
      {"I8", 1, 1, std::nullopt},          // 24
      {"I16", 1, 2, std::nullopt},         // 25
      {"I32", 1, 4, std::nullopt},         // 26
      {"I64", 1, 8, std::nullopt},         // 27
      {"F64", 1, 8, std::nullopt},         // 28
      {"IQ1_M", 256, 56, std::nullopt},    // 29
      {"BF16", 1, 2, DType::kBF16},        // 30
      {"", 0, 0, std::nullopt},            // 31 (Q4_0_4_4, removed)
      {"", 0, 0, std::nullopt},            // 32 (Q4_0_4_8, removed)
      {"", 0, 0, std::nullopt},            // 33 (Q4_0_8_8, removed)
      {"TQ1_0", 256, 54, std::nullopt},    // 34
      {"TQ2_0", 256, 66, std::nullopt},    // 35
      {"", 0, 0, std::nullopt},            // 36 (IQ4_NL_4_4, removed)
      {"", 0, 0, std::nullopt},            // 37 (IQ4_NL_4_8, removed)
      {"", 0, 0, std::nullopt},            // 38 (IQ4_NL_8_8, removed)
      {"MXFP4", 32, 17, std::nullopt},     // 39
      {"NVFP4", 64, 36, std::nullopt},     // 40
      {"Q1_0", 128, 18, std::nullopt},     // 41
  };
  return id < std::size(kTypes) ? kTypes[id] : kNone;
}

size_t ScalarSize(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    default:
      return 0;  // string, array
  }
}

bool ValidType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

// A name or key from the file, made safe to print: at most 80 bytes, control and non-ASCII bytes
// escaped.
std::string Printable(std::string_view s) {
  std::string out;
  const size_t n = std::min<size_t>(s.size(), 80);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > n) out += "...";
  return out;
}

std::string Quoted(std::string_view s) {
  std::string out(1, '\'');
  out += Printable(s);
  out += '\'';
  return out;
}

std::string TypeName(uint32_t t) {
  return ValidType(t) ? std::string(GgufTypeName(static_cast<GgufType>(t)))
                      : "invalid type " + std::to_string(t);
}

}  // namespace

std::string_view GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
      return "UINT8";
    case GgufType::kInt8:
      return "INT8";
    case GgufType::kUint16:
      return "UINT16";
    case GgufType::kInt16:
      return "INT16";
    case GgufType::kUint32:
      return "UINT32";
    case GgufType::kInt32:
      return "INT32";
    case GgufType::kFloat32:
      return "FLOAT32";
    case GgufType::kBool:
      return "BOOL";
    case GgufType::kString:
      return "STRING";
    case GgufType::kArray:
      return "ARRAY";
    case GgufType::kUint64:
      return "UINT64";
    case GgufType::kInt64:
      return "INT64";
    case GgufType::kFloat64:
      return "FLOAT64";
  }
  return "INVALID";
}

std::optional<DType> DTypeFromGgmlType(uint32_t ggml_type) {
  return LookupGgmlType(ggml_type).dtype;
}

std::string_view GgmlTypeName(uint32_t ggml_type) {
  const GgmlTypeInfo& info = LookupGgmlType(ggml_type);
  return info.name.empty() ? std::string_view("unknown") : info.name;
}

// ---- GgufValue ----

bool GgufValue::is_integer() const {
  switch (type_) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

Status GgufValue::WrongType(std::string_view wanted) const {
  std::string have(GgufTypeName(type_));
  if (type_ == GgufType::kArray) have += " of " + std::string(GgufTypeName(elem_type_));
  return InvalidArgumentError("expected " + std::string(wanted) + ", found " + have);
}

std::pair<bool, uint64_t> GgufValue::IntegerParts(GgufType t, const uint8_t* p) const {
  auto signed_parts = [](int64_t v) -> std::pair<bool, uint64_t> {
    if (v >= 0) return {false, static_cast<uint64_t>(v)};
    return {true, static_cast<uint64_t>(-(v + 1)) + 1u};  // no overflow at INT64_MIN
  };
  switch (t) {
    case GgufType::kUint8:
      return {false, p[0]};
    case GgufType::kInt8:
      return signed_parts(static_cast<int8_t>(p[0]));
    case GgufType::kUint16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return {false, v};
    }
    case GgufType::kInt16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return signed_parts(v);
    }
    case GgufType::kUint32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return {false, v};
    }
    case GgufType::kInt32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return signed_parts(v);
    }
    case GgufType::kUint64: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return {false, v};
    }
    case GgufType::kInt64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return signed_parts(v);
    }
    default:
      return {false, 0};
  }
}

StatusOr<double> GgufValue::AsF64() const {
  if (type_ == GgufType::kFloat32) {
    float v;
    std::memcpy(&v, ScalarBytes(), 4);
    return static_cast<double>(v);
  }
  if (type_ == GgufType::kFloat64) {
    double v;
    std::memcpy(&v, ScalarBytes(), 8);
    return v;
  }
  return WrongType("a float");
}

StatusOr<float> GgufValue::AsF32() const {
  SI_ASSIGN_OR_RETURN(double v, AsF64());
  if (std::isfinite(v) &&
      (v > std::numeric_limits<float>::max() || v < -std::numeric_limits<float>::max())) {
    return OutOfRangeError("value " + std::to_string(v) + " does not fit a float32");
  }
  return static_cast<float>(v);
}

StatusOr<bool> GgufValue::AsBool() const {
  if (type_ != GgufType::kBool) return WrongType("a bool");
  return scalar_bytes_[0] != 0;
}

StatusOr<std::string_view> GgufValue::AsString() const {
  if (type_ != GgufType::kString) return WrongType("a string");
  return str_;
}

StatusOr<std::span<const std::string_view>> GgufValue::AsStringArray() const {
  if (type_ != GgufType::kArray || elem_type_ != GgufType::kString) {
    return WrongType("an array of strings");
  }
  return std::span<const std::string_view>(strings_);
}

StatusOr<std::vector<float>> GgufValue::AsF32Array() const {
  if (type_ != GgufType::kArray ||
      (elem_type_ != GgufType::kFloat32 && elem_type_ != GgufType::kFloat64)) {
    return WrongType("an array of floats");
  }
  std::vector<float> out(size());  // count_ was checked against the file's bytes when parsed
  if (elem_type_ == GgufType::kFloat32) {
    if (count_ > 0) std::memcpy(out.data(), elems_, count_ * sizeof(float));
  } else {
    for (uint64_t i = 0; i < count_; ++i) {
      double v;
      std::memcpy(&v, elems_ + i * 8, 8);
      out[i] = static_cast<float>(v);
    }
  }
  return out;
}

StatusOr<std::span<const GgufValue>> GgufValue::AsArrayOfArrays() const {
  if (type_ != GgufType::kArray || elem_type_ != GgufType::kArray) {
    return WrongType("an array of arrays");
  }
  return std::span<const GgufValue>(arrays_);
}

std::string GgufValue::ToString(size_t max_items) const {
  auto quote = [](std::string_view s) {
    std::string q(1, '"');
    q += Printable(s);
    q += '"';
    return q;
  };
  switch (type_) {
    case GgufType::kString:
      return quote(str_);
    case GgufType::kBool:
      return scalar_bytes_[0] ? "true" : "false";
    case GgufType::kFloat32:
    case GgufType::kFloat64: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.9g", *AsF64());
      return buf;
    }
    case GgufType::kArray: {
      std::string out =
          "[" + std::string(GgufTypeName(elem_type_)) + " x " + std::to_string(count_);
      const size_t shown = std::min<uint64_t>(count_, max_items);
      for (size_t i = 0; i < shown; ++i) {
        out += i == 0 ? ": " : ", ";
        if (elem_type_ == GgufType::kString) {
          out += quote(strings_[i]);
        } else if (elem_type_ == GgufType::kArray) {
          out += arrays_[i].ToString(max_items);
        } else {
          GgufValue e;
          e.type_ = elem_type_;
          const size_t w = ScalarSize(elem_type_);
          std::memcpy(e.scalar_bytes_.data(), elems_ + i * w, w);
          out += e.ToString(max_items);
        }
      }
      if (count_ > shown) out += ", ...";
      return out + "]";
    }
    default: {
      const auto [neg, mag] = IntegerParts(type_, ScalarBytes());
      return (neg ? "-" : "") + std::to_string(mag);
    }
  }
}

std::string GgufTensor::ShapeString() const {
  std::string s = "[";
  for (uint32_t i = 0; i < n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

// ---- parsing ----

class GgufParser {
 public:
  explicit GgufParser(GgufFile& f) : f_(f), r_(f.data_, f.size_, "file") {}

  Status Parse() {
    SI_RETURN_IF_ERROR(ParseHeader());
    SI_RETURN_IF_ERROR(ParseMetadata());
    SI_RETURN_IF_ERROR(ParseAlignment());
    SI_RETURN_IF_ERROR(ParseTensorInfos());
    return PlaceTensors();
  }

 private:
  Status Err(StatusCode code, std::string_view field, const std::string& msg) const {
    return Status(code, f_.name_ + ": " + std::string(field) + ": " + msg);
  }
  Status Corrupt(std::string_view field, const std::string& msg) const {
    return Err(StatusCode::kDataLoss, field, msg);
  }
  Status Wrap(const Status& s, std::string_view field) const {
    return Err(s.code(), field, s.message());
  }

  Status ReadString(std::string_view* out) {
    uint64_t len = 0;
    SI_RETURN_IF_ERROR(r_.Read(&len));
    if (len > r_.remaining()) {
      return DataLossError("string length " + std::to_string(len) + " at offset " +
                           std::to_string(r_.offset() - 8) + " runs past the end of the file (" +
                           std::to_string(r_.remaining()) + " bytes remain)");
    }
    SI_ASSIGN_OR_RETURN(const uint8_t* p, r_.Take(static_cast<size_t>(len)));
    *out = std::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
    return Status::Ok();
  }

  // Reads a value of type `t` (already validated) into *out. Errors carry no file/key context.
  Status ReadValue(GgufType t, GgufValue* out, int depth) {
    out->type_ = t;
    if (const size_t w = ScalarSize(t); w > 0) {
      SI_ASSIGN_OR_RETURN(const uint8_t* p, r_.Take(w));
      std::memcpy(out->scalar_bytes_.data(), p, w);
      return Status::Ok();
    }
    if (t == GgufType::kString) return ReadString(&out->str_);
    // Array.
    if (depth >= kMaxArrayDepth) {
      return DataLossError("arrays nested more than " + std::to_string(kMaxArrayDepth) + " deep");
    }
    uint32_t et = 0;
    uint64_t count = 0;
    SI_RETURN_IF_ERROR(r_.Read(&et));
    if (!ValidType(et)) return DataLossError("invalid array element type " + std::to_string(et));
    SI_RETURN_IF_ERROR(r_.Read(&count));
    out->elem_type_ = static_cast<GgufType>(et);
    out->count_ = count;
    const uint64_t remaining = r_.remaining();
    auto too_many = [&](uint64_t min_each) {
      return DataLossError("array of " + std::to_string(count) + " " + TypeName(et) +
                           " elements needs at least " + std::to_string(min_each) +
                           " bytes each, only " + std::to_string(remaining) + " bytes remain");
    };
    if (const size_t w = ScalarSize(out->elem_type_); w > 0) {
      if (count > remaining / w) return too_many(w);
      SI_ASSIGN_OR_RETURN(out->elems_, r_.Take(static_cast<size_t>(count * w)));
      return Status::Ok();
    }
    if (out->elem_type_ == GgufType::kString) {
      if (count > remaining / kMinStringBytes) return too_many(kMinStringBytes);
      out->strings_.reserve(ReserveCount(count));
      for (uint64_t i = 0; i < count; ++i) {
        std::string_view str;
        Status s = ReadString(&str);
        if (!s.ok()) return s.WithContext("element " + std::to_string(i));
        out->strings_.push_back(str);
      }
      return Status::Ok();
    }
    if (count > remaining / kMinArrayBytes) return too_many(kMinArrayBytes);
    out->arrays_.reserve(ReserveCount(count));
    for (uint64_t i = 0; i < count; ++i) {
      Status s = ReadValue(GgufType::kArray, &out->arrays_.emplace_back(), depth + 1);
      if (!s.ok()) return s.WithContext("element " + std::to_string(i));
    }
    return Status::Ok();
  }

  Status ParseHeader() {
    char magic[4] = {};
    Status s = r_.Read(&magic);
    if (!s.ok()) return Wrap(s, "header");
    if (std::memcmp(magic, kMagic, 4) != 0) {
      return Err(
          StatusCode::kInvalidArgument, "header",
          "not a GGUF file (magic is " + Quoted(std::string_view(magic, 4)) + ", expected 'GGUF')");
    }
    uint32_t version = 0;
    s = r_.Read(&version);
    if (!s.ok()) return Wrap(s, "header version");
    if (version == 0x02000000u || version == 0x03000000u) {
      return Err(StatusCode::kInvalidArgument, "header version",
                 "big-endian GGUF files are not supported");
    }
    if (version != 2 && version != 3) {
      return Err(StatusCode::kInvalidArgument, "header version",
                 "unsupported GGUF version " + std::to_string(version) +
                     (version == 1 ? " (version 1 used 32-bit lengths)" : "") +
                     "; only versions 2 and 3 are supported");
    }
    f_.version_ = version;
    s = r_.Read(&n_tensors_);
    if (!s.ok()) return Wrap(s, "header tensor_count");
    s = r_.Read(&n_kv_);
    if (!s.ok()) return Wrap(s, "header metadata_kv_count");
    if (n_kv_ > r_.remaining() / kMinKvBytes) {
      return Corrupt("header metadata_kv_count",
                     std::to_string(n_kv_) + " key/value pairs cannot fit in the " +
                         std::to_string(r_.remaining()) + " bytes after the header");
    }
    if (n_tensors_ > r_.remaining() / kMinTensorInfoBytes) {
      return Corrupt("header tensor_count",
                     std::to_string(n_tensors_) + " tensor infos cannot fit in the " +
                         std::to_string(r_.remaining()) + " bytes after the header");
    }
    return Status::Ok();
  }

  Status ParseMetadata() {
    f_.kvs_.reserve(ReserveCount(n_kv_));
    f_.kv_index_.reserve(ReserveCount(n_kv_));
    for (uint64_t i = 0; i < n_kv_; ++i) {
      const std::string field_n = "metadata key #" + std::to_string(i);
      GgufKeyValue kv;
      Status s = ReadString(&kv.key);
      if (!s.ok()) return Wrap(s, field_n);
      const std::string field = "metadata key " + Quoted(kv.key) + " (#" + std::to_string(i) + ")";
      uint32_t type = 0;
      s = r_.Read(&type);
      if (!s.ok()) return Wrap(s, field);
      if (!ValidType(type)) return Corrupt(field, "invalid value type " + std::to_string(type));
      s = ReadValue(static_cast<GgufType>(type), &kv.value, 0);
      if (!s.ok()) return Wrap(s, field);
      if (!f_.kv_index_.emplace(kv.key, f_.kvs_.size()).second) {
        return Corrupt(field, "duplicate key");
      }
      f_.kvs_.push_back(std::move(kv));
    }
    return Status::Ok();
  }

  Status ParseAlignment() {
    f_.alignment_ = kDefaultAlignment;
    const GgufValue* v = f_.Find("general.alignment");
    if (v == nullptr) return Status::Ok();
    StatusOr<uint32_t> a = v->AsInt<uint32_t>();
    if (!a.ok()) return Corrupt("metadata key 'general.alignment'", a.status().message());
    if (*a == 0 || (*a & (*a - 1)) != 0) {
      return Corrupt("metadata key 'general.alignment'",
                     "must be a power of two, got " + std::to_string(*a));
    }
    f_.alignment_ = *a;
    return Status::Ok();
  }

  Status ParseTensorInfos() {
    if (n_tensors_ > r_.remaining() / kMinTensorInfoBytes) {
      return Corrupt("header tensor_count",
                     std::to_string(n_tensors_) + " tensor infos cannot fit in the " +
                         std::to_string(r_.remaining()) + " bytes after the metadata");
    }
    f_.tensors_.reserve(ReserveCount(n_tensors_));
    f_.tensor_index_.reserve(ReserveCount(n_tensors_));
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      GgufTensor t;
      Status s = ReadString(&t.name);
      if (!s.ok()) return Wrap(s, "tensor info #" + std::to_string(i) + " name");
      const std::string field = "tensor " + Quoted(t.name) + " (#" + std::to_string(i) + ")";
      s = r_.Read(&t.n_dims);
      if (!s.ok()) return Wrap(s, field);
      if (t.n_dims > kMaxDims) {
        return Corrupt(field, "n_dims " + std::to_string(t.n_dims) + " exceeds the maximum of " +
                                  std::to_string(kMaxDims));
      }
      for (uint32_t d = 0; d < t.n_dims; ++d) {
        uint64_t dim = 0;
        s = r_.Read(&dim);
        if (!s.ok()) return Wrap(s, field);
        if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Corrupt(field, "dimension " + std::to_string(d) + " is " + std::to_string(dim) +
                                    " (negative or too large)");
        }
        t.dims[d] = static_cast<int64_t>(dim);
      }
      s = r_.Read(&t.ggml_type);
      if (!s.ok()) return Wrap(s, field);
      s = r_.Read(&t.offset);
      if (!s.ok()) return Wrap(s, field);

      const GgmlTypeInfo& info = LookupGgmlType(t.ggml_type);
      if (info.name.empty()) {
        return Corrupt(field, "unknown ggml type id " + std::to_string(t.ggml_type));
      }
      t.dtype = info.dtype;
      int64_t n = 1;
      for (uint32_t d = 0; d < kMaxDims; ++d) {
        if (__builtin_mul_overflow(n, t.dims[d], &n)) {
          return Corrupt(field, "dimensions " + t.ShapeString() + " overflow the element count");
        }
      }
      if (t.dims[0] % info.block_size != 0) {
        return Corrupt(field, "dims[0] = " + std::to_string(t.dims[0]) +
                                  " is not a multiple of the block size " +
                                  std::to_string(info.block_size) + " of type " +
                                  std::string(info.name));
      }
      uint64_t bytes;
      if (__builtin_mul_overflow(static_cast<uint64_t>(n / info.block_size),
                                 static_cast<uint64_t>(info.type_size), &bytes) ||
          bytes > f_.size_) {
        return Corrupt(field, std::string(info.name) + " tensor of shape " + t.ShapeString() +
                                  " is larger than the whole file (" + std::to_string(f_.size_) +
                                  " bytes)");
      }
      t.bytes = static_cast<size_t>(bytes);
      if (!f_.tensor_index_.emplace(t.name, f_.tensors_.size()).second) {
        return Corrupt(field, "duplicate tensor name");
      }
      f_.tensors_.push_back(t);
    }
    return Status::Ok();
  }

  Status PlaceTensors() {
    const uint64_t a = f_.alignment_;
    const uint64_t end_of_infos = r_.offset();
    f_.data_offset_ = (end_of_infos + a - 1) / a * a;  // no overflow: both < 2^63
    if (f_.tensors_.empty()) return Status::Ok();
    const uint64_t size = f_.size_;
    if (f_.data_offset_ > size) {
      return Corrupt("tensor data",
                     "the data section would start at offset " + std::to_string(f_.data_offset_) +
                         ", past the end of the file (" + std::to_string(size) + " bytes)");
    }
    const uint64_t avail = size - f_.data_offset_;
    for (size_t i = 0; i < f_.tensors_.size(); ++i) {
      GgufTensor& t = f_.tensors_[i];
      const std::string field = "tensor " + Quoted(t.name) + " (#" + std::to_string(i) + ")";
      if (t.offset % a != 0) {
        return Corrupt(field, "data offset " + std::to_string(t.offset) +
                                  " is not a multiple of the alignment " + std::to_string(a));
      }
      if (t.offset > avail || t.bytes > avail - t.offset) {
        return Corrupt(field, "data [" + std::to_string(f_.data_offset_) + " + " +
                                  std::to_string(t.offset) + ", +" + std::to_string(t.bytes) +
                                  " bytes) runs past the end of the file (" + std::to_string(size) +
                                  " bytes)");
      }
      t.data = f_.data_ + f_.data_offset_ + t.offset;
    }
    return Status::Ok();
  }

  GgufFile& f_;
  ByteReader r_;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
};

// ---- GgufFile ----

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  SI_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  const uint8_t* data = file->data();
  const size_t size = file->size();
  SI_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> g, Parse(data, size, path));
  g->file_ = std::move(file);
  return g;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size,
                                                    std::string name) {
  std::unique_ptr<GgufFile> g(new GgufFile());
  g->name_ = std::move(name);
  g->data_ = data;
  g->size_ = size;
  GgufParser parser(*g);
  SI_RETURN_IF_ERROR(parser.Parse());
  return g;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

namespace {

// Looks `key` up and applies `get` to it, putting the file and key into any error.
template <typename T, typename Get>
StatusOr<T> GetTyped(const GgufFile& f, std::string_view key, Get get,
                     std::optional<T> dflt = std::nullopt) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    if (dflt) return *dflt;
    return NotFoundError(f.path() + ": metadata key " + Quoted(key) + " is missing");
  }
  StatusOr<T> r = get(*v);
  if (!r.ok()) {
    return Status(r.status().code(),
                  f.path() + ": metadata key " + Quoted(key) + ": " + r.status().message());
  }
  return r;
}

}  // namespace

StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  return GetTyped<std::string_view>(*this, key, [](const GgufValue& v) { return v.AsString(); });
}
StatusOr<uint32_t> GgufFile::GetU32(std::string_view key) const {
  return GetTyped<uint32_t>(*this, key, [](const GgufValue& v) { return v.AsInt<uint32_t>(); });
}
StatusOr<uint64_t> GgufFile::GetU64(std::string_view key) const {
  return GetTyped<uint64_t>(*this, key, [](const GgufValue& v) { return v.AsInt<uint64_t>(); });
}
StatusOr<int32_t> GgufFile::GetI32(std::string_view key) const {
  return GetTyped<int32_t>(*this, key, [](const GgufValue& v) { return v.AsInt<int32_t>(); });
}
StatusOr<int64_t> GgufFile::GetI64(std::string_view key) const {
  return GetTyped<int64_t>(*this, key, [](const GgufValue& v) { return v.AsInt<int64_t>(); });
}
StatusOr<float> GgufFile::GetF32(std::string_view key) const {
  return GetTyped<float>(*this, key, [](const GgufValue& v) { return v.AsF32(); });
}
StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  return GetTyped<bool>(*this, key, [](const GgufValue& v) { return v.AsBool(); });
}
StatusOr<std::string_view> GgufFile::GetString(std::string_view key, std::string_view dflt) const {
  return GetTyped<std::string_view>(
      *this, key, [](const GgufValue& v) { return v.AsString(); }, dflt);
}
StatusOr<uint32_t> GgufFile::GetU32(std::string_view key, uint32_t dflt) const {
  return GetTyped<uint32_t>(
      *this, key, [](const GgufValue& v) { return v.AsInt<uint32_t>(); }, dflt);
}
StatusOr<int32_t> GgufFile::GetI32(std::string_view key, int32_t dflt) const {
  return GetTyped<int32_t>(
      *this, key, [](const GgufValue& v) { return v.AsInt<int32_t>(); }, dflt);
}
StatusOr<float> GgufFile::GetF32(std::string_view key, float dflt) const {
  return GetTyped<float>(
      *this, key, [](const GgufValue& v) { return v.AsF32(); }, dflt);
}
StatusOr<bool> GgufFile::GetBool(std::string_view key, bool dflt) const {
  return GetTyped<bool>(
      *this, key, [](const GgufValue& v) { return v.AsBool(); }, dflt);
}

StatusOr<const GgufValue*> GgufFile::GetArray(std::string_view key) const {
  return GetTyped<const GgufValue*>(
      *this, key, [](const GgufValue& v) -> StatusOr<const GgufValue*> {
        if (!v.is_array()) {
          return InvalidArgumentError("expected an array, found " +
                                      std::string(GgufTypeName(v.type())));
        }
        return &v;
      });
}
StatusOr<std::span<const std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  return GetTyped<std::span<const std::string_view>>(
      *this, key, [](const GgufValue& v) { return v.AsStringArray(); });
}
StatusOr<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  return GetTyped<std::vector<float>>(*this, key,
                                      [](const GgufValue& v) { return v.AsF32Array(); });
}
StatusOr<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  return GetTyped<std::vector<int32_t>>(*this, key,
                                        [](const GgufValue& v) { return v.AsIntArray<int32_t>(); });
}
StatusOr<std::vector<uint32_t>> GgufFile::GetU32Array(std::string_view key) const {
  return GetTyped<std::vector<uint32_t>>(
      *this, key, [](const GgufValue& v) { return v.AsIntArray<uint32_t>(); });
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<const GgufTensor*> GgufFile::GetTensor(std::string_view name) const {
  const GgufTensor* t = FindTensor(name);
  if (t == nullptr) return NotFoundError(name_ + ": no tensor named " + Quoted(name));
  return t;
}

namespace {

Status CheckUsable(const GgufFile& f, const GgufTensor& t) {
  if (!t.dtype) {
    return UnimplementedError(f.path() + ": tensor " + Quoted(t.name) + " has type " +
                              std::string(GgmlTypeName(t.ggml_type)) +
                              ", which specinfer cannot use");
  }
  const size_t align = *t.dtype == DType::kF32 ? alignof(float) : alignof(uint16_t);
  if (reinterpret_cast<uintptr_t>(t.data) % align != 0) {
    return FailedPreconditionError(
        f.path() + ": tensor " + Quoted(t.name) + " data is not aligned to " +
        std::to_string(align) + " bytes (general.alignment " + std::to_string(f.alignment()) + ")");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<WeightMatrix> GgufFile::GetWeightMatrix(std::string_view name, int64_t rows,
                                                 int64_t cols) const {
  SI_ASSIGN_OR_RETURN(const GgufTensor* t, GetTensor(name));
  SI_RETURN_IF_ERROR(CheckUsable(*this, *t));
  if (t->n_dims < 2 || t->dims[2] != 1 || t->dims[3] != 1) {
    return InvalidArgumentError(name_ + ": tensor " + Quoted(name) + " has shape " +
                                t->ShapeString() + ", expected a matrix");
  }
  if ((rows >= 0 && t->dims[1] != rows) || (cols >= 0 && t->dims[0] != cols)) {
    return InvalidArgumentError(name_ + ": tensor " + Quoted(name) + " has shape " +
                                t->ShapeString() + ", expected [" + std::to_string(cols) + ", " +
                                std::to_string(rows) + "] (" + std::to_string(rows) + " rows of " +
                                std::to_string(cols) + ")");
  }
  WeightMatrix m;
  m.type = *t->dtype;
  m.rows = t->dims[1];
  m.cols = t->dims[0];
  m.data = t->data;
  return m;
}

StatusOr<WeightVector> GgufFile::GetF32Vector(std::string_view name, int64_t size) const {
  SI_ASSIGN_OR_RETURN(const GgufTensor* t, GetTensor(name));
  SI_RETURN_IF_ERROR(CheckUsable(*this, *t));
  if (*t->dtype != DType::kF32) {
    return InvalidArgumentError(name_ + ": tensor " + Quoted(name) + " has type " +
                                std::string(DTypeName(*t->dtype)) + ", expected F32");
  }
  if (t->n_dims != 1 || (size >= 0 && t->dims[0] != size)) {
    return InvalidArgumentError(name_ + ": tensor " + Quoted(name) + " has shape " +
                                t->ShapeString() + ", expected [" +
                                (size >= 0 ? std::to_string(size) : std::string("n")) + "]");
  }
  WeightVector v;
  v.data = static_cast<const float*>(t->data);
  v.size = t->dims[0];
  return v;
}

}  // namespace specinfer
