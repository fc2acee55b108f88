// The file engine (see uring_file.h). Reading order: the state, the caller-side API, then the
// I/O thread: issue blocks, complete them, sync. The backends and the sidecar format are in
// uring_file_backend.cpp.
#include "io/uring_file.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "io/checksum.h"
#include "io/uring_file_backend.h"
#include "src/core/error.h"
#include "src/core/fault.h"


namespace strata {
namespace {


size_t align_down(size_t x) { return x / kDirectAlign * kDirectAlign; }
size_t align_up(size_t x) { return (x + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

// The checksum of a whole block, and the caller's bytes [lo, hi) copied into it (into_block) or
// out of it, in 64 KiB steps so that each byte comes from memory once (the copy hits the cache
// the checksum just filled, or the checksum the copy just filled).
uint32_t io_block_copy_crc(unsigned char* block, size_t block_bytes, size_t lo, size_t hi, unsigned char* user_lo,
                           bool into_block) {
  constexpr size_t kStep = size_t(64) << 10;
  uint32_t crc = 0;
  for (size_t c = 0; c < block_bytes; c += kStep) {
    const size_t e = std::min(block_bytes, c + kStep);
    const size_t a = std::max(c, lo), b = std::min(e, hi);
    if (into_block && a < b) std::memcpy(block + a, user_lo + (a - lo), b - a);
    crc = crc32c(block + c, e - c, crc);
    if (!into_block && a < b) std::memcpy(user_lo + (a - lo), block + a, b - a);
  }
  return crc;
}

IoFault io_fault_parse(const std::string& s, uint64_t* at) {
  const size_t amp = s.find('@');
  const std::string kind = s.substr(0, amp);
  IoFault f = kind == "short" ? IoFault::short_io : kind == "eio" ? IoFault::eio
            : kind == "enospc" ? IoFault::enospc : kind == "efbig" ? IoFault::efbig
            : kind == "einval" ? IoFault::einval : IoFault::none;
  char* end = nullptr;
  const unsigned long long n = amp == std::string::npos ? 0 : std::strtoull(s.c_str() + amp + 1, &end, 10);
  STRATA_CHECK(f != IoFault::none && n >= 1 && end && *end == '\0', "STRATA_IO_FAULT='", s,
               "' is not <short|eio|enospc|efbig|einval>@<N> with N >= 1");
  *at = n;
  return f;
}

int io_fault_errno(IoFault f) {
  switch (f) {
    case IoFault::eio: return EIO;
    case IoFault::enospc: return ENOSPC;
    case IoFault::efbig: return EFBIG;
    case IoFault::einval: return EINVAL;
    default: return 0;
  }
}

}  // namespace

// ---- state -----------------------------------------------------------------------------------

struct FileEngine::File {
  std::string path;
  int fd = -1;
  bool direct = false;
  bool open = true;
  uint64_t size = 0;                  // callers' view (under mu_): end of the highest byte written
  uint64_t phys_size = 0;             // I/O thread: the file's length on disk (extended ahead of writes)
  std::vector<uint32_t> crc;          // I/O thread: crc32c of each block
  std::unordered_set<int64_t> busy;   // I/O thread: blocks with a piece in flight
  int pieces = 0;                     // I/O thread: pieces in flight on this file
};

struct FileEngine::Request {
  enum Kind { read, write, sync } kind = read;
  FileTicket id = 0;
  File* file = nullptr;
  uint64_t offset = 0;
  size_t bytes = 0;
  unsigned char* user = nullptr;
  uint64_t size_before = 0;  // the file's size when submitted, after every earlier write
  int64_t next_block = 0, last_block = -1;
  int pieces = 0;            // I/O thread: pieces in flight
  bool extended = false;     // I/O thread: the file has been extended to cover a write
  bool failed = false;       // I/O thread
  bool done = false;         // under mu_
  std::string error;
};

// One block of one request, moving through one staging buffer.
struct FileEngine::Piece {
  enum Stage { read, rmw_read, write } stage = read;
  Request* req = nullptr;
  int buf = 0;
  int64_t block = 0;
  size_t lo = 0, hi = 0;    // the caller's bytes within the block
  size_t valid = 0;         // bytes of the block that must transfer
  size_t io_len = 0;        // valid, rounded up to 4096 under O_DIRECT
  size_t done = 0;          // bytes transferred so far
  size_t cur_start = 0, cur_len = 0;  // the kernel request in flight
  int fixed = -1;                     // the registered buffer holding base, or -1
  unsigned char* base = nullptr;      // where the block's bytes are: its staging buffer, or the
  bool in_user = false;               // caller's memory (a whole, 4096-aligned block: no copy)
  int stalls = 0;  // resubmissions in a row that moved nothing new
  bool in_kernel = false;  // counted by the disk-busy clock (disk_busy_begin .. _end)
  // The checksum work (check_piece), on a worker or the I/O thread. In: user_lo, want, eof.
  // Out: crc (a write's, or an RMW's patched block's), got (a read block's).
  unsigned char* user_lo = nullptr;  // the caller's byte at the block's offset lo
  uint32_t want = 0, got = 0, crc = 0;
  bool eof = false;     // the read ended early inside the block (said in a mismatch)
  bool sealed = false;  // a write whose checksum is done, waiting for the pieces started before it
};

// ---- the disk-busy clock (file_engines_busy_seconds) -------------------------------------------

namespace {

struct DiskBusy {
  std::mutex mu;
  int in_flight = 0;
  std::chrono::steady_clock::time_point since;
  double busy_s = 0;
};

DiskBusy& disk_busy() {
  static DiskBusy d;
  return d;
}

void disk_busy_begin() {
  DiskBusy& d = disk_busy();
  std::lock_guard<std::mutex> lk(d.mu);
  if (d.in_flight++ == 0) d.since = std::chrono::steady_clock::now();
}

void disk_busy_end() {
  DiskBusy& d = disk_busy();
  std::lock_guard<std::mutex> lk(d.mu);
  if (--d.in_flight == 0) d.busy_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - d.since).count();
}

}  // namespace

double file_engines_busy_seconds() {
  DiskBusy& d = disk_busy();
  std::lock_guard<std::mutex> lk(d.mu);
  return d.busy_s + (d.in_flight > 0 ? std::chrono::duration<double>(std::chrono::steady_clock::now() - d.since).count() : 0.0);
}

// ---- checksum threads --------------------------------------------------------------------------

int file_engine_checksum_threads() {
  cpu_set_t set;
  int cores = 0;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = int(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 4);
}

// A piece's checksum work: touches only the piece, its block's memory and the caller's bytes,
// so it runs on a worker while the I/O thread goes on.
//   write: the caller's bytes into the zeroed staging block (unless the block is the caller's
//          own memory); crc = the block's crc32c.
//   read:  got = the block's crc32c (bytes past the transfer counted as zeros), copying the
//          caller's bytes out as it goes; an RMW read that verifies then gets the caller's
//          bytes patched in, and crc = the patched block's.
void FileEngine::check_piece(Piece& p) const {
  const size_t B = opt_.block_bytes;
  if (p.stage == Piece::write) {
    if (p.in_user) {
      p.crc = crc32c(p.base, B);
      return;
    }
    std::memset(p.base, 0, p.lo);
    std::memset(p.base + p.hi, 0, B - p.hi);
    p.crc = io_block_copy_crc(p.base, B, p.lo, p.hi, p.user_lo, true);
    return;
  }
  if (p.in_user) {  // a read into the caller's memory covers the whole block
    p.got = crc32c(p.base, B);
    return;
  }
  std::memset(p.base + p.valid, 0, B - p.valid);
  // (a read copies out as it verifies: on a mismatch the caller's bytes are unspecified)
  p.got = io_block_copy_crc(p.base, B, p.lo, p.stage == Piece::read ? p.hi : p.lo, p.user_lo, false);
  if (p.stage == Piece::rmw_read && p.got == p.want) p.crc = io_block_copy_crc(p.base, B, p.lo, p.hi, p.user_lo, true);
}

void FileEngine::check_thread_main() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    check_cv_.wait(lk, [&] { return check_stop_ || !check_jobs_.empty(); });
    if (check_jobs_.empty()) return;  // stopping, and nothing is left
    const int buf = check_jobs_.front();
    check_jobs_.pop_front();
    lk.unlock();
    check_piece(*pieces_[size_t(buf)]);
    lk.lock();
    checked_.push_back(buf);
    work_cv_.notify_one();  // the I/O thread, when the workers hold every piece
  }
}

