// Read-only memory-mapped file, and a bounds-checked cursor for parsing binary headers.
//
// Model weights are used in place from the mapping: no copy of the whole file is made.
// Thread safety: a MappedFile is immutable after Open and may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include "specinfer/status.h"

namespace specinfer {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound if it does not exist, Unavailable for other I/O errors,
  // DataLoss if it is empty.
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Reads every page of the mapping once, so the first forward pass does not stall on page
  // faults. Calls progress(fraction done) now and then (may be null). Returns the bytes read.
  size_t Prefault(const std::function<void(double)>& progress) const;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Sequential reader over a byte span. Every read checks the remaining length, so a truncated or
// lying header yields DataLoss instead of an out-of-bounds read.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, std::string what = "file")
      : data_(data), size_(size), what_(std::move(what)) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  const uint8_t* current() const { return data_ + pos_; }

  template <typename T>
  Status Read(T* out) {
    static_assert(std::is_trivially_copyable_v<T>);
    SI_RETURN_IF_ERROR(Require(sizeof(T)));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  // Returns a pointer to the next `n` bytes and advances past them.
  StatusOr<const uint8_t*> Take(size_t n) {
    SI_RETURN_IF_ERROR(Require(n));
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  Status Skip(size_t n) { return Take(n).status(); }

  Status Seek(size_t offset) {
    if (offset > size_) {
      return DataLossError(what_ + ": offset " + std::to_string(offset) + " is past the end (" +
                           std::to_string(size_) + " bytes)");
    }
    pos_ = offset;
    return Status::Ok();
  }

 private:
  Status Require(size_t n) const {
    if (n > size_ - pos_) {
      return DataLossError(what_ + " is truncated: needed " + std::to_string(n) +
                           " bytes at offset " + std::to_string(pos_) + ", only " +
                           std::to_string(size_ - pos_) + " remain");
    }
    return Status::Ok();
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string what_;
};

// Reads a whole (small) file into a string.
StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace specinfer
