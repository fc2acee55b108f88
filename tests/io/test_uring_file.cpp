// Tests for io/uring_file (the NVMe file engine) and io/checksum. Every engine write is checked
// against a twin file written with plain pwrite, every engine read against plain pread of the
// same bytes, at awkward offsets and sizes (1, 4095, 4097, 1 MiB + 17: never block multiples),
// on both backends (io_uring, pread), at queue depth 1 and 64. Then: injected faults (short I/O,
// EIO, ENOSPC, EFBIG, EINVAL at the N-th kernel request), a filesystem that refuses O_DIRECT
// (one warning), a real full disk (a 1 MiB tmpfs), and a flipped byte on disk (checksum error).
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include "io/checksum.h"
#include "io/uring_file.h"
#include "src/core/error.h"
#include "tests/testing.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng() >> 56);
  return v;
}

// Equal length and bytes (a plain bool, so that a failure does not print megabytes).
bool bytes_equal(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  if (a.size() != b.size()) {
    UNSCOPED_INFO("sizes differ: " << a.size() << " vs " << b.size());
    return false;
  }
  const auto m = std::mismatch(a.begin(), a.end(), b.begin());
  if (m.first != a.end()) UNSCOPED_INFO("first difference at byte " << (m.first - a.begin()));
  return m.first == a.end();
}

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

// The twin: plain pread/pwrite on an ordinary (buffered) file.
struct Twin {
  std::string path;
  int fd;
  explicit Twin(const std::string& p) : path(p), fd(::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644)) {
    REQUIRE(fd >= 0);
  }
  ~Twin() { ::close(fd); }
  void write(uint64_t off, const unsigned char* src, size_t n) {
    REQUIRE(::pwrite(fd, src, n, off_t(off)) == ssize_t(n));
  }
  std::vector<unsigned char> read(uint64_t off, size_t n) {
    std::vector<unsigned char> v(n);
    REQUIRE(::pread(fd, v.data(), n, off_t(off)) == ssize_t(n));
    return v;
  }
};

// crc32c one bit at a time: the reference the fast path is checked against.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n, uint32_t seed = 0) {
  uint32_t c = ~seed;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

struct Op {
  uint64_t offset;
  size_t bytes;
};
// Awkward on purpose: single bytes, page-1 / page+1, 1 MiB + 17, a hole, overlaps, a tail.
const std::vector<Op> kWrites = {{0, 1},          {1, 4095},         {4095, 4097},     {10000, kMiB + 17},
                                 {5000, 70000},   {3 * kMiB + 5, 4097}, {2 * kMiB - 3, 7}, {3 * kMiB + 4101, 1}};
const std::vector<Op> kReads = {{0, 1},       {1, 4095},     {4095, 4097}, {17, kMiB + 17},
                                {65535, 2},   {2 * kMiB, 4097}, {3 * kMiB + 4101, 1}, {0, 3 * kMiB + 4102}};

// checksum_threads 0: the engine's default (file_engine_checksum_threads(): 2 on a 2-core machine).
FileEngineOptions options(size_t block, int qd, bool uring, std::vector<std::string>* warnings = nullptr,
                          int checksum_threads = 0) {
  FileEngineOptions o;
  o.block_bytes = block;
  o.queue_depth = qd;
  o.use_uring = uring;
  o.checksum_threads = checksum_threads;
  if (warnings) o.warn = [warnings](const std::string& m) { warnings->push_back(m); };
  return o;
}

