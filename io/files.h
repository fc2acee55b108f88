// Durable files: the one place strata reads whole files and writes files that must survive a
// crash. Every result is checked; errors name the path and what to do.
//   file_read          a whole file; any failure, a short read included, is an I/O error (exit 4),
//                      except that a caller may call a path that is not there bad input (exit 2)
//   AtomicFile         write to PATH.tmp, fsync, rename over PATH, fsync the directory: PATH is
//                      either the old file or the complete new one, never a torn one; the temp
//                      file is removed when commit() is not reached
//   file_write_atomic  the same for one buffer
//   fsync_dir / fsync_file   make a rename or a file's contents durable (a filesystem that cannot
//                      fsync a directory, EINVAL, is tolerated: the rename itself has happened)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "src/core/error.h"

namespace strata {

// Reads all of `path`. `what` names the file in messages ("recipe", "tokenizer file"); `hint`
// says what to do and is appended when the file cannot be opened; `if_absent` is the error kind
// when the path does not exist or is a directory (a recipe the user named: input).
std::string file_read(const std::string& path, const std::string& what = "file", const std::string& hint = "",
                      ErrorKind if_absent = ErrorKind::io);

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // creates PATH.tmp (an I/O error naming it if it cannot)
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes PATH.tmp unless committed

  void write(const void* data, size_t bytes);  // all of it, or an I/O error naming the offset
  void commit();                               // fsync, close, rename, fsync the directory
  const std::string& temp_path() const { return tmp_; }
  uint64_t written() const { return written_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t written_ = 0;
};

void file_write_atomic(const std::string& path, const void* data, size_t bytes);
inline void file_write_atomic(const std::string& path, const std::string& text) {
  file_write_atomic(path, text.data(), text.size());
}

void fsync_dir(const std::string& dir);   // "" = the current directory
void fsync_file(const std::string& path);

}  // namespace strata
