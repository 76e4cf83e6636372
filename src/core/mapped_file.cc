#include "slim/core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "slim/core/error.h"

namespace slim {

namespace {

// Opens a regular file for reading; throws not_found / invalid_argument naming it.
int open_regular_file(const std::string& path, size_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(ErrorCode::not_found, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorCode::invalid_argument, path + ": not a regular file");
  }
  *size = size_t(st.st_size);
  return fd;
}

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path, bool populate) {
  size_t size = 0;
  const int fd = open_regular_file(path, &size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(ErrorCode::resource_exhausted, path + ": mmap failed: " + std::strerror(err));
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(new MappedFile(path, data, size, size));
}

std::shared_ptr<const MappedFile> MappedFile::read_resident(
    const std::string& path, const std::function<void(const MappedFile& file, uint8_t* data)>& prepare) {
  size_t size = 0;
  const int fd = open_regular_file(path, &size);
  if (size == 0) {
    ::close(fd);
    return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0, 0));
  }
  constexpr size_t kHugePage = size_t(2) << 20;
  const size_t mapped = (size + kHugePage - 1) / kHugePage * kHugePage;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw Error(ErrorCode::resource_exhausted, path + ": cannot allocate " + std::to_string(size) +
                                                   " bytes for the file: " + std::strerror(err));
  }
  ::madvise(p, mapped, MADV_HUGEPAGE);  // advisory: without THP the copy still works
  size_t done = 0;
  while (done < size) {
    const ssize_t r = ::pread(fd, static_cast<uint8_t*>(p) + done, std::min<size_t>(size - done, size_t(1) << 30),
                              off_t(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : EIO;
      ::close(fd);
      ::munmap(p, mapped);
      throw Error(ErrorCode::invalid_argument, path + ": read failed at byte " + std::to_string(done) + ": " +
                                                   std::strerror(err));
    }
    done += size_t(r);
  }
  ::close(fd);
  std::shared_ptr<const MappedFile> file(new MappedFile(path, static_cast<const uint8_t*>(p), size, mapped));
  if (prepare) prepare(*file, static_cast<uint8_t*>(p));
  ::mprotect(p, mapped, PROT_READ);
  return file;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), mapped_);
}

}  // namespace slim