// ---- buffers --------------------------------------------------------------------------------------

void IoBufferFree::operator()(unsigned char* p) const { std::free(p); }

IoBuffer io_buffer_alloc(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHuge - 1) / kHuge * kHuge;
  auto* p = static_cast<unsigned char*>(std::aligned_alloc(kHuge, rounded));
  STRATA_CHECK_BUDGET(p, "cannot allocate ", rounded, " bytes of I/O buffers: lower the NVMe queue depth, ",
                      "block size or chunk size");
  ::madvise(p, rounded, MADV_HUGEPAGE);  // a hint: without huge pages it still works
  return IoBuffer(p);
}

// ---- the caller's side ------------------------------------------------------------------------

FileEngine::FileEngine(FileEngineOptions opt) : opt_(std::move(opt)) {
  STRATA_CHECK(opt_.block_bytes >= kDirectAlign && opt_.block_bytes % kDirectAlign == 0 &&
                   opt_.block_bytes <= (size_t(1) << 30),
               "the NVMe block size must be a multiple of 4096 bytes between 4 KiB and 1 GiB (got ",
               opt_.block_bytes, ")");
  STRATA_CHECK(opt_.queue_depth >= 1 && opt_.queue_depth <= 4096,
               "the NVMe queue depth must be between 1 and 4096 (got ", opt_.queue_depth, ")");
  STRATA_CHECK(opt_.checksum_threads >= 0 && opt_.checksum_threads <= 256,
               "the NVMe checksum threads must be between 0 (the default) and 256 (got ", opt_.checksum_threads, ")");
  if (opt_.checksum_threads == 0) opt_.checksum_threads = file_engine_checksum_threads();
  if (!opt_.warn)
    opt_.warn = [](const std::string& m) { std::fprintf(stderr, "strata: warning: %s\n", m.c_str()); };
  if (const char* env = std::getenv("STRATA_IO_FAULT"); env && *env) {
    fault_ = io_fault_parse(env, &fault_at_);
  } else if (std::string kind; fault_io_armed(&kind, &fault_at_)) {  // STRATA_FAULT=<kind>@io:<N>
    fault_ = io_fault_parse(kind + "@" + std::to_string(fault_at_), &fault_at_);
  }

  const size_t qd = size_t(opt_.queue_depth), B = opt_.block_bytes;
  staging_ = io_buffer_alloc(qd * B);
  std::memset(staging_.get(), 0, qd * B);
  std::vector<unsigned char> zeros(B, 0);
  zero_block_crc_ = crc32c(zeros.data(), B);
  for (size_t i = 0; i < qd; ++i) {
    pieces_.push_back(std::make_unique<Piece>());
    free_bufs_.push_back(int(qd - 1 - i));
  }

  if (opt_.use_uring) {
    std::string why;
    backend_ = file_backend_uring(unsigned(qd), &why);
    if (backend_) {
      for (size_t i = 0; i < qd; ++i) regions_.push_back({staging_.get() + i * B, B});
      if (!backend_->register_buffers(regions_))
        opt_.warn(str_cat("cannot register ", qd * B, " bytes of staging buffers with io_uring (RLIMIT_MEMLOCK?); "
                          "NVMe I/O goes on without fixed buffers"));
    } else if (!why.empty()) {
      opt_.warn(str_cat("io_uring is not available here (", why,
                        "); NVMe files are read and written with pread/pwrite, one block at a time"));
    }
  }
  if (!backend_) backend_ = file_backend_pread();
  try {
    for (int i = 0; opt_.checksum_threads > 1 && i < opt_.checksum_threads; ++i)
      checkers_.emplace_back([this] { check_thread_main(); });
    thread_ = std::thread([this] { io_thread_main(); });
  } catch (...) {  // no thread to spare: stop those started
    stop_checkers();
    throw;
  }
}

