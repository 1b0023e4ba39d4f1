// Safetensors files (Hugging Face's tensor container), read in place from a mapping.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the data region; offsets are relative to the start of the data region (8 + N).
//
// Open validates everything before any tensor is handed out: the header length (against the
// file size and a 100 MB cap), the JSON, each entry's fields, that [begin, end) lies inside the
// data region, matches shape x dtype size and is aligned for the dtype, that no two tensors
// overlap and no name repeats. A corrupt file is a DataLoss (or InvalidArgument for repeated
// names) naming the file and the tensor; a dtype that safetensors does not define is
// Unimplemented. Nothing is copied: tensors point into the mapping.
//
// A sharded checkpoint (model.safetensors.index.json, {"weight_map": {tensor: shard file}}) is
// opened as a SafetensorsSet, which maps each shard once.
//
// Thread safety: immutable after Open; may be read from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "specinfer/status.h"
#include "tensor/dtype.h"

namespace specinfer {

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;         // as written: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;     // set for F32, F16, BF16 (the types weights may use)
  std::vector<int64_t> shape;     // outermost first (row-major), as PyTorch writes it
  const uint8_t* data = nullptr;  // [product(shape) * element size] bytes, in the mapping
  size_t size_bytes = 0;

  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors: see the file comment; NotFound if the file is missing.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Validates an already mapped file (takes ownership).
  static StatusOr<std::unique_ptr<SafetensorsFile>> FromMappedFile(
      std::unique_ptr<MappedFile> file);

  const std::string& path() const { return path_; }
  // In file order of their data offsets.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(std::string_view name) const;
  // NotFound naming the file and the tensor if absent.
  StatusOr<const SafetensorsTensor*> Get(std::string_view name) const;
  // "__metadata__" (string values only).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Hands the mapping to a longer-lived owner (a Model); tensors keep pointing into it.
  std::unique_ptr<MappedFile> ReleaseMappedFile() { return std::move(file_); }

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::unique_ptr<MappedFile> file_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// The tensors of a whole checkpoint: a single model.safetensors, or the shards listed by
// model.safetensors.index.json.
class SafetensorsSet {
 public:
  // Opens `dir`/model.safetensors.index.json if present (each shard it names once), else
  // `dir`/model.safetensors. NotFound if neither exists; DataLoss if the index is malformed,
  // names a file outside `dir`, or names a tensor its shard lacks; InvalidArgument if two shards
  // hold the same tensor.
  static StatusOr<std::unique_ptr<SafetensorsSet>> OpenDirectory(const std::string& dir);
  // Opens one file.
  static StatusOr<std::unique_ptr<SafetensorsSet>> OpenFile(const std::string& path);

  size_t num_files() const { return files_.size(); }
  const SafetensorsTensor* Find(std::string_view name) const;
  // NotFound naming the checkpoint and the tensor if absent.
  StatusOr<const SafetensorsTensor*> Get(std::string_view name) const;
  // Releases every mapping (for a Model to adopt).
  std::vector<std::unique_ptr<MappedFile>> ReleaseMappedFiles();

  const std::string& where() const { return where_; }

 private:
  SafetensorsSet() = default;
  Status Add(std::unique_ptr<SafetensorsFile> file);

  std::string where_;  // the directory or file, for messages
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> index_;
};

}  // namespace specinfer
