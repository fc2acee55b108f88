// The file engine of the NVMe tier (DESIGN §8a): reads and writes of large files with many
// requests in flight, completed by ticket so the caller overlaps I/O with compute. Optimizer
// state and activation checkpoints on NVMe are built on it.
//
//   FileEngine io(opt);                       // one I/O thread, one io_uring, staging buffers
//   int f = io.open(dir + "/master.bin", FileOpen::create);
//   FileTicket t = io.write(f, offset, src, bytes);   // returns at once; src stays valid until
//   ... compute ...                                   // the ticket completes
//   io.wait(t);                               // throws strata::Error (exit 4) naming the file,
//   io.close(f);                              // offset and length when the I/O failed
//
// How it works. Requests go to one I/O thread in submission order. It splits each into blocks
// of `block_bytes` (the I/O unit and the checksum unit) and moves every block through one of
// `queue_depth` staging buffers (io_buffer_alloc), registered with the ring (fixed buffers), so
// O_DIRECT applies to any caller buffer, offset and length; a block the caller's buffer covers
// whole at a 4096-aligned address moves straight between that memory and the disk instead (no
// copy: give big transfers aligned buffers and block-aligned offsets). A block is one kernel
// request: read (the whole block, verified) or write (the whole block, checksummed); a write
// that covers only part of a block that already holds data reads the block first (read-modify-
// write). Requests touching the same block run in submission order; others overlap. Short
// transfers are resubmitted for the rest (from the last 4096-byte boundary under O_DIRECT).
// Where O_DIRECT is refused (open fails with EINVAL: ramfs, and tmpfs before Linux 6.6) the
// file is opened buffered, with one warning per engine. Without liburing at build time, or
// where io_uring_setup is refused at run time (a seccomp filter), the same thread does the same
// blocks with pread/pwrite, one at a time.
//
// On-disk layout. `<path>` holds exactly the caller's bytes (plain `pread` reads them back; its
// size is the highest byte written; under O_DIRECT the file is extended ahead of a write to a
// 4096 boundary, so the blocks overwrite in parallel instead of being serialised by the
// filesystem as appends, and sync and close trim it back). The checksums live in RAM while
// the file is open (4 bytes per block) and in the sidecar `<path>.crc32c`, rewritten (via a
// temporary file and rename) at every sync() and close():
//   bytes 0..7   magic "STRCRC1\n"
//   8..15        block_bytes (uint64, little-endian)
//   16..23       logical file size (uint64)
//   24..31       block count n = ceil(size / block_bytes) (uint64)
//   32..32+4n    crc32c of each block (uint32): all block_bytes of it, bytes past the end of the
//                file counted as zeros (so a block never written, a hole, has the checksum of
//                zeros)
//   last 4       crc32c of everything before
// Every block read is verified against its checksum; a mismatch is an I/O error naming the file
// and the block's offset. FileOpen::existing needs the sidecar, with the same block_bytes.
//
// Checksum threads. Summing a block (crc32c, ~8 GB/s on one core) and verifying it would cap a
// fast disk if the I/O thread did it alone; with checksum_threads N > 1, N workers do it while the
// I/O thread keeps the ring full: a write's block is copied and summed by a worker, then goes to
// the kernel in the order the blocks started (so the N-th kernel request is the same as with one
// thread); a read's block is verified (and copied out) by a worker when the kernel is done. The
// I/O thread alone touches the files, the ring and the checksum table; a block with a worker
// still counts as in flight, so ordering, read-modify-write and sync are unchanged.
//
// Memory: queue_depth * block_bytes of staging (staging_bytes()), plus 4 bytes per block of
// every open file. Fault injection for tests: inject_fault(), or the environment variable
// STRATA_IO_FAULT=<short|eio|enospc|efbig|einval>@<N> read when an engine is created: the N-th
// kernel request from then on (reads, writes, read-modify-write reads and resubmissions all
// count, starting at 1) fails with that errno, or transfers only half its length (rounded down
// to 4096 bytes under O_DIRECT; a request too small to halve passes the fault to the next one).
#pragma once
#include <sys/uio.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace strata {