void FileEngine::stop_checkers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    check_stop_ = true;
  }
  check_cv_.notify_all();
  for (std::thread& t : checkers_) t.join();
  checkers_.clear();
}

FileEngine::~FileEngine() {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (!files_[i]->open) continue;
    try {
      close(int(i));
    } catch (const Error& e) {
      opt_.warn(e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
  stop_checkers();  // after the I/O thread: it leaves no piece with them
  backend_.reset();  // unregisters the buffers before staging_ goes
}

const char* FileEngine::backend() const { return backend_->name(); }

bool FileEngine::register_memory(const void* p, size_t bytes, bool add) {
  std::unique_lock<std::mutex> lk(mu_);
  STRATA_ASSERT(requests_.empty() && incoming_.empty(), "register_memory with requests outstanding");
  // the I/O thread is idle (nothing outstanding): the regions and the ring are ours
  auto* base = static_cast<unsigned char*>(const_cast<void*>(p));
  auto it = std::find_if(regions_.begin() + std::min<ptrdiff_t>(opt_.queue_depth, ptrdiff_t(regions_.size())),
                         regions_.end(), [&](const iovec& v) { return v.iov_base == base; });
  if (add && it == regions_.end()) regions_.push_back({base, bytes});
  if (!add && it != regions_.end()) regions_.erase(it);
  if (regions_.empty() || !backend_->async()) return false;
  if (backend_->register_buffers(regions_)) return true;
  // the kernel refused (RLIMIT_MEMLOCK?): keep the staging buffers registered at least
  regions_.resize(size_t(opt_.queue_depth));
  backend_->register_buffers(regions_);
  return false;
}
bool FileEngine::fixed_buffers() const { return backend_->fixed(); }

FileEngineStats FileEngine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void FileEngine::inject_fault(IoFault fault, uint64_t n) {
  STRATA_ASSERT(n >= 1);
  std::lock_guard<std::mutex> lk(mu_);
  fault_ = fault;
  fault_at_ = stats_.kernel_requests + n;
}

FileEngine::File& FileEngine::file_at(int file) const {
  STRATA_ASSERT(file >= 0 && size_t(file) < files_.size() && files_[size_t(file)]->open,
                "bad or closed file handle ", file);
  return *files_[size_t(file)];
}

uint64_t FileEngine::size(int file) const {
  std::lock_guard<std::mutex> lk(mu_);
  return file_at(file).size;
}

bool FileEngine::direct(int file) const {
  std::lock_guard<std::mutex> lk(mu_);
  return file_at(file).direct;
}

void FileEngine::warn_once_buffered(const std::string& path) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (warned_buffered_) return;
    warned_buffered_ = true;
  }
  opt_.warn(str_cat("the filesystem of ", path, " refuses direct I/O (O_DIRECT); strata reads and "
                    "writes its NVMe files there through the page cache, which uses host memory "
                    "and is slower (a tmpfs or ramfs? point offload.nvme_path at a real disk)"));
}

