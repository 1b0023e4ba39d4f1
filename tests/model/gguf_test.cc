// GgufFile: the real SmolLM2 file (skipped when absent), synthetic files holding every value
// type, and corrupt files -- truncated at every byte, lying counts and lengths, bad dims, types
// and offsets -- which must all give a clean Status naming the file and the field.
#include "model/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/type_ops.h"
#include "tensor/half.h"
#include "test_util.h"

namespace specinfer {
namespace {

namespace fs = std::filesystem;

std::string ModelPath() { return testing::SourcePath("models/SmolLM2-135M-Instruct.Q4_1.gguf"); }

// ---- a small GGUF writer for synthetic files ----

class Bytes {
 public:
  template <typename T>
  Bytes& Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b_.insert(b_.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& Str(std::string_view s) {
    Put<uint64_t>(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& Raw(const std::vector<uint8_t>& v) {
    b_.insert(b_.end(), v.begin(), v.end());
    return *this;
  }
  const std::vector<uint8_t>& bytes() const { return b_; }
  size_t size() const { return b_.size(); }

 private:
  std::vector<uint8_t> b_;
};

// A metadata value: its type id and its encoded payload.
struct Val {
  uint32_t type;
  std::vector<uint8_t> payload;
};

template <typename T>
Val Scalar(GgufType t, T v) {
  return {static_cast<uint32_t>(t), Bytes().Put(v).bytes()};
}
Val StrV(std::string_view s) {
  return {static_cast<uint32_t>(GgufType::kString), Bytes().Str(s).bytes()};
}
Val ArrayV(GgufType elem, uint64_t count, const std::vector<uint8_t>& elems) {
  return {static_cast<uint32_t>(GgufType::kArray),
          Bytes().Put(static_cast<uint32_t>(elem)).Put(count).Raw(elems).bytes()};
}
Val StrArrayV(const std::vector<std::string>& v) {
  Bytes e;
  for (const auto& s : v) e.Str(s);
  return ArrayV(GgufType::kString, v.size(), e.bytes());
}
// The payload of an array value without its leading type id (for nesting).
std::vector<uint8_t> ArrayBody(const Val& v) { return v.payload; }

struct TensorSpec {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> dims;
  std::optional<uint64_t> offset;  // default: packed after the previous tensor, aligned
  std::vector<uint8_t> data;       // default: a byte pattern of the right size
};

struct Spec {
  std::string magic = "GGUF";
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors, n_kv;  // override the real counts
  std::vector<std::pair<std::string, Val>> kvs;
  std::vector<TensorSpec> tensors;
  uint64_t alignment = 32;  // for laying out; add general.alignment to kvs to tell the reader
  bool write_data = true;
};

// (block elements, block bytes) of the ggml types the tests use.
std::pair<uint64_t, uint64_t> Geometry(uint32_t type) {
  switch (type) {
    case 0:
      return {1, 4};
    case 1:
      return {1, 2};
    case 2:
      return {32, 18};
    case 3:
      return {32, 20};
    case 8:
      return {32, 34};
    case 16:
      return {256, 66};
    case 30:
      return {1, 2};
    default:
      return {1, 1};
  }
}

uint64_t TensorBytes(const TensorSpec& t) {
  uint64_t n = 1;
  for (uint64_t d : t.dims) n *= d;  // wraps for the overflow cases; unused there
  const auto [bs, bb] = Geometry(t.type);
  return n / bs * bb;
}

std::vector<uint8_t> Build(const Spec& s) {
  Bytes b;
  b.Raw(std::vector<uint8_t>(s.magic.begin(), s.magic.end()));
  b.Put(s.version);
  b.Put<uint64_t>(s.n_tensors.value_or(s.tensors.size()));
  b.Put<uint64_t>(s.n_kv.value_or(s.kvs.size()));
  for (const auto& [k, v] : s.kvs) {
    b.Str(k);
    b.Put(v.type);
    b.Raw(v.payload);
  }
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const TensorSpec& t : s.tensors) {
    const uint64_t off = t.offset.value_or(next);
    offsets.push_back(off);
    const uint64_t size = t.data.empty() ? TensorBytes(t) : t.data.size();
    next = (off + size + s.alignment - 1) / s.alignment * s.alignment;
    b.Str(t.name);
    b.Put<uint32_t>(t.dims.size());
    for (uint64_t d : t.dims) b.Put(d);
    b.Put(t.type);
    b.Put(off);
  }
  if (!s.write_data || s.tensors.empty()) return b.bytes();
  std::vector<uint8_t> out = b.bytes();
  const uint64_t start = (out.size() + s.alignment - 1) / s.alignment * s.alignment;
  out.resize(start, 0);
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const TensorSpec& t = s.tensors[i];
    if (offsets[i] > (uint64_t{1} << 24)) continue;  // a deliberately bad offset: no data
    std::vector<uint8_t> data = t.data;
    if (data.empty()) {
      data.resize(TensorBytes(t));
      for (size_t j = 0; j < data.size(); ++j) data[j] = static_cast<uint8_t>(j * 7 + i);
    }
    if (out.size() < start + offsets[i] + data.size()) out.resize(start + offsets[i] + data.size());
    std::copy(data.begin(), data.end(), out.begin() + start + offsets[i]);
  }
  return out;
}

// Q8_0 blocks with d = 0.5 and q[j] = j - 16 + k (k = block index).
std::vector<uint8_t> Q8_0Data(int blocks) {
  std::vector<uint8_t> d;
  for (int k = 0; k < blocks; ++k) {
    const uint16_t h = Fp32ToFp16(0.5f);
    d.push_back(h & 0xFF);
    d.push_back(h >> 8);
    for (int j = 0; j < 32; ++j) d.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16 + k)));
  }
  return d;
}

