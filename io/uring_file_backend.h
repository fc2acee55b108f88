// The file engine's internals shared by its two sources: the two ways its I/O thread moves a
// block (io_uring; pread/pwrite), the checksum sidecar (format in uring_file.h), and errno
// wording. Not for use outside io/uring_file*.
#pragma once
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/uring_file.h"

namespace strata {

constexpr size_t kDirectAlign = 4096;  // offsets, lengths and buffers under O_DIRECT

struct FileEngine::Backend {
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool async() const = 0;
  virtual bool fixed() const { return false; }
  // Hands one transfer to the kernel (io_uring) or does it (pread). Completions come back
  // through `ready` (synchronous backends) or wait().
  // `fixed`: the registered buffer that holds addr, or -1. `buf` comes back with the result.
  virtual void queue(bool write, int buf, int fixed, int fd, unsigned char* addr, size_t len, uint64_t off,
                     std::deque<std::pair<int, int64_t>>& ready) = 0;
  // Registers these buffers (staging first, then the caller's) in place of the previous ones.
  virtual bool register_buffers(const std::vector<iovec>& iov) { return false; }
  virtual void submit() {}
  // Waits for completions (at most timeout_us; < 0: until one comes) and reports each as
  // (buffer, result).
  virtual void wait(long timeout_us, const std::function<void(int, int64_t)>& on) {}
};

std::unique_ptr<FileEngine::Backend> file_backend_pread();
// An io_uring of `depth` entries; nullptr when io_uring cannot be used, with *why saying so
// ("" when strata was built without liburing).
std::unique_ptr<FileEngine::Backend> file_backend_uring(unsigned depth, std::string* why);

// `<path>.crc32c`: load (checks magic, length, its own checksum and the block size) and store
// (a temporary file, fsync, rename). Each returns "" or what went wrong.
std::string file_sidecar_load(const std::string& path, size_t block_bytes, std::vector<uint32_t>* crc,
                              uint64_t* size);
std::string file_sidecar_store(const std::string& path, size_t block_bytes, uint64_t size,
                               const std::vector<uint32_t>& crc, uint32_t zero_crc);

const char* file_errno_name(int err);  // "EIO", "ENOSPC", ...
const char* file_errno_hint(int err);  // "; what to do", or ""

}  // namespace strata