int FileEngine::open(const std::string& path, FileOpen mode) {
  const int flags = O_RDWR | O_CLOEXEC | (mode == FileOpen::create ? O_CREAT | O_TRUNC : 0);
  auto f = std::make_unique<File>();
  f->path = path;
  f->direct = opt_.direct;
  if (f->direct) {
    f->fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (f->fd < 0 && errno == EINVAL) {
      f->direct = false;
      warn_once_buffered(path);
    }
  }
  if (!f->direct) f->fd = ::open(path.c_str(), flags, 0644);
  STRATA_CHECK_IO(f->fd >= 0, "cannot open ", path, " for reading and writing: ", std::strerror(errno),
                  "; check that the directory exists and is writable");
  if (mode == FileOpen::create) {
    ::unlink((path + ".crc32c").c_str());  // a stale sidecar would describe other bytes
  } else {
    std::string err = file_sidecar_load(path, opt_.block_bytes, &f->crc, &f->size);
    struct stat st {};
    f->phys_size = f->size;
    if (err.empty() && ::fstat(f->fd, &st) == 0 && uint64_t(st.st_size) != f->size)
      err = str_cat("it holds ", st.st_size, " bytes but its checksums describe ", f->size,
                    " (changed after strata wrote it?)");
    if (!err.empty()) {
      ::close(f->fd);
      STRATA_CHECK_IO(false, "cannot open ", path, " as an engine-written file: ", err);
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  files_.push_back(std::move(f));
  return int(files_.size() - 1);
}

FileTicket FileEngine::enqueue(int kind, int file, uint64_t offset, size_t bytes, unsigned char* user) {
  auto r = std::make_unique<Request>();
  r->kind = Request::Kind(kind);
  r->offset = offset;
  r->bytes = bytes;
  r->user = user;
  std::unique_lock<std::mutex> lk(mu_);
  File& f = file_at(file);
  r->file = &f;
  r->size_before = f.size;
  if (r->kind == Request::read)
    STRATA_CHECK_IO(offset <= f.size && bytes <= f.size - offset, "cannot read ", f.path, " at offset ",
                    offset, ", ", bytes, " bytes: the file holds ", f.size, " bytes");
  if (r->kind == Request::write) f.size = std::max<uint64_t>(f.size, offset + bytes);
  if (r->kind != Request::sync && bytes > 0) {
    r->next_block = int64_t(offset / opt_.block_bytes);
    r->last_block = int64_t((offset + bytes - 1) / opt_.block_bytes);
  }
  r->id = next_ticket_++;
  Request* raw = r.get();
  requests_.emplace(r->id, std::move(r));
  if (raw->kind != Request::sync && bytes == 0) {
    raw->done = true;  // nothing to move
    return raw->id;
  }
  incoming_.push_back(raw);
  lk.unlock();
  work_cv_.notify_one();
  return raw->id;
}

FileTicket FileEngine::read(int file, uint64_t offset, void* dst, size_t bytes) {
  return enqueue(Request::read, file, offset, bytes, static_cast<unsigned char*>(dst));
}

FileTicket FileEngine::write(int file, uint64_t offset, const void* src, size_t bytes) {
  // the engine only reads from src: the const is honoured
  return enqueue(Request::write, file, offset, bytes, static_cast<unsigned char*>(const_cast<void*>(src)));
}

FileTicket FileEngine::sync(int file) { return enqueue(Request::sync, file, 0, 0, nullptr); }

void FileEngine::close(int file) {
  const FileTicket t = sync(file);
  std::string err;
  try {
    wait(t);
  } catch (const Error& e) {
    err = e.what();
  }
  std::lock_guard<std::mutex> lk(mu_);
  File& f = file_at(file);
  f.open = false;
  if (::close(f.fd) != 0 && err.empty())
    err = str_cat("cannot close ", f.path, ": ", std::strerror(errno));
  f.fd = -1;
  f.crc = {};
  STRATA_CHECK_IO(err.empty(), err);
}

bool FileEngine::poll(FileTicket t) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = requests_.find(t);
  STRATA_ASSERT(it != requests_.end(), "ticket ", t, " is unknown or already waited");
  return it->second->done;
}

void FileEngine::wait(FileTicket t) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = requests_.find(t);
  STRATA_ASSERT(it != requests_.end(), "ticket ", t, " is unknown or already waited");
  Request* r = it->second.get();
  if (!r->done) {
    const auto t0 = std::chrono::steady_clock::now();
    done_cv_.wait(lk, [&] { return r->done; });
    stats_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::string err = std::move(r->error);
  requests_.erase(it);
  lk.unlock();
  STRATA_CHECK_IO(err.empty(), err);
}

void FileEngine::wait_all() {
  std::unique_lock<std::mutex> lk(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  done_cv_.wait(lk, [&] {
    return std::all_of(requests_.begin(), requests_.end(), [](const auto& kv) { return kv.second->done; });
  });
  stats_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string err;
  for (auto& [id, r] : requests_)
    if (err.empty() && !r->error.empty()) err = std::move(r->error);
  requests_.clear();
  lk.unlock();
  STRATA_CHECK_IO(err.empty(), err);
}

// ---- the I/O thread ------------------------------------------------------------------------------

void FileEngine::io_thread_main() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      for (;;) {
        while (!incoming_.empty()) {
          active_.push_back(incoming_.front());
          incoming_.pop_front();
        }
        if (!active_.empty() || in_flight_ > 0) break;
        if (stop_) return;
        work_cv_.wait(lk);
      }
    }
    io_issue();
    if (in_flight_ == 0) {
      STRATA_ASSERT(active_.empty(), "the NVMe engine stalled with ", active_.size(), " requests");
      continue;
    }
    io_wait();
  }
}