// Writes kWrites with the engine (all in flight at once) and with the twin, reads back through a
// fresh engine (kReads, all in flight), and compares everything. Returns the writing engine's stats.
FileEngineStats twin_round_trip(const std::string& dir, const FileEngineOptions& opt) {
  const std::string path = dir + "/engine.bin";
  Twin twin(dir + "/twin.bin");
  std::vector<std::vector<unsigned char>> data;
  FileEngineStats st;
  {
    FileEngine io(opt);
    const int f = io.open(path, FileOpen::create);
    std::vector<FileTicket> tickets;
    for (size_t i = 0; i < kWrites.size(); ++i) {
      data.push_back(random_bytes(kWrites[i].bytes, 100 + i));
      tickets.push_back(io.write(f, kWrites[i].offset, data.back().data(), kWrites[i].bytes));
      twin.write(kWrites[i].offset, data.back().data(), kWrites[i].bytes);
    }
    // a read submitted behind the writes, without waiting, sees them (same blocks run in order)
    std::vector<unsigned char> early(kMiB + 17);
    const FileTicket r = io.read(f, 17, early.data(), early.size());
    for (auto t : tickets) io.wait(t);
    io.wait(r);
    CHECK(bytes_equal(early, twin.read(17, early.size())));
    CHECK(io.size(f) == 3 * kMiB + 4102);
    io.close(f);
    st = io.stats();
  }
  REQUIRE(bytes_equal(file_bytes(path), file_bytes(twin.path)));  // same bytes, same length
  FileEngine io(opt);
  const int f = io.open(path, FileOpen::existing);
  std::vector<std::vector<unsigned char>> got;
  std::vector<FileTicket> tickets;
  for (const Op& op : kReads) {
    got.emplace_back(op.bytes, 0xEE);
    tickets.push_back(io.read(f, op.offset, got.back().data(), op.bytes));
  }
  for (size_t i = 0; i < kReads.size(); ++i) {
    io.wait(tickets[i]);
    INFO("read at " << kReads[i].offset << ", " << kReads[i].bytes << " bytes");
    CHECK(bytes_equal(got[i], twin.read(kReads[i].offset, kReads[i].bytes)));
  }
  // a read past the end is refused before any I/O
  std::vector<unsigned char> past(2);
  REQUIRE_THROWS_WITH(io.read(f, 3 * kMiB + 4101, past.data(), 2),
                      Catch::Contains(path) && Catch::Contains("holds 3149830 bytes"));
  return st;
}

// Runs fn(dir) in a child process, in a mount namespace of its own, with a fresh `fstype`
// mounted at dir. Returns fn's text, or "SKIP: why" when mounting is not permitted here.
std::string run_on_mount(const std::string& fstype, const std::string& mount_opts,
                         const std::function<std::string(const std::string&)>& fn) {
  const std::string dir = (fs::path(STRATA_BINARY_DIR) / "test_tmp" / ("uring_mnt_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    std::string out;
    if (::unshare(CLONE_NEWNS) != 0) out = std::string("SKIP: unshare(CLONE_NEWNS): ") + std::strerror(errno);
    else if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      out = std::string("SKIP: making / private: ") + std::strerror(errno);
    else if (::mount(fstype.c_str(), dir.c_str(), fstype.c_str(), 0, mount_opts.c_str()) != 0)
      out = "SKIP: mount -t " + fstype + ": " + std::strerror(errno);
    else {
      try {
        out = fn(dir);
      } catch (const std::exception& e) {
        out = std::string("unexpected exception: ") + e.what();
      }
    }
    size_t off = 0;
    while (off < out.size()) {
      const ssize_t w = ::write(pipefd[1], out.data() + off, out.size() - off);
      if (w <= 0) break;
      off += size_t(w);
    }
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  fs::remove_all(dir);
  REQUIRE(WIFEXITED(status));
  return out;
}

}  // namespace

TEST_CASE("crc32c matches the standard check vectors and a bitwise twin", "[uring][checksum]") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  std::vector<unsigned char> v(32, 0);
  CHECK(crc32c(v.data(), 32) == 0x8A9136AAu);  // RFC 3720 B.4
  std::fill(v.begin(), v.end(), 0xFF);
  CHECK(crc32c(v.data(), 32) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) v[size_t(i)] = static_cast<unsigned char>(i);
  CHECK(crc32c(v.data(), 32) == 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) v[size_t(i)] = static_cast<unsigned char>(31 - i);
  CHECK(crc32c(v.data(), 32) == 0x113FDB5Cu);
  CHECK(crc32c(nullptr, 0) == 0u);

  const auto data = random_bytes(kMiB + 64, 7);
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(4095), size_t(4097), size_t(24575),
                   size_t(24576), size_t(24577), size_t(49153), kMiB + 17})
    for (size_t start : {size_t(0), size_t(1), size_t(5)}) {
      INFO(n << " bytes from " << start);
      const uint32_t want = crc32c_bitwise(data.data() + start, n);
      CHECK(crc32c(data.data() + start, n) == want);
      // in pieces: the seed carries the checksum so far
      const size_t cut = n / 3;
      CHECK(crc32c(data.data() + start + cut, n - cut, crc32c(data.data() + start, cut)) == want);
    }
}