Spec ValidSpec() {
  Spec s;
  s.kvs = {
      {"general.architecture", StrV("llama")},
      {"k.u8", Scalar(GgufType::kUint8, uint8_t{200})},
      {"k.i8", Scalar(GgufType::kInt8, int8_t{-100})},
      {"k.u16", Scalar(GgufType::kUint16, uint16_t{60000})},
      {"k.i16", Scalar(GgufType::kInt16, int16_t{-30000})},
      {"k.u32", Scalar(GgufType::kUint32, uint32_t{4000000000u})},
      {"k.i32", Scalar(GgufType::kInt32, int32_t{-5})},
      {"k.f32", Scalar(GgufType::kFloat32, 1.5f)},
      {"k.bool", Scalar(GgufType::kBool, uint8_t{1})},
      {"k.u64", Scalar(GgufType::kUint64, uint64_t{1} << 40)},
      {"k.i64", Scalar(GgufType::kInt64, int64_t{-7})},
      {"k.f64", Scalar(GgufType::kFloat64, 0.25)},
      {"k.small_u64", Scalar(GgufType::kUint64, uint64_t{30})},
      {"k.str", StrV("hello\nworld")},
      {"k.empty_str", StrV("")},
      {"k.arr_i32", ArrayV(GgufType::kInt32, 3, Bytes().Put(1).Put(-2).Put(3).bytes())},
      {"k.arr_u8", ArrayV(GgufType::kUint8, 0, {})},
      {"k.arr_f32", ArrayV(GgufType::kFloat32, 2, Bytes().Put(0.5f).Put(-1.0f).bytes())},
      {"k.arr_str", StrArrayV({"a", "bc", ""})},
      {"k.nested",
       ArrayV(GgufType::kArray, 2,
              Bytes()
                  .Raw(ArrayBody(StrArrayV({"x", "y"})))
                  .Raw(ArrayBody(ArrayV(GgufType::kInt16, 1, Bytes().Put(int16_t{9}).bytes())))
                  .bytes())},
      {"general.alignment", Scalar(GgufType::kUint32, uint32_t{32})},
  };
  s.tensors = {
      {"w.f32", 0, {4}, {}, Bytes().Put(1.0f).Put(2.0f).Put(3.0f).Put(4.0f).bytes()},
      {"w.q8_0", 8, {64, 3}, {}, Q8_0Data(6)},
      {"w.q4_1", 3, {32, 2}, {}, {}},
      {"w.f16", 1, {8, 2, 1}, {}, {}},
      {"w.bf16", 30, {3}, {}, {}},
      {"w.iq2", 16, {256}, {}, {}},
      {"scalar", 0, {}, {}, Bytes().Put(42.0f).bytes()},
  };
  return s;
}