// Memory for big transfers: 2 MiB-aligned and backed by transparent huge pages where the kernel
// allows (madvise). A 1 MiB block in 4 KiB pages is 256 segments, more than a virtio disk takes
// in one request (254 here), so it costs two; in a huge page it is one (reads ran ~1.7x faster
// here). Give the engine such buffers, registered with register_memory(). Throws (exit 3) when
// the memory is not there.
struct IoBufferFree {
  void operator()(unsigned char* p) const;
};
using IoBuffer = std::unique_ptr<unsigned char[], IoBufferFree>;
IoBuffer io_buffer_alloc(size_t bytes);

struct FileEngineOptions {
  size_t block_bytes = size_t(1) << 20;  // I/O and checksum unit: a multiple of 4096
  int queue_depth = 32;                  // kernel requests in flight = staging buffers, 1..4096
  bool direct = true;                    // O_DIRECT where the filesystem takes it
  bool use_uring = true;                 // false: the pread/pwrite thread (same API, depth 1)
  // Threads that sum and verify blocks: 1 is the I/O thread itself; N > 1 starts N workers
  // beside it; 0 (the default) takes file_engine_checksum_threads().
  int checksum_threads = 0;
  // Where the engine's warnings go (default: "strata: warning: ..." on stderr).
  std::function<void(const std::string&)> warn;
};

enum class FileOpen {
  create,    // create or truncate (and drop a stale sidecar)
  existing,  // an engine-written file: its sidecar must be present
};

enum class IoFault { none, short_io, eio, enospc, efbig, einval };

using FileTicket = uint64_t;

struct FileEngineStats {
  uint64_t read_bytes = 0;          // caller bytes of completed reads
  uint64_t write_bytes = 0;         // caller bytes of completed writes
  uint64_t device_read_bytes = 0;   // bytes the kernel read (whole blocks, RMW reads)
  uint64_t device_write_bytes = 0;  // bytes the kernel wrote (whole blocks, padding)
  uint64_t kernel_requests = 0;     // reads and writes handed to the kernel
  uint64_t resubmits = 0;           // short transfers resubmitted for the rest
  uint64_t faults_injected = 0;
  uint64_t zero_copy_blocks = 0;    // blocks moved straight between the caller's memory and disk
  int max_in_flight = 0;            // most kernel requests in flight at once
  double wait_s = 0;                // time callers spent blocked in wait() and wait_all()
};

// The checksum threads an engine takes by default: the cores this process may run on, at most 4
// (crc32c at ~8 GB/s a core: 4 keep up with a fast NVMe array). The step estimate prices NVMe
// checksums on this many cores.
int file_engine_checksum_threads();

// Seconds during which at least one transfer of any FileEngine of this process was in the
// kernel (reads and writes together, a union over engines: the NVMe tier's optimizer-state and
// checkpoint engines share the disk). Monotone; a step's disk time is the difference across it.
// With it, bytes moved / busy seconds is the throughput the disk gave the run's own mix of
// requests (strata estimate --rates-from prices NVMe with it).
double file_engines_busy_seconds();

class FileEngine {
 public:
  explicit FileEngine(FileEngineOptions opt = {});
  // Finishes everything in flight, then closes open files (an error there is a warning: call
  // close() first to see it as an exception).
  ~FileEngine();
  FileEngine(const FileEngine&) = delete;
  FileEngine& operator=(const FileEngine&) = delete;

  // Returns a handle for read/write/sync/close. Throws (I/O) when the file cannot be opened.
  int open(const std::string& path, FileOpen mode);
  // The caller's buffer must stay valid (and, for reads, untouched) until the ticket completes;
  // a read that fails leaves the destination's bytes unspecified.
  // A read must lie within the bytes written so far (size()).
  FileTicket read(int file, uint64_t offset, void* dst, size_t bytes);
  FileTicket write(int file, uint64_t offset, const void* src, size_t bytes);
  // Completes after every earlier request on the file: fsync of the data, then the sidecar.
  FileTicket sync(int file);
  // Syncs, trims the file to size(), closes it. The handle is dead afterwards.
  void close(int file);

