#include "model/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

namespace specinfer {

namespace {

using Json = nlohmann::json;

// Far beyond any real header (a 1000-layer model's is well under 1 MB): a larger value is a
// corrupt or hostile file, and we refuse before parsing it.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeInfo {
  std::string_view name;
  size_t bytes;
  std::optional<DType> dtype;
};

// Every dtype the safetensors format defines.
constexpr DTypeInfo kDTypes[] = {
    {"F64", 8, std::nullopt},  {"F32", 4, DType::kF32},      {"F16", 2, DType::kF16},
    {"BF16", 2, DType::kBF16}, {"I64", 8, std::nullopt},     {"U64", 8, std::nullopt},
    {"I32", 4, std::nullopt},  {"U32", 4, std::nullopt},     {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},  {"I8", 1, std::nullopt},      {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

const DTypeInfo* FindDType(std::string_view name) {
  for (const DTypeInfo& d : kDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

// Reads a non-negative JSON integer that fits in int64.
std::optional<int64_t> NonNegative(const Json& j) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

std::string Quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

}  // namespace

int64_t SafetensorsTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated not to overflow at Open
  return n;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  SI_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  return FromMappedFile(std::move(file));
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromMappedFile(
    std::unique_ptr<MappedFile> file) {
  const std::string where = "safetensors " + Quote(file->path());
  ByteReader reader(file->data(), file->size(), where);
  uint64_t header_len = 0;
  SI_RETURN_IF_ERROR(reader.Read(&header_len));  // the format is little-endian, as are we
  if (header_len > kMaxHeaderBytes) {
    return DataLossError(where + ": header length " + std::to_string(header_len) +
                         " bytes is absurd (limit " + std::to_string(kMaxHeaderBytes) + ")");
  }
  if (header_len > reader.remaining()) {
    return DataLossError(where + ": header length " + std::to_string(header_len) +
                         " is past the end of the file (" + std::to_string(file->size()) +
                         " bytes)");
  }
  SI_ASSIGN_OR_RETURN(const uint8_t* header, reader.Take(static_cast<size_t>(header_len)));
  const uint8_t* data_start = reader.current();
  const size_t data_size = reader.remaining();

  // Parse, noting repeated top-level keys (nlohmann would silently keep the last one).
  std::set<std::string> seen;
  std::string duplicate;
  Json::parser_callback_t cb = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  const char* text = reinterpret_cast<const char*>(header);
  Json j = Json::parse(text, text + header_len, cb, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLossError(where + ": the header is not valid JSON");
  if (!j.is_object()) return DataLossError(where + ": the header is not a JSON object");
  if (!duplicate.empty())
    return InvalidArgumentError(where + ": tensor " + Quote(duplicate) + " appears twice");

  std::unique_ptr<SafetensorsFile> out(new SafetensorsFile());
  out->path_ = file->path();
  for (const auto& [name, entry] : j.items()) {
    const std::string what = where + ": tensor " + Quote(name);
    if (name == "__metadata__") {
      if (!entry.is_object()) return DataLossError(where + ": __metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          return DataLossError(where + ": __metadata__ value " + Quote(k) + " is not a string");
        out->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return DataLossError(what + " is not described by an object");
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string())
      return DataLossError(what + " has no string 'dtype'");
    if (shape_it == entry.end() || !shape_it->is_array())
      return DataLossError(what + " has no 'shape' array");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      return DataLossError(what + " has no 'data_offsets' pair");

    SafetensorsTensor t;
    t.name = name;
    t.dtype_name = dtype_it->get<std::string>();
    const DTypeInfo* info = FindDType(t.dtype_name);
    if (info == nullptr)
      return UnimplementedError(what + " has unknown dtype " + Quote(t.dtype_name));
    t.dtype = info->dtype;

    if (shape_it->size() > 8) return DataLossError(what + " has too many dimensions");
    uint64_t elements = 1;
    for (const Json& d : *shape_it) {
      std::optional<int64_t> v = NonNegative(d);
      if (!v) return DataLossError(what + ": shape " + shape_it->dump() + " is not valid");
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(*v), &elements))
        return DataLossError(what + ": shape " + shape_it->dump() + " overflows");
      t.shape.push_back(*v);
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(info->bytes), &bytes) ||
        bytes > static_cast<uint64_t>(INT64_MAX))
      return DataLossError(what + ": shape " + shape_it->dump() + " overflows");

    std::optional<int64_t> begin = NonNegative((*offsets_it)[0]);
    std::optional<int64_t> end = NonNegative((*offsets_it)[1]);
    if (!begin || !end || *begin > *end)
      return DataLossError(what + ": data_offsets " + offsets_it->dump() + " are not valid");
    if (static_cast<uint64_t>(*end) > data_size) {
      return DataLossError(what + ": data_offsets " + offsets_it->dump() +
                           " are past the end of the data (" + std::to_string(data_size) +
                           " bytes)");
    }
    if (static_cast<uint64_t>(*end - *begin) != bytes) {
      return DataLossError(what + ": data_offsets " + offsets_it->dump() + " span " +
                           std::to_string(*end - *begin) + " bytes but shape " + shape_it->dump() +
                           " of " + t.dtype_name + " needs " + std::to_string(bytes));
    }
    t.data = data_start + *begin;
    t.size_bytes = static_cast<size_t>(bytes);
    if (bytes != 0 && reinterpret_cast<uintptr_t>(t.data) % info->bytes != 0) {
      return DataLossError(what + ": data at file offset " + std::to_string(t.data - file->data()) +
                           " is not aligned for " + t.dtype_name);
    }
    out->tensors_.push_back(std::move(t));
  }

  std::sort(out->tensors_.begin(), out->tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.data != b.data ? a.data < b.data : a.size_bytes < b.size_bytes;
            });
  const SafetensorsTensor* prev = nullptr;
  for (size_t i = 0; i < out->tensors_.size(); ++i) {
    const SafetensorsTensor& t = out->tensors_[i];
    if (t.size_bytes == 0) continue;
    if (prev != nullptr && t.data < prev->data + prev->size_bytes) {
      return DataLossError(where + ": tensors " + Quote(prev->name) + " and " + Quote(t.name) +
                           " overlap");
    }
    prev = &t;
  }
  for (size_t i = 0; i < out->tensors_.size(); ++i) out->index_[out->tensors_[i].name] = i;
  out->file_ = std::move(file);
  return out;
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<const SafetensorsTensor*> SafetensorsFile::Get(std::string_view name) const {
  const SafetensorsTensor* t = Find(name);
  if (t == nullptr)
    return NotFoundError("safetensors " + Quote(path_) + " has no tensor " + Quote(name));
  return t;
}

// ---------------------------------------------------------------------------------------------

Status SafetensorsSet::Add(std::unique_ptr<SafetensorsFile> file) {
  for (const SafetensorsTensor& t : file->tensors()) {
    if (!index_.emplace(t.name, &t).second) {
      return InvalidArgumentError(where_ + ": tensor " + Quote(t.name) +
                                  " is stored twice (again in " + Quote(file->path()) + ")");
    }
  }
  files_.push_back(std::move(file));
  return Status::Ok();
}

StatusOr<std::unique_ptr<SafetensorsSet>> SafetensorsSet::OpenFile(const std::string& path) {
  std::unique_ptr<SafetensorsSet> set(new SafetensorsSet());
  set->where_ = "safetensors " + Quote(path);
  SI_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  SI_RETURN_IF_ERROR(set->Add(std::move(file)));
  return set;
}

StatusOr<std::unique_ptr<SafetensorsSet>> SafetensorsSet::OpenDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec)) {
      return NotFoundError("'" + dir + "' has neither model.safetensors nor " +
                           "model.safetensors.index.json");
    }
    return OpenFile(single_path.string());
  }

  const std::string where = "safetensors index " + Quote(index_path.string());
  SI_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path.string()));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLossError(where + " is not valid JSON");
  if (!j.is_object()) return DataLossError(where + " is not a JSON object");
  auto map_it = j.find("weight_map");
  if (map_it == j.end() || !map_it->is_object() || map_it->empty())
    return DataLossError(where + " has no 'weight_map' object");

  // Shard name -> tensors it should hold, in a stable order; each shard is opened once.
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string())
      return DataLossError(where + ": the shard of tensor " + Quote(tensor) + " is not a string");
    const std::string name = shard.get<std::string>();
    // Plain file names only: an index must not reach outside its directory.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\\') != std::string::npos) {
      return DataLossError(where + ": shard " + Quote(name) + " of tensor " + Quote(tensor) +
                           " is not a file name in the model directory");
    }
    shards[name].push_back(tensor);
  }

  std::unique_ptr<SafetensorsSet> set(new SafetensorsSet());
  set->where_ = "safetensors checkpoint " + Quote(dir);
  for (const auto& [name, tensors] : shards) {
    auto file = SafetensorsFile::Open((fs::path(dir) / name).string());
    if (!file.ok()) return file.status().WithContext(where);
    for (const std::string& t : tensors) {
      if ((*file)->Find(t) == nullptr) {
        return DataLossError(where + " puts tensor " + Quote(t) + " in shard " + Quote(name) +
                             ", which does not hold it");
      }
    }
    SI_RETURN_IF_ERROR(set->Add(std::move(file).value()));
  }
  return set;
}

const SafetensorsTensor* SafetensorsSet::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

StatusOr<const SafetensorsTensor*> SafetensorsSet::Get(std::string_view name) const {
  const SafetensorsTensor* t = Find(name);
  if (t == nullptr) return NotFoundError(where_ + " has no tensor " + Quote(name));
  return t;
}

std::vector<std::unique_ptr<MappedFile>> SafetensorsSet::ReleaseMappedFiles() {
  std::vector<std::unique_ptr<MappedFile>> out;
  for (auto& f : files_) {
    std::unique_ptr<MappedFile> m = f->ReleaseMappedFile();
    if (m != nullptr) out.push_back(std::move(m));
  }
  return out;
}

}  // namespace specinfer