// Strips the kv with key `key` from a spec.
void RemoveKv(Spec& s, const std::string& key) {
  s.kvs.erase(
      std::remove_if(s.kvs.begin(), s.kvs.end(), [&](const auto& kv) { return kv.first == key; }),
      s.kvs.end());
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("gguf_test_" + std::to_string(::getpid()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string Write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const std::string p = (path_ / name).string();
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    return p;
  }

 private:
  fs::path path_;
};

StatusOr<std::unique_ptr<GgufFile>> ParseCopy(const std::vector<uint8_t>& bytes, size_t size,
                                              std::vector<uint8_t>* keep) {
  // An exact-size heap copy, so a read past `size` is a real out-of-bounds access (visible to
  // ASan) rather than a read of the rest of the original buffer.
  *keep = std::vector<uint8_t>(bytes.begin(), bytes.begin() + size);
  return GgufFile::Parse(keep->data(), keep->size(), "mem.gguf");
}

// ---- synthetic files ----

TEST(GgufSyntheticTest, ParsesEveryValueType) {
  TempDir dir;
  const std::string path = dir.Write("valid.gguf", Build(ValidSpec()));
  StatusOr<std::unique_ptr<GgufFile>> fo = GgufFile::Open(path);
  ASSERT_TRUE(fo.ok()) << fo.status().ToString();
  const GgufFile& f = **fo;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.metadata().size(), ValidSpec().kvs.size());
  EXPECT_EQ(f.metadata()[0].key, "general.architecture");

  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetU32("k.u8"), 200u);
  EXPECT_EQ(*f.GetI32("k.i8"), -100);
  EXPECT_EQ(*f.GetU32("k.u16"), 60000u);
  EXPECT_EQ(*f.GetI32("k.i16"), -30000);
  EXPECT_EQ(*f.GetU32("k.u32"), 4000000000u);
  EXPECT_EQ(*f.GetI64("k.u32"), 4000000000);
  EXPECT_EQ(*f.GetI32("k.i32"), -5);
  EXPECT_EQ(*f.GetI64("k.i32"), -5);
  EXPECT_EQ(*f.GetF32("k.f32"), 1.5f);
  EXPECT_EQ(*f.GetBool("k.bool"), true);
  EXPECT_EQ(*f.GetU64("k.u64"), uint64_t{1} << 40);
  EXPECT_EQ(*f.GetI64("k.i64"), -7);
  EXPECT_EQ(*f.GetF32("k.f64"), 0.25f);
  EXPECT_EQ(*f.GetU32("k.small_u64"), 30u);  // u64 -> u32 when it fits
  EXPECT_EQ(*f.GetString("k.str"), "hello\nworld");
  EXPECT_EQ(*f.GetString("k.empty_str"), "");

  // Coercions that do not fit, wrong types, missing keys.
  EXPECT_EQ(f.GetI32("k.u32").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.GetU32("k.i32").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.GetU32("k.u64").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.GetU32("k.str").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetString("k.u8").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetF32("k.u8").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetBool("k.u8").status().code(), StatusCode::kInvalidArgument);
  const Status missing = f.GetU32("no.such.key").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("no.such.key"), std::string::npos);
  EXPECT_NE(missing.message().find(path), std::string::npos);
  EXPECT_NE(f.GetU32("k.str").status().message().find("k.str"), std::string::npos);

  // Defaults apply only to absent keys.
  EXPECT_EQ(*f.GetU32("no.such.key", 7u), 7u);
  EXPECT_EQ(*f.GetF32("no.such.key", 2.5f), 2.5f);
  EXPECT_EQ(*f.GetBool("no.such.key", true), true);
  EXPECT_EQ(*f.GetString("no.such.key", "dflt"), "dflt");
  EXPECT_EQ(*f.GetI32("k.i32", 7), -5);
  EXPECT_FALSE(f.GetU32("k.str", 7u).ok());

  // Arrays.
  EXPECT_EQ(*f.GetI32Array("k.arr_i32"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(f.GetU32Array("k.arr_i32").status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(f.GetI32Array("k.arr_u8")->empty());
  EXPECT_EQ(*f.GetF32Array("k.arr_f32"), (std::vector<float>{0.5f, -1.0f}));
  auto strs = f.GetStringArray("k.arr_str");
  ASSERT_TRUE(strs.ok());
  ASSERT_EQ(strs->size(), 3u);
  EXPECT_EQ((*strs)[0], "a");
  EXPECT_EQ((*strs)[1], "bc");
  EXPECT_EQ((*strs)[2], "");
  EXPECT_EQ(f.GetStringArray("k.arr_i32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetArray("k.u8").status().code(), StatusCode::kInvalidArgument);
  auto nested = f.GetArray("k.nested");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ((*nested)->element_type(), GgufType::kArray);
  auto inner = (*nested)->AsArrayOfArrays();
  ASSERT_TRUE(inner.ok());
  ASSERT_EQ(inner->size(), 2u);
  EXPECT_EQ((*(*inner)[0].AsStringArray())[1], "y");
  EXPECT_EQ(*(*inner)[1].AsIntArray<int64_t>(), (std::vector<int64_t>{9}));
  EXPECT_EQ(f.Find("k.nested")->ToString(),
            "[ARRAY x 2: [STRING x 2: \"x\", \"y\"], [INT16 x 1: 9]]");
  EXPECT_EQ(f.Find("k.str")->ToString(), "\"hello\\x0aworld\"");
  EXPECT_EQ(f.Find("k.i64")->ToString(), "-7");
}

TEST(GgufSyntheticTest, Tensors) {
  const std::vector<uint8_t> bytes = Build(ValidSpec());
  StatusOr<std::unique_ptr<GgufFile>> fo = GgufFile::Parse(bytes.data(), bytes.size(), "t.gguf");
  ASSERT_TRUE(fo.ok()) << fo.status().ToString();
  const GgufFile& f = **fo;
  ASSERT_EQ(f.tensors().size(), 7u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  for (const GgufTensor& t : f.tensors()) {
    EXPECT_EQ(static_cast<const uint8_t*>(t.data), bytes.data() + f.data_offset() + t.offset);
    EXPECT_EQ(t.offset % 32, 0u);
  }

  const GgufTensor* q = f.FindTensor("w.q8_0");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kQ8_0);
  EXPECT_EQ(q->n_dims, 2u);
  EXPECT_EQ(q->num_elements(), 192);
  EXPECT_EQ(q->bytes, 6u * 34);
  EXPECT_EQ(q->ShapeString(), "[64, 3]");
  StatusOr<WeightMatrix> m = f.GetWeightMatrix("w.q8_0", 3, 64);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->rows, 3);
  EXPECT_EQ(m->cols, 64);
  EXPECT_EQ(m->type, DType::kQ8_0);
  // Row 1 = blocks 2 and 3: value j of block k is 0.5 * (j - 16 + k).
  std::vector<float> row(64);
  cpu::GetTypeOps(DType::kQ8_0)->to_float(m->row(1), row.data(), 64);
  EXPECT_EQ(row[0], 0.5f * (0 - 16 + 2));
  EXPECT_EQ(row[63], 0.5f * (31 - 16 + 3));

  EXPECT_EQ(f.GetWeightMatrix("w.q8_0", 64, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetWeightMatrix("w.f32").status().code(), StatusCode::kInvalidArgument);  // 1-D
  EXPECT_TRUE(f.GetWeightMatrix("w.f16").ok());  // [8, 2, 1]: trailing 1 is fine
  EXPECT_EQ(f.GetWeightMatrix("w.f16")->rows, 2);
  const Status iq2 = f.GetWeightMatrix("w.iq2").status();
  EXPECT_EQ(iq2.code(), StatusCode::kUnimplemented);
  EXPECT_NE(iq2.message().find("IQ2_XXS"), std::string::npos);
  EXPECT_EQ(f.FindTensor("w.iq2")->dtype, std::nullopt);
  EXPECT_EQ(f.GetWeightMatrix("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(f.FindTensor("nope"), nullptr);

  StatusOr<WeightVector> v = f.GetF32Vector("w.f32", 4);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->data[3], 4.0f);
  EXPECT_EQ(f.GetF32Vector("w.f32", 5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetF32Vector("w.bf16").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.FindTensor("w.bf16")->dtype, DType::kBF16);
  const GgufTensor* sc = f.FindTensor("scalar");
  ASSERT_NE(sc, nullptr);
  EXPECT_EQ(sc->n_dims, 0u);
  EXPECT_EQ(sc->num_elements(), 1);
}

TEST(GgufSyntheticTest, AlignmentAndVersion2) {
  Spec s = ValidSpec();
  RemoveKv(s, "general.alignment");
  s.kvs.push_back({"general.alignment", Scalar(GgufType::kUint32, uint32_t{256})});
  s.alignment = 256;
  s.version = 2;
  const std::vector<uint8_t> bytes = Build(s);
  StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Parse(bytes.data(), bytes.size(), "a.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->alignment(), 256u);
  EXPECT_EQ((*f)->data_offset() % 256, 0u);

  // Without the key the default of 32 applies; laying out with 64 keeps offsets valid.
  Spec d = ValidSpec();
  RemoveKv(d, "general.alignment");
  d.alignment = 64;
  const std::vector<uint8_t> b2 = Build(d);
  StatusOr<std::unique_ptr<GgufFile>> f2 = GgufFile::Parse(b2.data(), b2.size(), "d.gguf");
  ASSERT_TRUE(f2.ok()) << f2.status().ToString();
  EXPECT_EQ((*f2)->alignment(), 32u);

  // Alignment 1 is legal, but float data at an odd address cannot be used in place.
  // Tensors at offsets 1 and 2: at least one of them lands off a 4-byte boundary.
  Spec o;
  o.kvs = {{"general.alignment", Scalar(GgufType::kUint32, uint32_t{1})}};
  o.alignment = 1;
  o.tensors = {{"b", 0, {1}, 1, {}}, {"c", 0, {1}, 2, {}}};
  std::vector<uint8_t> b3 = Build(o);
  std::vector<uint8_t> aligned(b3.size() + 64);
  uint8_t* base = aligned.data() + (64 - reinterpret_cast<uintptr_t>(aligned.data()) % 64);
  std::memcpy(base, b3.data(), b3.size());
  StatusOr<std::unique_ptr<GgufFile>> f3 = GgufFile::Parse(base, b3.size(), "o.gguf");
  ASSERT_TRUE(f3.ok()) << f3.status().ToString();
  int misaligned = 0;
  for (const char* name : {"b", "c"}) {
    if (reinterpret_cast<uintptr_t>((*f3)->FindTensor(name)->data) % 4 == 0) continue;
    ++misaligned;
    EXPECT_EQ((*f3)->GetF32Vector(name).status().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_GE(misaligned, 1);
}

TEST(GgufSyntheticTest, ReleaseMappedFileKeepsDataValid) {
  TempDir dir;
  const std::string path = dir.Write("r.gguf", Build(ValidSpec()));
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  const float* data = (*f)->GetF32Vector("w.f32", 4)->data;
  std::unique_ptr<MappedFile> mapping = (*f)->ReleaseMappedFile();
  ASSERT_NE(mapping, nullptr);
  EXPECT_EQ((*f)->ReleaseMappedFile(), nullptr);
  f = Status(StatusCode::kCancelled, "drop the GgufFile");
  EXPECT_EQ(mapping->size(), Build(ValidSpec()).size());
  EXPECT_EQ(data[0], 1.0f);
  EXPECT_EQ(data[3], 4.0f);
}

// Cutting the file anywhere before its last byte must give a clean error, never a crash.
TEST(GgufSyntheticTest, EveryTruncationIsACleanError) {
  const std::vector<uint8_t> bytes = Build(ValidSpec());
  ASSERT_GT(bytes.size(), 500u);
  std::vector<uint8_t> keep;
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    StatusOr<std::unique_ptr<GgufFile>> f = ParseCopy(bytes, cut, &keep);
    ASSERT_FALSE(f.ok()) << "cut at " << cut << " of " << bytes.size() << " parsed";
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << cut << ": " << f.status().ToString();
    EXPECT_EQ(f.status().message().rfind("mem.gguf: ", 0), 0u) << f.status().ToString();
  }
  ASSERT_TRUE(ParseCopy(bytes, bytes.size(), &keep).ok());

  // And through real files on disk, including the empty file.
  TempDir dir;
  for (size_t cut :
       {size_t{0}, size_t{3}, size_t{10}, size_t{30}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string p = dir.Write("cut" + std::to_string(cut) + ".gguf",
                                    std::vector<uint8_t>(bytes.begin(), bytes.begin() + cut));
    StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(p);
    ASSERT_FALSE(f.ok()) << cut;
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status().ToString();
    EXPECT_NE(f.status().message().find(p), std::string::npos) << f.status().ToString();
  }
}

// Random byte flips: any outcome but a crash (or a hang) is acceptable.
TEST(GgufSyntheticTest, RandomCorruptionNeverCrashes) {
  const std::vector<uint8_t> bytes = Build(ValidSpec());
  std::mt19937 rng(3);
  std::uniform_int_distribution<size_t> pos(0, bytes.size() - 1);
  std::uniform_int_distribution<int> val(0, 255), flips(1, 4);
  int failed = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    std::vector<uint8_t> b = bytes;
    for (int k = flips(rng); k > 0; --k) b[pos(rng)] = static_cast<uint8_t>(val(rng));
    StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Parse(b.data(), b.size(), "fuzz.gguf");
    if (!f.ok()) {
      ++failed;
      continue;
    }
    for (const GgufTensor& t : (*f)->tensors()) {  // what parsed must be inside the buffer
      ASSERT_GE(static_cast<const uint8_t*>(t.data), b.data());
      ASSERT_LE(static_cast<const uint8_t*>(t.data) + t.bytes, b.data() + b.size());
    }
  }
  EXPECT_GT(failed, 0);
}

struct Corruption {
  const char* name;
  std::function<std::vector<uint8_t>()> make;
  StatusCode code;
  const char* needle;  // must appear in the message
};

std::vector<uint8_t> WithSpec(const std::function<void(Spec&)>& edit) {
  Spec s = ValidSpec();
  edit(s);
  return Build(s);
}

std::vector<Corruption> Corruptions() {
  auto u64max = std::numeric_limits<uint64_t>::max();
  return {
      {"wrong_magic", [] { return WithSpec([](Spec& s) { s.magic = "GGML"; }); },
       StatusCode::kInvalidArgument, "not a GGUF file"},
      {"version_99", [] { return WithSpec([](Spec& s) { s.version = 99; }); },
       StatusCode::kInvalidArgument, "unsupported GGUF version 99"},
      {"version_1", [] { return WithSpec([](Spec& s) { s.version = 1; }); },
       StatusCode::kInvalidArgument, "version 1"},
      {"big_endian", [] { return WithSpec([](Spec& s) { s.version = 0x03000000; }); },
       StatusCode::kInvalidArgument, "big-endian"},
      {"absurd_tensor_count",
       [] { return WithSpec([](Spec& s) { s.n_tensors = uint64_t{1} << 60; }); },
       StatusCode::kDataLoss, "tensor_count"},
      {"tensor_count_too_high", [] { return WithSpec([](Spec& s) { s.n_tensors = 1000; }); },
       StatusCode::kDataLoss, "tensor"},
      {"absurd_kv_count", [u64max] { return WithSpec([u64max](Spec& s) { s.n_kv = u64max; }); },
       StatusCode::kDataLoss, "metadata_kv_count"},
      {"key_length_past_end",
       [] {
         // The first key's length (just after the 24-byte header) becomes 2^62.
         std::vector<uint8_t> b = Build(ValidSpec());
         const uint64_t len = uint64_t{1} << 62;
         std::memcpy(b.data() + 24, &len, 8);
         return b;
       },
       StatusCode::kDataLoss, "metadata key #0: string length 4611686018427387904"},
      {"string_value_past_end",
       [] {
         return WithSpec([](Spec& s) {
           s.kvs.insert(s.kvs.begin(),
                        {"k.s", Val{8, Bytes().Put<uint64_t>(uint64_t{1} << 62).bytes()}});
         });
       },
       StatusCode::kDataLoss, "string length 4611686018427387904"},
      {"array_count_past_end",
       [] {
         return WithSpec([](Spec& s) {
           s.kvs.insert(s.kvs.begin(), {"k.a", ArrayV(GgufType::kUint32, uint64_t{1} << 61, {})});
         });
       },
       StatusCode::kDataLoss, "array of 2305843009213693952 UINT32"},
      {"string_array_count_past_end",
       [u64max] {
         return WithSpec([u64max](Spec& s) {
           s.kvs.insert(s.kvs.begin(), {"k.a", ArrayV(GgufType::kString, u64max / 2, {})});
         });
       },
       StatusCode::kDataLoss, "STRING elements"},
      {"nested_too_deep",
       [] {
         return WithSpec([](Spec& s) {
           Bytes b;  // 100 levels of one-element arrays
           for (int i = 0; i < 100; ++i) b.Put<uint32_t>(9).Put<uint64_t>(1);
           s.kvs.insert(s.kvs.begin(), {"k.deep", Val{9, b.bytes()}});
         });
       },
       StatusCode::kDataLoss, "nested"},
      {"invalid_value_type",
       [] {
         return WithSpec([](Spec& s) { s.kvs.insert(s.kvs.begin(), {"k.bad", Val{13, {0}}}); });
       },
       StatusCode::kDataLoss, "invalid value type 13"},
      {"invalid_array_element_type",
       [] {
         return WithSpec([](Spec& s) {
           s.kvs.insert(s.kvs.begin(),
                        {"k.bad", Val{9, Bytes().Put<uint32_t>(99).Put<uint64_t>(0).bytes()}});
         });
       },
       StatusCode::kDataLoss, "invalid array element type 99"},
      {"duplicate_key",
       [] { return WithSpec([](Spec& s) {
              s.kvs.push_back({"k.u8", StrV("again")});
            }); },
       StatusCode::kDataLoss, "duplicate key"},
      {"n_dims_5", [] { return WithSpec([](Spec& s) {
                          s.tensors[1].dims = {32, 1, 1, 1, 1};
                        }); },
       StatusCode::kDataLoss, "n_dims 5 exceeds the maximum of 4"},
      {"dims_overflow",
       [] {
         return WithSpec([](Spec& s) {
           s.tensors[0].dims = {uint64_t{1} << 40, uint64_t{1} << 40};
           s.write_data = false;
         });
       },
       StatusCode::kDataLoss, "overflow"},
      {"negative_dim",
       [u64max] {
         return WithSpec([u64max](Spec& s) {
           s.tensors[0].dims = {u64max};
           s.write_data = false;
         });
       },
       StatusCode::kDataLoss, "negative or too large"},
      {"tensor_larger_than_file",
       [] {
         return WithSpec([](Spec& s) {
           s.tensors[1].dims = {uint64_t{1} << 32, uint64_t{1} << 20};
           s.write_data = false;
         });
       },
       StatusCode::kDataLoss, "larger than the whole file"},
      {"offset_past_end",
       [] { return WithSpec([](Spec& s) { s.tensors.back().offset = uint64_t{1} << 30; }); },
       StatusCode::kDataLoss, "runs past the end of the file"},
      {"offset_huge",
       [u64max] { return WithSpec([u64max](Spec& s) { s.tensors.back().offset = u64max - 31; }); },
       StatusCode::kDataLoss, "runs past the end of the file"},
      {"offset_misaligned", [] { return WithSpec([](Spec& s) { s.tensors[2].offset = 16; }); },
       StatusCode::kDataLoss, "not a multiple of the alignment 32"},
      {"removed_type_id", [] { return WithSpec([](Spec& s) { s.tensors[0].type = 4; }); },
       StatusCode::kDataLoss, "unknown ggml type id 4"},
      {"unknown_type_id", [] { return WithSpec([](Spec& s) { s.tensors[0].type = 1000; }); },
       StatusCode::kDataLoss, "unknown ggml type id 1000"},
      {"dims_not_multiple_of_block",
       [] { return WithSpec([](Spec& s) {
              s.tensors[2].dims = {33, 2};
            }); }, StatusCode::kDataLoss,
       "block size 32"},
      {"duplicate_tensor", [] { return WithSpec([](Spec& s) { s.tensors[1].name = "w.f32"; }); },
       StatusCode::kDataLoss, "duplicate tensor name"},
      {"alignment_zero",
       [] {
         return WithSpec([](Spec& s) {
           RemoveKv(s, "general.alignment");
           s.kvs.push_back({"general.alignment", Scalar(GgufType::kUint32, uint32_t{0})});
         });
       },
       StatusCode::kDataLoss, "power of two"},
      {"alignment_three",
       [] {
         return WithSpec([](Spec& s) {
           RemoveKv(s, "general.alignment");
           s.kvs.push_back({"general.alignment", Scalar(GgufType::kUint32, uint32_t{3})});
         });
       },
       StatusCode::kDataLoss, "power of two"},
      {"alignment_string",
       [] {
         return WithSpec([](Spec& s) {
           RemoveKv(s, "general.alignment");
           s.kvs.push_back({"general.alignment", StrV("32")});
         });
       },
       StatusCode::kDataLoss, "general.alignment"},
      {"no_data_section", [] { return WithSpec([](Spec& s) { s.write_data = false; }); },
       StatusCode::kDataLoss, "past the end of the file"},
  };
}

TEST(GgufCorruptTest, EveryCorruptionIsACleanError) {
  TempDir dir;
  for (const Corruption& c : Corruptions()) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.Write(std::string(c.name) + ".gguf", c.make());
    StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
    ASSERT_FALSE(f.ok()) << "parsed without error";
    EXPECT_EQ(f.status().code(), c.code) << f.status().ToString();
    EXPECT_NE(f.status().message().find(c.needle), std::string::npos) << f.status().ToString();
    EXPECT_EQ(f.status().message().rfind(path + ": ", 0), 0u)
        << "message should start with the path: " << f.status().ToString();
  }
}

TEST(GgufCorruptTest, FieldIsNamed) {
  TempDir dir;
  const std::string p1 = dir.Write("dims.gguf", WithSpec([](Spec& s) {
                                     s.tensors[1].dims = {32, 1, 1, 1, 1};
                                   }));
  EXPECT_NE(GgufFile::Open(p1).status().message().find("tensor 'w.q8_0' (#1)"), std::string::npos);
  const std::string p2 = dir.Write("kv.gguf", WithSpec([](Spec& s) {
                                     s.kvs.insert(s.kvs.begin() + 1, {"k.bad", Val{77, {}}});
                                   }));
  EXPECT_NE(GgufFile::Open(p2).status().message().find("metadata key 'k.bad' (#1)"),
            std::string::npos)
      << GgufFile::Open(p2).status().ToString();
  EXPECT_EQ(GgufFile::Open(dir.path().string()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GgufFile::Open("/no/such/file.gguf").status().code(), StatusCode::kNotFound);
}

// ---- the real model ----

class GgufModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(ModelPath())) GTEST_SKIP() << "model not present: " << ModelPath();
    auto f = GgufFile::Open(ModelPath());
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_ = std::move(*f);
  }
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufModelTest, Metadata) {
  const GgufFile& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetU32("llama.block_count"), 30u);
  EXPECT_EQ(*f.GetU32("llama.context_length"), 8192u);
  EXPECT_EQ(*f.GetU32("llama.embedding_length"), 576u);
  EXPECT_EQ(*f.GetU32("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(*f.GetU32("llama.attention.head_count"), 9u);
  EXPECT_EQ(*f.GetU32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(*f.GetU32("llama.rope.dimension_count"), 64u);
  EXPECT_EQ(*f.GetU32("llama.vocab_size"), 49152u);
  EXPECT_EQ(*f.GetF32("llama.rope.freq_base"), 100000.0f);
  EXPECT_FLOAT_EQ(*f.GetF32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(*f.GetI64("llama.block_count"), 30);
  EXPECT_EQ(*f.GetU32("general.file_type"), 3u);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f.GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(*f.GetBool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(*f.GetU32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*f.GetU32("tokenizer.ggml.eos_token_id"), 2u);
  auto tmpl = f.GetString("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_NE(tmpl->find("<|im_start|>"), std::string_view::npos);

  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  ASSERT_EQ(tokens->size(), 49152u);
  EXPECT_EQ((*tokens)[0], "<|endoftext|>");
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ((*tokens)[2], "<|im_end|>");
  EXPECT_EQ((*tokens)[49151], "ectable");
  auto merges = f.GetStringArray("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok());
  ASSERT_EQ(merges->size(), 48900u);
  EXPECT_EQ((*merges)[0], "\xC4\xA0 t");  // "Ġ t"
  auto types = f.GetI32Array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  ASSERT_EQ(types->size(), 49152u);
  EXPECT_EQ((*types)[0], 3);
  EXPECT_EQ((*types)[19], 1);
  EXPECT_EQ(f.GetF32Array("tokenizer.ggml.scores").status().code(), StatusCode::kNotFound);
}

TEST_F(GgufModelTest, Tensors) {
  const GgufFile& f = *file_;
  ASSERT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.data_offset(), 1785664u);
  std::map<std::string, int> by_type;
  for (const GgufTensor& t : f.tensors()) {
    ASSERT_TRUE(t.dtype.has_value()) << t.name;
    by_type[std::string(DTypeName(*t.dtype))]++;
    EXPECT_EQ(t.bytes, RowBytes(*t.dtype, t.num_elements())) << t.name;
    EXPECT_LE(f.data_offset() + t.offset + t.bytes, f.file_size()) << t.name;
  }
  EXPECT_EQ(by_type["Q4_1"], 210);
  EXPECT_EQ(by_type["F32"], 61);
  EXPECT_EQ(by_type["Q8_0"], 1);

  const GgufTensor* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kQ8_0);
  EXPECT_EQ(emb->ggml_type, ggml_type_id::kQ8_0);
  EXPECT_EQ(emb->ShapeString(), "[576, 49152]");
  EXPECT_EQ(emb->offset, 0u);
  EXPECT_EQ(f.FindTensor("output.weight"), nullptr);  // tied to the embedding
  auto e = f.GetWeightMatrix("token_embd.weight", 49152, 576);
  ASSERT_TRUE(e.ok()) << e.status().ToString();

  const int64_t dim = 576, hidden = 1536, kv_dim = 192;
  for (int l = 0; l < 30; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    SCOPED_TRACE(p);
    struct {
      const char* name;
      int64_t rows, cols;
    } mats[] = {{"attn_q.weight", dim, dim},      {"attn_k.weight", kv_dim, dim},
                {"attn_v.weight", kv_dim, dim},   {"attn_output.weight", dim, dim},
                {"ffn_gate.weight", hidden, dim}, {"ffn_up.weight", hidden, dim},
                {"ffn_down.weight", dim, hidden}};
    for (const auto& m : mats) {
      auto w = f.GetWeightMatrix(p + m.name, m.rows, m.cols);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      EXPECT_EQ(w->type, DType::kQ4_1);
    }
    EXPECT_TRUE(f.GetF32Vector(p + "attn_norm.weight", dim).ok());
    EXPECT_TRUE(f.GetF32Vector(p + "ffn_norm.weight", dim).ok());
  }
  auto norm = f.GetF32Vector("output_norm.weight", dim);
  ASSERT_TRUE(norm.ok());
  for (int i = 0; i < dim; ++i) ASSERT_TRUE(std::isfinite(norm->data[i]));
}

// The real header cut at many points (all boundaries near the start, then spread over the
// metadata, the tensor infos and the data): always a clean DataLoss.
TEST_F(GgufModelTest, TruncatedCopiesFailCleanly) {
  auto mapping = MappedFile::Open(ModelPath());
  ASSERT_TRUE(mapping.ok());
  const std::vector<uint8_t> head((*mapping)->data(),
                                  (*mapping)->data() + file_->data_offset() + 4096);
  std::vector<size_t> cuts;
  for (size_t c = 0; c < 200; ++c) cuts.push_back(c);
  for (size_t c = 200; c < file_->data_offset(); c += 7919) cuts.push_back(c);
  for (size_t c = file_->data_offset() - 64; c < file_->data_offset() + 64; ++c) cuts.push_back(c);
  std::vector<uint8_t> keep;
  for (size_t cut : cuts) {
    StatusOr<std::unique_ptr<GgufFile>> f = ParseCopy(head, cut, &keep);
    ASSERT_FALSE(f.ok()) << cut;
    ASSERT_EQ(f.status().code(), StatusCode::kDataLoss) << cut << ": " << f.status().ToString();
  }
  // Cut inside the tensor data (the file mapped as is, with a shorter size).
  for (size_t cut : {file_->data_offset() + 100, file_->file_size() / 2, file_->file_size() - 1}) {
    StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Parse((*mapping)->data(), cut, "cut.gguf");
    ASSERT_FALSE(f.ok()) << cut;
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(f.status().message().find("cut.gguf: tensor '"), std::string::npos)
        << f.status().ToString();
  }
}

}  // namespace
}  // namespace specinfer