// Finishes what is ready: pieces the checksum workers are done with, completions without the
// ring. Else waits: for the kernel (briefly while buffers are free, so that a new request does
// not wait behind a long transfer; briefly too while the workers hold pieces, as their finishing
// does not wake the ring), or, when the workers hold every piece, for them.
void FileEngine::io_wait() {
  std::deque<int> checked;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (checked_.empty() && ready_.empty() && kernel_in_flight_ == 0) {
      STRATA_ASSERT(checks_out_ > 0, "the NVMe engine has ", in_flight_, " pieces in flight and none to wait for");
      work_cv_.wait(lk, [&] { return !checked_.empty(); });
    }
    checked.swap(checked_);
  }
  checks_out_ -= int(checked.size());
  for (int buf : checked) io_checked(*pieces_[size_t(buf)]);
  if (!ready_.empty()) {
    std::deque<std::pair<int, int64_t>> ready;
    ready.swap(ready_);
    for (auto [buf, res] : ready) io_complete(buf, res, false);
  } else if (checked.empty()) {
    const long timeout_us = checks_out_ > 0 ? 100 : free_bufs_.empty() ? -1 : 1000;
    backend_->wait(timeout_us, [this](int buf, int64_t res) { io_complete(buf, res, true); });
  }
}

// Hands a piece's checksum work to the workers, or does it here (one checksum thread).
void FileEngine::io_check_start(Piece& p) {
  if (p.stage == Piece::write) sealing_.push_back(p.buf);
  if (checkers_.empty()) {
    check_piece(p);
    return io_checked(p);
  }
  ++checks_out_;
  {
    std::lock_guard<std::mutex> lk(mu_);
    check_jobs_.push_back(p.buf);
  }
  check_cv_.notify_one();
}