TEST_CASE("file engine: writes and reads equal plain pwrite/pread at awkward sizes", "[uring]") {
  testing::TempDir tmp("uring_twin");
  for (int threads : {1, 3})
    for (bool uring : {true, false})
      for (int qd : {1, 64})
        for (size_t block : {size_t(4096), size_t(65536)}) {
          std::vector<std::string> warnings;
          const auto opt = options(block, qd, uring, &warnings, threads);
          INFO("checksum threads " << threads);
          {
            FileEngine probe(opt);
            INFO("backend " << probe.backend() << ", queue depth " << qd << ", block " << block);
            if (uring) {
              CHECK(std::string(probe.backend()) == "io_uring");
              CHECK(probe.fixed_buffers());
            } else {
              CHECK(std::string(probe.backend()) == "pread");
            }
          }
          INFO("io_uring " << uring << ", queue depth " << qd << ", block " << block);
          const FileEngineStats st = twin_round_trip(tmp.path.string(), opt);
          CHECK(warnings.empty());  // ext4 takes O_DIRECT
          CHECK(st.write_bytes > 0);
          CHECK(st.resubmits == 0);
          // many in flight: the 1 MiB + 17 write alone spans 257 blocks of 4 KiB and 17 of 64 KiB,
          // started together as staging buffers allow (with checksum workers, a block reaches the
          // kernel when its worker is done: how many meet there is up to the scheduler)
          if (uring && qd > 1) {
            if (threads == 1) CHECK(st.max_in_flight >= (block == 4096 ? 64 : 17));
            CHECK(st.max_in_flight <= qd);
          } else {
            CHECK(st.max_in_flight == 1);
          }
        }
}

