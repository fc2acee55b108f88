#include "io/uring_file_backend.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "io/checksum.h"
#include "src/core/error.h"

#if defined(STRATA_HAVE_URING)
#include <liburing.h>
#endif

namespace strata {

const char* file_errno_name(int err) {
  switch (err) {
    case EIO: return "EIO";
    case ENOSPC: return "ENOSPC";
    case EFBIG: return "EFBIG";
    case EINVAL: return "EINVAL";
    case EDQUOT: return "EDQUOT";
    case EROFS: return "EROFS";
    case EBADF: return "EBADF";
    default: return "errno";
  }
}

const char* file_errno_hint(int err) {
  switch (err) {
    case ENOSPC: return "; free space on that disk or point offload.nvme_path at a larger one";
    case EDQUOT: return "; the disk quota is exhausted: free space or raise the quota";
    case EFBIG: return "; the file outgrew the filesystem's (or RLIMIT_FSIZE's) largest file";
    case EINVAL: return "; the kernel refused the request (direct-I/O alignment: strata aligns to 4096 bytes)";
    case EIO: return "; the device reported an error: check `dmesg` and the disk's health";
    default: return "";
  }
}

namespace {

struct PreadBackend final : FileEngine::Backend {
  const char* name() const override { return "pread"; }
  bool async() const override { return false; }
  void queue(bool write, int buf, int, int fd, unsigned char* addr, size_t len, uint64_t off,
             std::deque<std::pair<int, int64_t>>& ready) override {
    ssize_t n;
    do {
      n = write ? ::pwrite(fd, addr, len, off_t(off)) : ::pread(fd, addr, len, off_t(off));
    } while (n < 0 && errno == EINTR);
    ready.emplace_back(buf, n < 0 ? -int64_t(errno) : int64_t(n));
  }
};

#if defined(STRATA_HAVE_URING)
struct UringBackend final : FileEngine::Backend {
  io_uring ring{};
  bool live = false;  // io_uring_queue_init succeeded
  bool fixed_ = false;
  unsigned pending = 0;  // prepared, not yet submitted

  ~UringBackend() override {
    if (live) io_uring_queue_exit(&ring);
  }
  const char* name() const override { return "io_uring"; }
  bool async() const override { return true; }
  bool fixed() const override { return fixed_; }

  bool register_buffers(const std::vector<iovec>& iov) override {
    if (fixed_) io_uring_unregister_buffers(&ring);
    fixed_ = io_uring_register_buffers(&ring, iov.data(), unsigned(iov.size())) == 0;
    return fixed_;
  }
  void queue(bool write, int buf, int fixed, int fd, unsigned char* addr, size_t len, uint64_t off,
             std::deque<std::pair<int, int64_t>>&) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (!sqe) {  // never with <= queue_depth pieces, but cheap to survive
      submit();
      sqe = io_uring_get_sqe(&ring);
    }
    STRATA_ASSERT(sqe, "io_uring submission queue full");
    if (fixed_ && fixed >= 0 && write) io_uring_prep_write_fixed(sqe, fd, addr, unsigned(len), off, fixed);
    else if (fixed_ && fixed >= 0) io_uring_prep_read_fixed(sqe, fd, addr, unsigned(len), off, fixed);
    else if (write) io_uring_prep_write(sqe, fd, addr, unsigned(len), off);
    else io_uring_prep_read(sqe, fd, addr, unsigned(len), off);
    io_uring_sqe_set_data64(sqe, uint64_t(buf));
    ++pending;
  }
  void submit() override {
    while (pending > 0) {
      const int n = io_uring_submit(&ring);
      if (n >= 0) {
        pending -= std::min<unsigned>(pending, unsigned(n));
        continue;
      }
      STRATA_ASSERT(n == -EINTR || n == -EAGAIN || n == -EBUSY, "io_uring_submit: ", std::strerror(-n));
    }
  }
  void wait(long timeout_us, const std::function<void(int, int64_t)>& on) override {
    io_uring_cqe* cqe = nullptr;
    int rc;
    if (timeout_us < 0) {
      do rc = io_uring_wait_cqe(&ring, &cqe); while (rc == -EINTR);
    } else {
      __kernel_timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000};
      rc = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
      if (rc == -ETIME || rc == -EINTR) return;
    }
    STRATA_ASSERT(rc == 0, "io_uring_wait_cqe: ", std::strerror(-rc));
    unsigned seen = 0, head;
    io_uring_for_each_cqe(&ring, head, cqe) {
      on(int(io_uring_cqe_get_data64(cqe)), int64_t(cqe->res));
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
  }
};
#endif

}  // namespace

