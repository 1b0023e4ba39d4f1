// For harnesses whose parser reads a file by path: the fuzz input as an in-memory file
// (memfd_create), named by its /proc/self/fd path, so no fuzzing run writes to the disk.
// One per input; the descriptor is closed on destruction. Not thread-safe (nothing here is).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace specinfer::fuzz {

class FuzzFile {
 public:
  FuzzFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("specinfer-fuzz", MFD_CLOEXEC);
    for (size_t done = 0; fd_ >= 0 && done < size;) {
      const ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
  }
  ~FuzzFile() {
    if (fd_ >= 0) close(fd_);
  }
  FuzzFile(const FuzzFile&) = delete;
  FuzzFile& operator=(const FuzzFile&) = delete;

  bool ok() const { return fd_ >= 0; }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

}  // namespace specinfer::fuzz
