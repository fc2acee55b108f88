// io/files: the one module for whole-file reads, atomic writes and directory fsyncs.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/files.h"
#include "src/core/error.h"
#include "tests/testing.h"

namespace fs = std::filesystem;

namespace strata {

namespace {

ErrorKind kind_of(const std::function<void()>& f, std::string* message) {
  try {
    f();
  } catch (const Error& e) {
    *message = e.what();
    return e.kind();
  }
  FAIL("no error");
  return ErrorKind::input;
}

}  // namespace

TEST_CASE("file_read returns every byte, binary and large files included", "[files]") {
  testing::TempDir dir("files_read");
  std::string bytes;
  for (uint32_t i = 0; i < 300000; ++i) bytes += char(i * 7919u % 256);  // NULs and high bytes, > any buffer
  const std::string path = dir.file("blob.bin", bytes);
  CHECK(file_read(path) == bytes);
  CHECK(file_read(dir.file("empty", "")).empty());
  // a file whose size the kernel does not know in advance
  CHECK(file_read("/proc/self/status").find("Name:") != std::string::npos);
}

TEST_CASE("file_read failures name the file, say what to do, and have the caller's kind", "[files]") {
  testing::TempDir dir("files_read_errors");
  const std::string missing = (dir.path / "nope.toml").string();
  std::string msg;
  CHECK(kind_of([&] { file_read(missing, "recipe", "check the path"); }, &msg) == ErrorKind::io);
  CHECK_THAT(msg, Catch::Contains("cannot open recipe " + missing) && Catch::Contains("No such file") &&
                      Catch::Contains("check the path"));
  CHECK(kind_of([&] { file_read(missing, "recipe", "", ErrorKind::input); }, &msg) == ErrorKind::input);
  CHECK(kind_of([&] { file_read(dir.path.string(), "recipe", "", ErrorKind::input); }, &msg) == ErrorKind::input);
  CHECK_THAT(msg, Catch::Contains("Is a directory"));
  // a file that exists but cannot be read is an I/O error whatever the caller says of absence
  if (geteuid() != 0) {
    const std::string locked = dir.file("locked", "x");
    fs::permissions(locked, fs::perms::none);
    CHECK(kind_of([&] { file_read(locked, "file", "", ErrorKind::input); }, &msg) == ErrorKind::io);
  }
}

TEST_CASE("file_write_atomic replaces the file whole and leaves no temp file", "[files]") {
  testing::TempDir dir("files_write");
  const std::string path = (dir.path / "out.json").string();
  file_write_atomic(path, std::string("first"));
  file_write_atomic(path, std::string("second, longer"));
  CHECK(file_read(path) == "second, longer");
  CHECK_FALSE(fs::exists(path + ".tmp"));
  for (const auto& e : fs::directory_iterator(dir.path)) CHECK(e.path().filename() == "out.json");
}

TEST_CASE("a failed atomic write keeps the old file and removes the temp file", "[files]") {
  testing::TempDir dir("files_write_fail");
  const std::string path = (dir.path / "out.bin").string();
  file_write_atomic(path, std::string("old contents"));
  // a file size limit makes write() fail part way (EFBIG), as a full disk would
  std::string msg;
  const std::string big(64 * 1024, 'x');
  const ErrorKind kind = kind_of(
      [&] {
        testing::FileSizeLimit limit(16 * 1024);
        file_write_atomic(path, big);
      },
      &msg);
  CHECK(kind == ErrorKind::io);
  CHECK_THAT(msg, Catch::Contains(path + ".tmp") && Catch::Contains("File too large"));
  CHECK(file_read(path) == "old contents");
  CHECK_FALSE(fs::exists(path + ".tmp"));
  // a directory that is not there: the temp file cannot be created
  const std::string nowhere = (dir.path / "no_dir" / "f").string();
  CHECK(kind_of([&] { file_write_atomic(nowhere, std::string("x")); }, &msg) == ErrorKind::io);
  CHECK_THAT(msg, Catch::Contains(nowhere + ".tmp"));
}

TEST_CASE("fsync of a directory or file is checked", "[files]") {
  testing::TempDir dir("files_fsync");
  CHECK_NOTHROW(fsync_dir(dir.path.string()));
  CHECK_NOTHROW(fsync_file(dir.file("f", "x")));
  std::string msg;
  CHECK(kind_of([&] { fsync_dir((dir.path / "absent").string()); }, &msg) == ErrorKind::io);
  CHECK_THAT(msg, Catch::Contains((dir.path / "absent").string()));
  CHECK(kind_of([&] { fsync_dir(dir.file("not_a_dir", "x")); }, &msg) == ErrorKind::io);
}

}  // namespace strata