std::unique_ptr<FileEngine::Backend> file_backend_pread() { return std::make_unique<PreadBackend>(); }

std::unique_ptr<FileEngine::Backend> file_backend_uring(unsigned depth, std::string* why) {
#if defined(STRATA_HAVE_URING)
  auto u = std::make_unique<UringBackend>();
  const int rc = io_uring_queue_init(depth, &u->ring, 0);
  if (rc != 0) {
    *why = str_cat("io_uring_setup: ", std::strerror(-rc));
    return nullptr;
  }
  u->live = true;
  return u;
#else
  *why = "";
  return nullptr;
#endif
}

namespace {
constexpr char kSidecarMagic[8] = {'S', 'T', 'R', 'C', 'R', 'C', '1', '\n'};
}  // namespace

// Reads `<path>.crc32c` into *crc and *size; "" or what is wrong with it.
std::string file_sidecar_load(const std::string& path, size_t block_bytes, std::vector<uint32_t>* crc,
                              uint64_t* size) {
  const std::string side = path + ".crc32c";
  std::FILE* f = std::fopen(side.c_str(), "rb");
  if (!f) return str_cat("cannot open its checksum sidecar ", side, ": ", std::strerror(errno));
  std::vector<unsigned char> bytes;
  unsigned char chunk[65536];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) bytes.insert(bytes.end(), chunk, chunk + n);
  std::fclose(f);
  uint64_t hdr[3] = {0, 0, 0};
  if (bytes.size() < 36 || std::memcmp(bytes.data(), kSidecarMagic, 8) != 0)
    return str_cat("its checksum sidecar ", side, " is not one strata wrote");
  std::memcpy(hdr, bytes.data() + 8, 24);
  uint32_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 4, 4);
  if (bytes.size() != 36 + 4 * hdr[2] || crc32c(bytes.data(), bytes.size() - 4) != stored)
    return str_cat("its checksum sidecar ", side, " is damaged");
  if (hdr[0] != block_bytes)
    return str_cat("it was written with a block size of ", hdr[0], " bytes, not ", block_bytes);
  crc->resize(hdr[2]);
  std::memcpy(crc->data(), bytes.data() + 32, 4 * hdr[2]);
  *size = hdr[1];
  return "";
}

// Writes `<path>.crc32c` (a temporary file, fsync, rename); "" or the error.
std::string file_sidecar_store(const std::string& path, size_t block_bytes, uint64_t size,
                               const std::vector<uint32_t>& crc, uint32_t zero_crc) {
  const uint64_t n = (size + block_bytes - 1) / block_bytes;
  std::vector<unsigned char> bytes(36 + 4 * n);
  std::memcpy(bytes.data(), kSidecarMagic, 8);
  const uint64_t hdr[3] = {block_bytes, size, n};
  std::memcpy(bytes.data() + 8, hdr, 24);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t c = i < crc.size() ? crc[i] : zero_crc;
    std::memcpy(bytes.data() + 32 + 4 * i, &c, 4);
  }
  const uint32_t all = crc32c(bytes.data(), bytes.size() - 4);
  std::memcpy(bytes.data() + bytes.size() - 4, &all, 4);
  const std::string side = path + ".crc32c", tmp = side + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return str_cat("cannot create ", tmp, ": ", std::strerror(errno));
  size_t off = 0;
  int err = 0;
  while (off < bytes.size() && err == 0) {
    const ssize_t w = ::pwrite(fd, bytes.data() + off, bytes.size() - off, off_t(off));
    if (w > 0) off += size_t(w);
    else if (w < 0 && errno != EINTR) err = errno;
    else if (w == 0) err = EIO;
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  if (err == 0 && std::rename(tmp.c_str(), side.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return str_cat("cannot write the checksum sidecar ", side, " (", bytes.size(), " bytes): ",
                   std::strerror(err), " (", file_errno_name(err), ")", file_errno_hint(err));
  }
  return "";
}

}  // namespace strata