// The I/O thread's side of a piece whose checksum work is done. A write's checksum is recorded
// and the write goes to the kernel, in the order the pieces started (so the N-th kernel request
// is what it was with one thread: fault injection counts them). A read is verified; an RMW read
// that verifies is written back, patched.
void FileEngine::io_checked(Piece& p) {
  File& f = *p.req->file;
  auto set_crc = [&](int64_t block, uint32_t crc) {
    if (f.crc.size() <= size_t(block)) f.crc.resize(size_t(block) + 1, zero_block_crc_);
    f.crc[size_t(block)] = crc;
  };
  if (p.stage == Piece::write) {
    set_crc(p.block, p.crc);
    p.sealed = true;
    while (!sealing_.empty() && pieces_[size_t(sealing_.front())]->sealed) {
      Piece& q = *pieces_[size_t(sealing_.front())];
      sealing_.pop_front();
      q.sealed = false;
      io_kernel_request(q);
    }
    return;
  }
  if (p.got != p.want) {
    const uint64_t block_off = uint64_t(p.block) * opt_.block_bytes;
    char hex[64];
    std::snprintf(hex, sizeof hex, "stored crc32c %08x, read %08x", p.want, p.got);
    return io_piece_done(p, str_cat("checksum mismatch in ", f.path, " at offset ", block_off, " (the block of ",
                                    opt_.block_bytes, " bytes there; ", hex, "): the bytes on disk changed after strata "
                                    "wrote them (silent corruption, or another program wrote the file)",
                                    p.eof ? str_cat("; the file ends at byte ", block_off + p.done, " (truncated?)") : ""));
  }
  if (p.stage == Piece::read) return io_piece_done(p, "");
  // read-modify-write: the caller's bytes are patched in; write the block back
  p.valid = std::max(p.valid, p.hi);
  set_crc(p.block, p.crc);
  p.stage = Piece::write;
  p.io_len = f.direct ? align_up(p.valid) : p.valid;
  p.done = 0;
  io_kernel_request(p);
}

// Starts pieces in submission order until a request cannot go on (no free staging buffer, or its
// next block is busy with an earlier request); a sync waits for its file's pieces in flight.
void FileEngine::io_issue() {
  size_t i = 0;
  while (i < active_.size()) {
    Request& r = *active_[i];
    if (r.kind == Request::sync) {
      if (r.file->pieces > 0) break;
      io_run_sync(r);  // finishes r: active_[i] is now the next request
      continue;
    }
    if (r.kind == Request::write && !r.extended && !io_extend(r)) continue;  // failed: r is finished
    bool blocked = false;
    while (!r.failed && r.next_block <= r.last_block)
      if (!io_start_piece(r)) {
        blocked = true;
        break;
      }
    if (blocked) break;
    ++i;
  }
  backend_->submit();
}

