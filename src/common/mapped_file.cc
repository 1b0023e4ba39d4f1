#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

namespace specinfer {

namespace {
Status ErrnoStatus(const std::string& path, int err) {
  std::string msg = "cannot open '" + path + "': " + std::strerror(err);
  if (err == ENOENT) return NotFoundError(msg);
  if (err == EACCES) return Status(StatusCode::kPermissionDenied, msg);
  return UnavailableError(msg);
}
}  // namespace

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(path, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError("'" + path + "' is a directory, expected a file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    return DataLossError("'" + path + "' is empty");
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return ErrnoStatus(path, err);
  return std::unique_ptr<MappedFile>(new MappedFile(path, static_cast<const uint8_t*>(p), size));
}

size_t MappedFile::Prefault(const std::function<void(double)>& progress) const {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t chunk = size_t{16} << 20;
  ::madvise(const_cast<uint8_t*>(data_), size_, MADV_WILLNEED);
  volatile uint8_t sink = 0;
  for (size_t begin = 0; begin < size_; begin += chunk) {
    const size_t end = std::min(size_, begin + chunk);
    for (size_t off = begin; off < end; off += page) sink = sink + data_[off];
    if (progress) progress(static_cast<double>(end) / static_cast<double>(size_));
  }
  (void)sink;
  return size_;
}

MappedFile::~MappedFile() { ::munmap(const_cast<uint8_t*>(data_), size_); }

StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(path, errno ? errno : ENOENT);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace specinfer