  // Registers the caller's memory (a buffer that whole blocks move to and from without a copy)
  // with the ring as a fixed buffer, which spares the kernel pinning its pages on every
  // transfer. Only while nothing is outstanding; true when the ring took it. Unregister before
  // freeing the memory.
  bool register_memory(const void* p, size_t bytes) { return register_memory(p, bytes, true); }
  void unregister_memory(const void* p) { register_memory(p, 0, false); }

  bool poll(FileTicket t);  // true once the ticket has completed (successfully or not)
  void wait(FileTicket t);  // blocks until it completes; throws its error; releases the ticket
  void wait_all();          // waits for every ticket not yet waited; throws the first error

  uint64_t size(int file) const;    // logical size: the end of the highest byte written
  bool direct(int file) const;      // opened with O_DIRECT
  const char* backend() const;      // "io_uring" or "pread"
  bool fixed_buffers() const;       // staging buffers registered with the ring
  FileEngineStats stats() const;
  const FileEngineOptions& options() const { return opt_; }
  static size_t staging_bytes(const FileEngineOptions& opt) { return opt.block_bytes * size_t(opt.queue_depth); }

  // Test hook: the n-th kernel request from now (n >= 1) gets `fault` (see the header comment).
  void inject_fault(IoFault fault, uint64_t n);

  struct File;
  struct Request;
  struct Piece;
  struct Backend;

 private:
  bool register_memory(const void* p, size_t bytes, bool add);
  FileTicket enqueue(int kind, int file, uint64_t offset, size_t bytes, unsigned char* user);
  File& file_at(int file) const;
  void warn_once_buffered(const std::string& path);
  void io_thread_main();
  void io_issue();
  bool io_extend(Request& r);
  bool io_start_piece(Request& r);
  void io_kernel_request(Piece& p);
  void io_complete(int buf, int64_t res, bool from_kernel);
  void io_piece_done(Piece& p, const std::string& error);
  void io_run_sync(Request& r);
  void io_request_finish(Request& r);
  void io_wait();
  void io_check_start(Piece& p);
  void io_checked(Piece& p);
  void check_piece(Piece& p) const;  // any thread: the piece's own memory only
  void check_thread_main();
  void stop_checkers();

  FileEngineOptions opt_;
  std::unique_ptr<Backend> backend_;
  IoBuffer staging_;  // queue_depth * block_bytes, from io_buffer_alloc
  uint32_t zero_block_crc_ = 0;
  std::vector<iovec> regions_;  // registered with the ring: the staging buffers, then the caller's

  // shared between callers and the I/O thread
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Request*> incoming_;
  std::unordered_map<FileTicket, std::unique_ptr<Request>> requests_;
  std::vector<std::unique_ptr<File>> files_;
  FileTicket next_ticket_ = 1;
  bool stop_ = false;
  bool warned_buffered_ = false;
  FileEngineStats stats_;
  IoFault fault_ = IoFault::none;
  uint64_t fault_at_ = 0;  // kernel request number that gets the fault

  // the I/O thread's own
  std::deque<Request*> active_;
  std::vector<std::unique_ptr<Piece>> pieces_;  // one per staging buffer
  std::vector<int> free_bufs_;
  int in_flight_ = 0;          // pieces started and not finished (one per busy buffer)
  int kernel_in_flight_ = 0;   // transfers handed to the ring, not yet completed (mu_)
  std::deque<std::pair<int, int64_t>> ready_;  // completions without the ring: (buffer, result)
  std::thread thread_;

  // the checksum workers (checksum_threads > 1): pieces, by staging buffer, go out through
  // check_jobs_ and come back through checked_ (both under mu_)
  std::vector<std::thread> checkers_;
  std::condition_variable check_cv_;
  std::deque<int> check_jobs_, checked_;
  bool check_stop_ = false;
  int checks_out_ = 0;        // I/O thread: pieces with the workers
  std::deque<int> sealing_;   // I/O thread: writes being summed, in the order they started
};

}  // namespace strata