// Under O_DIRECT, a write past the end of the file is serialised by the filesystem (ext4 waits
// for each one to complete before the next, to move the file's size), which would leave one
// block in flight. So the file is first extended to the write's end (rounded up to 4096; sync
// trims it), and the blocks overwrite inside it. false when that fails (r is then finished).
bool FileEngine::io_extend(Request& r) {
  File& f = *r.file;
  r.extended = true;
  const uint64_t end = f.direct ? align_up(r.offset + r.bytes) : 0;
  if (end <= f.phys_size) return true;
  if (::ftruncate(f.fd, off_t(end)) == 0) {
    f.phys_size = end;
    return true;
  }
  const int e = errno;
  r.failed = true;
  r.error = str_cat("cannot write ", f.path, " at offset ", r.offset, ", ", r.bytes, " bytes: extending the file to ",
                    end, " bytes failed: ", std::strerror(e), " (", file_errno_name(e), ")", file_errno_hint(e));
  io_request_finish(r);
  return false;
}

bool FileEngine::io_start_piece(Request& r) {
  File& f = *r.file;
  const int64_t b = r.next_block;
  if (free_bufs_.empty() || f.busy.count(b)) return false;
  const size_t B = opt_.block_bytes;
  const uint64_t block_off = uint64_t(b) * B;
  Piece& p = *pieces_[size_t(free_bufs_.back())];
  p = Piece{};
  p.buf = free_bufs_.back();
  free_bufs_.pop_back();
  p.req = &r;
  p.block = b;
  p.lo = size_t(std::max<uint64_t>(r.offset, block_off) - block_off);
  p.hi = size_t(std::min<uint64_t>(r.offset + r.bytes, block_off + B) - block_off);
  f.busy.insert(b);
  ++f.pieces;
  ++r.pieces;
  ++r.next_block;
  ++in_flight_;
  unsigned char* buf = staging_.get() + size_t(p.buf) * B;
  unsigned char* user_block = r.user + (block_off - r.offset);  // valid where lo == 0
  p.user_lo = r.user + (block_off + p.lo - r.offset);
  p.base = buf;
  p.in_user = p.lo == 0 && p.hi == B && reinterpret_cast<uintptr_t>(user_block) % kDirectAlign == 0;
  p.fixed = p.buf;
  if (p.in_user) {
    p.base = user_block;
    p.fixed = -1;
    for (size_t i = size_t(opt_.queue_depth); i < regions_.size(); ++i) {
      const auto* lo = static_cast<unsigned char*>(regions_[i].iov_base);
      if (user_block >= lo && user_block + B <= lo + regions_[i].iov_len) p.fixed = int(i);
    }
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.zero_copy_blocks;
  }
  const size_t old_valid = block_off < r.size_before ? size_t(std::min<uint64_t>(B, r.size_before - block_off)) : 0;
  if (r.kind == Request::read) {
    p.stage = Piece::read;
    p.valid = old_valid;
  } else if (old_valid > 0 && !(p.lo == 0 && p.hi >= old_valid)) {
    p.stage = Piece::rmw_read;  // keep the block's other bytes
    p.valid = old_valid;
  } else {
    // the block holds nothing else: zeros around the caller's bytes, summed before it goes
    p.stage = Piece::write;
    p.valid = p.hi;
  }
  p.io_len = f.direct ? align_up(p.valid) : p.valid;
  if (p.stage == Piece::write) io_check_start(p);
  else io_kernel_request(p);
  return true;
}

// Hands the rest of the piece's transfer to the kernel (from the last 4096-byte boundary under
// O_DIRECT), or completes it with an injected fault.
void FileEngine::io_kernel_request(Piece& p) {
  File& f = *p.req->file;
  p.cur_start = f.direct ? align_down(p.done) : p.done;
  p.cur_len = p.io_len - p.cur_start;
  int fault_errno = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t n = ++stats_.kernel_requests;
    if (fault_ != IoFault::none && n >= fault_at_) {
      if (fault_ == IoFault::short_io) {
        const size_t half = f.direct ? align_down(p.cur_len / 2) : p.cur_len / 2;
        if (half > 0 && half < p.cur_len) {
          p.cur_len = half;
          fault_ = IoFault::none;
          ++stats_.faults_injected;
        } else {
          fault_at_ = n + 1;  // too small to halve: the next request gets it
        }
      } else {
        fault_errno = io_fault_errno(fault_);
        fault_ = IoFault::none;
        ++stats_.faults_injected;
      }
    }
    if (fault_errno == 0) {
      if (backend_->async()) ++kernel_in_flight_;
      stats_.max_in_flight = std::max(stats_.max_in_flight, backend_->async() ? kernel_in_flight_ : 1);
    }
  }
  if (fault_errno != 0) {
    ready_.emplace_back(p.buf, -int64_t(fault_errno));
    return;
  }
  const uint64_t off = uint64_t(p.block) * opt_.block_bytes + p.cur_start;
  p.in_kernel = true;
  disk_busy_begin();
  backend_->queue(p.stage == Piece::write, p.buf, p.fixed, f.fd, p.base + p.cur_start, p.cur_len, off, ready_);
}