TEST_CASE("file engine: the disk-busy clock counts the time transfers are in flight, once across engines", "[uring]") {
  testing::TempDir tmp("uring_busy");
  for (bool uring : {true, false}) {
    INFO("io_uring " << uring);
    const auto opt = options(65536, 16, uring, nullptr);
    const std::vector<unsigned char> data = random_bytes(8 * kMiB, 7);
    std::vector<unsigned char> back(data.size());
    const double idle0 = file_engines_busy_seconds();
    CHECK(file_engines_busy_seconds() == idle0);  // nothing in flight: the clock stands still
    const auto t0 = std::chrono::steady_clock::now();
    {
      FileEngine a(opt), b(opt);  // two engines at once, as the optimizer state and the checkpoints
      const int fa = a.open((tmp.path / "a.bin").string(), FileOpen::create);
      const int fb = b.open((tmp.path / "b.bin").string(), FileOpen::create);
      a.write(fa, 0, data.data(), data.size());
      b.write(fb, 0, data.data(), data.size());
      a.wait_all();
      b.wait_all();
      a.wait(a.read(fa, 0, back.data(), back.size()));
      CHECK(back == data);
      a.close(fa);
      b.close(fb);
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double busy = file_engines_busy_seconds() - idle0;
    CHECK(busy > 0);
    // a union over engines and requests: never more than the time that passed (a sum over
    // requests in flight together would exceed it at queue depth 16)
    CHECK(busy <= wall);
  }
}

TEST_CASE("file engine: whole aligned blocks move without a copy, and equal the twin", "[uring]") {
  testing::TempDir tmp("uring_zero_copy");
  const size_t B = 65536, n = 5 * B + 4096;
  std::unique_ptr<unsigned char, decltype(&std::free)> mem(static_cast<unsigned char*>(std::aligned_alloc(4096, n)),
                                                           &std::free);
  const auto data = random_bytes(n, 41);
  std::memcpy(mem.get(), data.data(), n);
  std::unique_ptr<unsigned char, decltype(&std::free)> back(static_cast<unsigned char*>(std::aligned_alloc(4096, 13 * B)),
                                                            &std::free);
  for (int mode = 0; mode < 3; ++mode) {  // io_uring with the caller's memory registered, or not; pread
    const bool uring = mode < 2;
    INFO("io_uring " << uring << ", caller's memory registered " << (mode == 0));
    const std::string path = (tmp.path / "z.bin").string();
    Twin twin((tmp.path / "twin.bin").string());
    FileEngine io(options(B, 8, uring));
    if (mode == 0) {
      CHECK(io.register_memory(mem.get(), n));
      CHECK(io.register_memory(back.get(), 13 * B));
    }
    const int f = io.open(path, FileOpen::create);
    // at offset 0: blocks 0..4 whole from aligned memory, the 4096-byte tail staged; at 4096:
    // block 0 staged (it starts inside), blocks 1..4 whole (their bytes start 61440 in: aligned)
    const FileTicket a = io.write(f, 0, mem.get(), n);
    const FileTicket b = io.write(f, 7 * B + 4096, mem.get(), n);
    io.wait(a);
    io.wait(b);
    twin.write(0, data.data(), n);
    twin.write(7 * B + 4096, data.data(), n);
    CHECK(io.stats().zero_copy_blocks == 5 + 4);
    io.wait(io.read(f, 0, back.get(), 12 * B + 8192));  // 12 whole blocks, one staged
    CHECK(io.stats().zero_copy_blocks == 9 + 12);
    CHECK(bytes_equal(std::vector<unsigned char>(back.get(), back.get() + 12 * B + 8192), twin.read(0, 12 * B + 8192)));
    io.close(f);
    CHECK(bytes_equal(file_bytes(path), file_bytes(twin.path)));
    // a flipped byte in a block read straight into the caller's memory is caught too
    {
      const int fd = ::open(path.c_str(), O_RDWR);
      unsigned char x = 0x5A;
      REQUIRE(::pwrite(fd, &x, 1, 3 * B + 100) == 1);
      ::close(fd);
    }
    const int g = io.open(path, FileOpen::existing);
    REQUIRE_THROWS_WITH(io.wait(io.read(g, 0, back.get(), 4 * B)),
                        Catch::Contains("checksum mismatch in " + path + " at offset " + std::to_string(3 * B)));
    if (mode == 0) {
      io.unregister_memory(mem.get());
      io.unregister_memory(back.get());
    }
  }
}

TEST_CASE("file engine: injected short transfers are resubmitted for the rest", "[uring]") {
  testing::TempDir tmp("uring_short");
  for (bool uring : {true, false}) {
    INFO("io_uring " << uring);
    const std::string path = (tmp.path / "short.bin").string();
    Twin twin((tmp.path / "twin.bin").string());
    FileEngine io(options(65536, 8, uring));
    const int f = io.open(path, FileOpen::create);
    const auto data = random_bytes(kMiB + 17, 3);
    io.inject_fault(IoFault::short_io, 3);  // the third block's write moves half of it
    io.wait(io.write(f, 4097, data.data(), data.size()));
    twin.write(4097, data.data(), data.size());
    io.inject_fault(IoFault::short_io, 2);  // and a read
    std::vector<unsigned char> back(data.size());
    io.wait(io.read(f, 4097, back.data(), back.size()));
    CHECK(bytes_equal(back, data));
    const FileEngineStats st = io.stats();
    CHECK(st.faults_injected == 2);
    CHECK(st.resubmits == 2);
    io.close(f);
    CHECK(bytes_equal(file_bytes(path), file_bytes(twin.path)));
  }
}

TEST_CASE("file engine: EIO, ENOSPC, EFBIG, EINVAL at the N-th request name file, offset, length", "[uring]") {
  testing::TempDir tmp("uring_faults");
  const std::string path = (tmp.path / "faults.bin").string();
  const auto data = random_bytes(kMiB, 5);
  const std::pair<IoFault, const char*> kinds[] = {
      {IoFault::eio, "EIO"}, {IoFault::enospc, "ENOSPC"}, {IoFault::efbig, "EFBIG"}, {IoFault::einval, "EINVAL"}};
  for (int threads : {1, 4})
    for (bool uring : {true, false})
      for (auto [fault, name] : kinds) {
        INFO("io_uring " << uring << ", " << name << ", checksum threads " << threads);
        FileEngine io(options(65536, 4, uring, nullptr, threads));
        const int f = io.open(path, FileOpen::create);
        io.wait(io.write(f, 0, data.data(), 65536));  // saved before the fault
        // the 3rd kernel request of the next write is its 3rd block: offset 196608 of the file
        // (with checksum workers too: summed blocks go to the kernel in the order they started)
        io.inject_fault(fault, 3);
        try {
          io.wait(io.write(f, 65536, data.data(), kMiB - 65536));
          FAIL("no error");
        } catch (const Error& e) {
          CHECK(e.exit_code() == 4);
          const std::string m = e.what();
          CHECK_THAT(m, Catch::Contains("cannot write " + path) && Catch::Contains("at offset 196608, 65536 bytes") &&
                            Catch::Contains(std::string("(") + name + ")") &&
                            Catch::Contains("request: offset 65536, 983040 bytes"));
        }
        // a read fails the same way, and the engine goes on working afterwards
        std::vector<unsigned char> back(65536);
        io.inject_fault(fault, 1);
        REQUIRE_THROWS_WITH(io.wait(io.read(f, 0, back.data(), 100)),
                            Catch::Contains("cannot read " + path) && Catch::Contains("at offset 0, 65536 bytes") &&
                                Catch::Contains(name));
        io.wait(io.read(f, 0, back.data(), 65536));
        CHECK(std::equal(back.begin(), back.end(), data.begin()));  // nothing saved earlier is lost
      }
}

TEST_CASE("file engine: STRATA_IO_FAULT sets the fault from the environment", "[uring]") {
  testing::TempDir tmp("uring_env");
  const std::string path = (tmp.path / "env.bin").string();
  ::setenv("STRATA_IO_FAULT", "enospc@2", 1);
  std::vector<unsigned char> data(3 * 4096, 1);
  {
    FileEngine io(options(4096, 4, true));
    const int f = io.open(path, FileOpen::create);
    REQUIRE_THROWS_WITH(io.wait(io.write(f, 0, data.data(), data.size())),
                        Catch::Contains("at offset 4096, 4096 bytes") && Catch::Contains("ENOSPC"));
  }
  ::setenv("STRATA_IO_FAULT", "eoi@2", 1);
  REQUIRE_THROWS_WITH(FileEngine(options(4096, 4, true)), Catch::Contains("STRATA_IO_FAULT='eoi@2'"));
  ::unsetenv("STRATA_IO_FAULT");
}

namespace {

// A new file at path holding data, written through a checksummed engine of `block`-byte blocks
// and closed (synced, its checksum sidecar written).
void write_whole(const std::string& path, const std::vector<unsigned char>& data, size_t block) {
  FileEngine io(options(block, 2, true));
  const int f = io.open(path, FileOpen::create);
  io.wait(io.write(f, 0, data.data(), data.size()));
  io.close(f);
}

}  // namespace

TEST_CASE("file engine: a flipped byte on disk is a checksum error naming file and offset", "[uring]") {
  testing::TempDir tmp("uring_corrupt");
  const std::string path = (tmp.path / "c.bin").string();
  const auto data = random_bytes(300000, 9);
  write_whole(path, data, 65536);
  {
    const int fd = ::open(path.c_str(), O_RDWR);
    unsigned char b;
    REQUIRE(::pread(fd, &b, 1, 200000) == 1);
    b ^= 0x10;
    REQUIRE(::pwrite(fd, &b, 1, 200000) == 1);
    ::close(fd);
  }
  FileEngine io(options(65536, 8, true));
  const int f = io.open(path, FileOpen::existing);
  std::vector<unsigned char> back(data.size());
  try {
    io.wait(io.read(f, 0, back.data(), back.size()));
    FAIL("the flipped byte went unnoticed");
  } catch (const Error& e) {
    CHECK(e.exit_code() == 4);
    CHECK_THAT(std::string(e.what()), Catch::Contains("checksum mismatch in " + path + " at offset 196608"));
  }
  // the blocks before it still read back
  io.wait(io.read(f, 0, back.data(), 196608));
  CHECK(std::equal(back.begin(), back.begin() + 196608, data.begin()));
  // a write into that block reads it first, so the damage is caught there too
  REQUIRE_THROWS_WITH(io.wait(io.write(f, 196609, data.data(), 10)), Catch::Contains("checksum mismatch"));
  // cut short behind the engine's back: the early end is caught by the checksum too
  fs::resize_file(path, 70000);
  REQUIRE_THROWS_WITH(io.wait(io.read(f, 65536, back.data(), 10)),
                      Catch::Contains("checksum mismatch in " + path + " at offset 65536") &&
                          Catch::Contains("ends at byte 70000"));
}

TEST_CASE("file engine: reopening checks the sidecar", "[uring]") {
  testing::TempDir tmp("uring_sidecar");
  const std::string path = (tmp.path / "s.bin").string();
  const auto data = random_bytes(10000, 11);
  write_whole(path, data, 4096);
  REQUIRE(fs::file_size(path) == 10000);
  REQUIRE_THROWS_WITH(FileEngine(options(8192, 2, true)).open(path, FileOpen::existing),
                      Catch::Contains("block size of 4096 bytes"));
  fs::resize_file(path, 9000);
  REQUIRE_THROWS_WITH(FileEngine(options(4096, 2, true)).open(path, FileOpen::existing),
                      Catch::Contains("holds 9000 bytes"));
  fs::remove(path + ".crc32c");
  REQUIRE_THROWS_WITH(FileEngine(options(4096, 2, true)).open(path, FileOpen::existing),
                      Catch::Contains("checksum sidecar"));
  REQUIRE_THROWS_WITH(FileEngine(options(4096, 2, true)).open(tmp.path.string() + "/no/such/dir/x", FileOpen::create),
                      Catch::Contains("no/such/dir/x"));
  REQUIRE_THROWS_WITH(FileEngine(options(5000, 2, true)), Catch::Contains("multiple of 4096"));
}

TEST_CASE("file engine: tmpfs (/dev/shm) and a filesystem that refuses O_DIRECT", "[uring]") {
  // /dev/shm: tmpfs takes O_DIRECT since Linux 6.6; before that it refuses it and the engine
  // falls back to buffered I/O with one warning. Either way the bytes equal the twin's.
  if (fs::is_directory("/dev/shm")) {
    const std::string dir = "/dev/shm/strata_uring_" + std::to_string(::getpid());
    fs::create_directories(dir);
    std::vector<std::string> warnings;
    const auto opt = options(65536, 16, true, &warnings);
    bool direct;
    {
      FileEngine io(opt);
      direct = io.direct(io.open(dir + "/probe.bin", FileOpen::create));
    }
    twin_round_trip(dir, opt);
    fs::remove_all(dir);
    INFO("tmpfs took O_DIRECT: " << direct);
    CHECK(warnings.size() == (direct ? 0u : 3u));  // one per engine: the probe, and the twin round
                                                   // trip's writer and reader
  }
  // ramfs refuses O_DIRECT on every kernel: three files, one engine, exactly one warning
  const std::string out = run_on_mount("ramfs", "", [](const std::string& dir) {
    std::vector<std::string> warnings;
    FileEngine io(options(4096, 8, true, &warnings));
    std::string report;
    for (int i = 0; i < 3; ++i) {
      const std::string path = dir + "/f" + std::to_string(i);
      const int f = io.open(path, FileOpen::create);
      if (io.direct(f)) report += "direct on ramfs; ";
      const auto data = random_bytes(kMiB + 17, 20 + uint64_t(i));
      io.wait(io.write(f, 4095, data.data(), data.size()));
      std::vector<unsigned char> back(data.size());
      io.wait(io.read(f, 4095, back.data(), back.size()));
      io.close(f);
      std::vector<unsigned char> plain(data.size());
      const int fd = ::open(path.c_str(), O_RDONLY);
      const bool same = ::pread(fd, plain.data(), plain.size(), 4095) == ssize_t(plain.size()) && plain == data;
      ::close(fd);
      if (back != data || !same) report += "bytes differ in " + path + "; ";
    }
    report += "warnings=" + std::to_string(warnings.size());
    if (!warnings.empty()) report += " first=" + warnings[0];
    return report;
  });
  if (out.rfind("SKIP:", 0) == 0) {
    WARN("skipped the ramfs part: " << out);
    return;
  }
  CHECK_THAT(out, Catch::StartsWith("warnings=1 first=the filesystem of") && Catch::Contains("refuses direct I/O"));
}

TEST_CASE("file engine: a full disk (a 1 MiB tmpfs) is ENOSPC naming the file", "[uring]") {
  const std::string out = run_on_mount("tmpfs", "size=1m", [](const std::string& dir) {
    const auto data = random_bytes(2 * kMiB, 30);
    for (bool uring : {true, false}) {
      FileEngine io(options(65536, 8, uring));
      const std::string path = dir + "/full.bin";
      const int f = io.open(path, FileOpen::create);
      try {
        io.wait(io.write(f, 0, data.data(), data.size()));
        io.close(f);
        return std::string("no error from a 2 MiB write to a 1 MiB disk");
      } catch (const Error& e) {
        const std::string m = e.what();
        if (e.exit_code() != 4 || m.find("cannot write " + path) == std::string::npos ||
            m.find("(ENOSPC)") == std::string::npos || m.find("request: offset 0, 2097152 bytes") == std::string::npos)
          return "unexpected error: " + m;
      }
      try {
        io.close(f);  // the sync may fail too (the sidecar); either way the handle is closed
      } catch (const Error&) {
      }
      fs::remove(path);
    }
    return std::string("ENOSPC");
  });
  if (out.rfind("SKIP:", 0) == 0) {
    WARN("skipped: cannot mount a tmpfs here (needs root): " << out);
    return;
  }
  CHECK(out == "ENOSPC");
}

// ---- checksum threads (FileEngineOptions::checksum_threads) ----------------------------------------

TEST_CASE("file engine: many blocks in flight with several checksum threads equal the one-thread engine", "[uring]") {
  testing::TempDir tmp("uring_threads");
  const int cores = file_engine_checksum_threads();
  CHECK(cores >= 1);
  CHECK(cores <= 4);
  const size_t B = 4096, n = 8 * kMiB + 4097;
  const auto data = random_bytes(n, 77);
  // aligned memory too: whole blocks summed straight from the caller's buffer
  std::unique_ptr<unsigned char, decltype(&std::free)> aligned(static_cast<unsigned char*>(std::aligned_alloc(4096, 2 * kMiB)),
                                                               &std::free);
  std::memcpy(aligned.get(), data.data(), 2 * kMiB);
  for (bool uring : {true, false}) {
    std::string sidecar;  // the one-thread engine's: every count of threads writes the same bytes
    for (int threads : {1, 2, 4, 7}) {
      INFO("io_uring " << uring << ", checksum threads " << threads);
      const std::string path = (tmp.path / (std::to_string(threads) + "threads.bin")).string();
      Twin twin((tmp.path / "twin.bin").string());
      FileEngine io(options(B, 64, uring, nullptr, threads));
      const int f = io.open(path, FileOpen::create);
      // pieces of 64 KiB + 3 at odd offsets, all in flight, then overwrites of parts of them
      // (read-modify-write of the blocks they share) and the aligned buffer, none waited yet
      std::vector<FileTicket> t;
      for (size_t off = 0; off < n; off += 65539) {
        const size_t len = std::min<size_t>(65539, n - off);
        t.push_back(io.write(f, off + 11, data.data() + off, len));
        twin.write(off + 11, data.data() + off, len);
      }
      for (size_t off = 5000; off < n; off += 1000003) {
        t.push_back(io.write(f, off, data.data() + 7, 9000));
        twin.write(off, data.data() + 7, 9000);
      }
      t.push_back(io.write(f, 3 * kMiB, aligned.get(), 2 * kMiB));
      twin.write(3 * kMiB, aligned.get(), 2 * kMiB);
      std::vector<unsigned char> early(3 * kMiB + 5);  // read behind the writes: sees them
      t.push_back(io.read(f, 2 * kMiB - 1, early.data(), early.size()));
      for (FileTicket k : t) io.wait(k);
      CHECK(bytes_equal(early, twin.read(2 * kMiB - 1, early.size())));
      std::vector<unsigned char> back(n + 11);
      io.wait(io.read(f, 0, back.data(), back.size()));
      CHECK(bytes_equal(back, twin.read(0, back.size())));
      io.close(f);
      CHECK(bytes_equal(file_bytes(path), file_bytes(twin.path)));
      const std::vector<unsigned char> side = file_bytes(path + ".crc32c");
      if (threads == 1) sidecar.assign(side.begin(), side.end());
      else CHECK(std::string(side.begin(), side.end()) == sidecar);
      // reopened: every block verifies through the workers
      const int g = io.open(path, FileOpen::existing);
      std::vector<unsigned char> again(n + 11);
      io.wait(io.read(g, 0, again.data(), again.size()));
      CHECK(again == back);
      io.close(g);
    }
  }
}

TEST_CASE("file engine: corrupted blocks are caught by the checksum workers, naming file and offset", "[uring]") {
  testing::TempDir tmp("uring_threads_corrupt");
  const std::string path = (tmp.path / "c.bin").string();
  const size_t B = 65536;
  const auto data = random_bytes(40 * B, 13);
  write_whole(path, data, B);
  const int fd = ::open(path.c_str(), O_RDWR);
  unsigned char x = 0;
  REQUIRE(::pread(fd, &x, 1, 17 * B + 5) == 1);
  x ^= 0x01;
  REQUIRE(::pwrite(fd, &x, 1, 17 * B + 5) == 1);
  ::close(fd);
  for (bool uring : {true, false})
    for (int threads : {2, 4}) {
      INFO("io_uring " << uring << ", checksum threads " << threads);
      FileEngine io(options(B, 16, uring, nullptr, threads));
      const int f = io.open(path, FileOpen::existing);
      std::vector<unsigned char> back(data.size());
      try {
        io.wait(io.read(f, 0, back.data(), back.size()));
        FAIL("the flipped bit went unnoticed");
      } catch (const Error& e) {
        CHECK(e.exit_code() == 4);
        CHECK_THAT(std::string(e.what()), Catch::Contains("checksum mismatch in " + path + " at offset " +
                                                          std::to_string(17 * B)));
      }
      // other requests in flight with it complete, the blocks around it read back
      const FileTicket a = io.read(f, 0, back.data(), 17 * B), b = io.read(f, 18 * B, back.data() + 18 * B, 22 * B);
      REQUIRE_THROWS_WITH(io.wait(io.write(f, 17 * B + 100, data.data(), 10)), Catch::Contains("checksum mismatch"));
      io.wait(a);
      io.wait(b);
      CHECK(std::equal(back.begin(), back.begin() + 17 * B, data.begin()));
      CHECK(std::equal(back.begin() + 18 * B, back.end(), data.begin() + 18 * B));
    }
}

TEST_CASE("file engine: destroyed with requests in flight on its checksum workers, nothing hangs", "[uring]") {
  testing::TempDir tmp("uring_threads_destroy");
  const auto data = random_bytes(4 * kMiB, 17);
  std::vector<unsigned char> back(data.size());
  for (bool uring : {true, false}) {
    INFO("io_uring " << uring);
    const std::string path = (tmp.path / "d.bin").string();
    {
      FileEngine io(options(4096, 32, uring, nullptr, 4));
      const int f = io.open(path, FileOpen::create);
      io.write(f, 0, data.data(), data.size());  // never waited: the destructor finishes it
      io.read(f, 0, back.data(), back.size());
    }
    std::vector<unsigned char> again(data.size());  // declared first: it outlives the engine's reads
    FileEngine io(options(4096, 32, uring, nullptr, 3));
    const int f = io.open(path, FileOpen::existing);  // it was synced, its sidecar written
    io.wait(io.read(f, 0, again.data(), again.size()));
    CHECK(again == data);
    // and an error in flight with the workers, not waited for either
    io.inject_fault(IoFault::eio, 5);
    io.read(f, 0, again.data(), again.size());
  }
  REQUIRE_THROWS_WITH(FileEngine(options(4096, 4, true, nullptr, -1)), Catch::Contains("checksum threads"));
  REQUIRE_THROWS_WITH(FileEngine(options(4096, 4, true, nullptr, 1000)), Catch::Contains("checksum threads"));
}
