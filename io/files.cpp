#include "io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "src/core/error.h"

namespace strata {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// fsync of an open descriptor; EINVAL is tolerated for directories.
void fsync_fd_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  STRATA_CHECK_IO(fd >= 0, "cannot open ", path, " to fsync it: ", errno_text(errno));
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  STRATA_CHECK_IO(rc == 0 || (directory && err == EINVAL), "cannot fsync ", directory ? "directory " : "", path, ": ",
                  errno_text(err));
}

}  // namespace

std::string file_read(const std::string& path, const std::string& what, const std::string& hint, ErrorKind if_absent) {
  const std::string tail = hint.empty() ? std::string() : "; " + hint;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const bool absent = err == ENOENT || err == ENOTDIR;
    throw Error(absent ? if_absent : ErrorKind::io,
                str_cat("cannot open ", what, " ", path, ": ", errno_text(err), tail));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    const int err = S_ISDIR(st.st_mode) ? EISDIR : errno;
    ::close(fd);
    throw Error(err == EISDIR ? if_absent : ErrorKind::io,
                str_cat("cannot read ", what, " ", path, ": ", errno_text(err), tail));
  }
  // st_size is a hint (files in /proc say 0): read to the end, and a regular file that ends before
  // the size it had when opened is a short read.
  std::string out;
  out.resize(S_ISREG(st.st_mode) ? size_t(st.st_size) : 0);
  size_t got = 0;
  for (;;) {
    if (got == out.size()) out.resize(std::max<size_t>(4096, out.size() * 2));
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(ErrorKind::io, str_cat("cannot read ", what, " ", path, " at byte ", got, ": ", errno_text(err)));
    }
    if (n == 0) break;
    got += size_t(n);
  }
  ::close(fd);
  if (S_ISREG(st.st_mode) && got < size_t(st.st_size))
    throw Error(ErrorKind::io, str_cat("short read of ", what, " ", path, ": ", got, " of ", st.st_size,
                                       " bytes (did the file change while it was read?)"));
  out.resize(got);
  return out;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_CHECK_IO(fd_ >= 0, "cannot create ", tmp_, ": ", errno_text(errno),
                  " (check that the directory exists and is writable)");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t chunk = std::min<size_t>(bytes, size_t(1) << 30);
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;  // write() returning 0 for a non-empty buffer: no space
      throw Error(ErrorKind::io, str_cat("cannot write ", tmp_, " at byte offset ", written_, ": ", errno_text(err),
                                         w == 0 ? " (short write)" : ""));
    }
    p += w;
    bytes -= size_t(w);
    written_ += uint64_t(w);
  }
}

void AtomicFile::commit() {
  STRATA_CHECK_IO(::fsync(fd_) == 0, "cannot fsync ", tmp_, ": ", errno_text(errno));
  const int fd = fd_;
  fd_ = -1;
  STRATA_CHECK_IO(::close(fd) == 0, "cannot close ", tmp_, ": ", errno_text(errno));
  STRATA_CHECK_IO(::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename ", tmp_, " to ", path_, ": ",
                  errno_text(errno));
  committed_ = true;
  fsync_dir(std::filesystem::path(path_).parent_path().string());
}

void file_write_atomic(const std::string& path, const void* data, size_t bytes) {
  AtomicFile f(path);
  f.write(data, bytes);
  f.commit();
}

void fsync_dir(const std::string& dir) { fsync_fd_path(dir.empty() ? "." : dir, true); }
void fsync_file(const std::string& path) { fsync_fd_path(path, false); }

}  // namespace strata