void FileEngine::io_complete(int buf, int64_t res, bool from_kernel) {
  Piece& p = *pieces_[size_t(buf)];
  Request& r = *p.req;
  File& f = *r.file;
  const size_t B = opt_.block_bytes;
  const uint64_t block_off = uint64_t(p.block) * B;
  const bool writing = p.stage == Piece::write;
  if (p.in_kernel) {
    p.in_kernel = false;
    disk_busy_end();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (from_kernel) --kernel_in_flight_;
    if (res > 0) (writing ? stats_.device_write_bytes : stats_.device_read_bytes) += uint64_t(res);
  }
  const auto fail = [&](const std::string& why) {
    io_piece_done(p, str_cat("cannot ", writing ? "write " : "read ", f.path, " at offset ",
                             block_off + p.cur_start, ", ", p.cur_len, " bytes (request: offset ", r.offset,
                             ", ", r.bytes, " bytes): ", why));
  };
  if (res < 0) {
    const int err = int(-res);
    return fail(str_cat(std::strerror(err), " (", file_errno_name(err), ")", file_errno_hint(err)));
  }
  const size_t before = p.done;
  p.done = std::max(p.done, p.cur_start + size_t(res));
  // End of file inside the block: the rest reads as zeros, and the checksum decides. (A hole
  // below a write still in flight ends the file early; a truncated file fails the checksum.)
  // Under O_DIRECT the resubmission re-reads from a 4096 boundary, so there the end shows as a
  // short read that moves nothing new.
  const bool eof = !writing && p.done < p.valid && (res == 0 || (p.done == before && size_t(res) < p.cur_len));
  if (eof) std::memset(p.base + p.done, 0, p.valid - p.done);
  if (p.done < p.valid && !eof) {
    if (p.done == before && ++p.stalls >= 3) return fail("three transfers in a row made no progress (EIO)");
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++stats_.resubmits;
    }
    return io_kernel_request(p);
  }
  if (!writing) {  // verified, the bytes past the file's end counted as zeros
    p.want = size_t(p.block) < f.crc.size() ? f.crc[size_t(p.block)] : zero_block_crc_;
    p.eof = eof;
    return io_check_start(p);
  }
  io_piece_done(p, "");
}

void FileEngine::io_piece_done(Piece& p, const std::string& error) {
  Request& r = *p.req;
  File& f = *r.file;
  if (!error.empty() && !r.failed) {
    r.failed = true;
    r.error = error;
    r.next_block = r.last_block + 1;  // the rest is not started
  }
  f.busy.erase(p.block);
  --f.pieces;
  --r.pieces;
  --in_flight_;
  free_bufs_.push_back(p.buf);
  if (r.pieces == 0 && r.next_block > r.last_block) io_request_finish(r);
}

// A sync runs on the I/O thread once its file has nothing in flight: trim the block padding
// past the logical end, fsync, then store the checksums beside the data.
void FileEngine::io_run_sync(Request& r) {
  File& f = *r.file;
  std::string err;
  if (::ftruncate(f.fd, off_t(r.size_before)) != 0 || ::fsync(f.fd) != 0) {
    const int e = errno;
    err = str_cat("cannot sync ", f.path, " (", r.size_before, " bytes): ", std::strerror(e), " (",
                  file_errno_name(e), ")", file_errno_hint(e));
  } else {
    f.phys_size = r.size_before;
    err = file_sidecar_store(f.path, opt_.block_bytes, r.size_before, f.crc, zero_block_crc_);
  }
  if (!err.empty()) {
    r.failed = true;
    r.error = err;
  }
  io_request_finish(r);
}

void FileEngine::io_request_finish(Request& r) {
  active_.erase(std::find(active_.begin(), active_.end(), &r));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!r.failed) (r.kind == Request::read ? stats_.read_bytes : stats_.write_bytes) += r.bytes;
    r.done = true;  // the caller may free r from here on
  }
  done_cv_.notify_all();
}

}  // namespace strata
