// Hugging Face safetensors checkpoints: read one file (mmap'd, validated on open), read a model
// directory (one file, or shards listed by model.safetensors.index.json), check its tensors
// against what a model expects, and write files and sharded directories the way HF does.
//
// File layout: u64 little-endian header length N | N bytes of JSON header | data section.
// Header: {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//          "__metadata__": {"<str>": "<str>"}}; offsets are relative to the data section.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/dtype.h"

namespace strata {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte span in the data section
  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

// Largest header we accept (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One .safetensors file, mmap'd read-only (MAP_PRIVATE), fully validated on open.
// HAZARD: if another process truncates the file while it is mapped, touching the data raises SIGBUS.
class SafetensorsFile {
 public:
  // Throws strata::Error naming the path and the problem: kind io when the file cannot be
  // read, kind input when its content is not a valid safetensors file.
  static SafetensorsFile open(const std::string& path);

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // sorted by begin
  const SafetensorsEntry* find(std::string_view name) const;                 // null if absent
  const void* data(const SafetensorsEntry& e) const;  // may be unaligned for e.dtype
  // Copies e into dst (numel elements of dst_type): F32/BF16/F16 convert to f32/bf16/f16, other
  // dtypes only copy to the same type; throws (input) otherwise.
  void read(const SafetensorsEntry& e, DType dst_type, void* dst) const;
  // Drops the mapped pages of e's bytes from this process's resident set once they were read
  // (they stay in the page cache; touching them again reads them back). Loading a model tensor
  // by tensor then holds one tensor's pages at a time, not the whole file.
  void release(const SafetensorsEntry& e) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return map_bytes_; }

  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

 private:
  SafetensorsFile() = default;
  void unmap();

  std::string path_;
  void* map_ = nullptr;
  uint64_t map_bytes_ = 0;
  uint64_t data_offset_ = 0;  // 8 + N
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> by_name_;  // name -> index in entries_
  std::map<std::string, std::string> metadata_;
};

// An HF model directory: model.safetensors, or model-0000k-of-0000n.safetensors shards plus
// model.safetensors.index.json. Like transformers, a single model.safetensors wins when both exist.
class SafetensorsDir {
 public:
  // Opens every file; checks the index: every shard exists and is valid, the index names are
  // exactly the shards' contents, no tensor in two shards.
  static SafetensorsDir open(const std::string& dir);

  std::vector<std::string> names() const;  // sorted
  const SafetensorsEntry* find(std::string_view name) const;
  const std::string& file_of(std::string_view name) const;  // the shard path holding it; throws if absent
  const std::string& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  bool sharded() const { return sharded_; }

  // Copies tensor `name` into dst (numel elements of dst_type). F32/BF16/F16 on disk convert to
  // f32/bf16/f16; I32/I64 only copy to the same type. Throws when absent or not convertible.
  void read(std::string_view name, DType dst_type, void* dst) const;
  // SafetensorsFile::release for tensor `name` (read it first).
  void release(std::string_view name) const;

 private:
  struct Loc {
    size_t file;
    const SafetensorsEntry* entry;
  };
  const Loc* locate(std::string_view name) const;

  std::string dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Loc, std::less<>> by_name_;
};

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Compares a dir's tensors with what a model expects; throws ONE strata::Error (kind input) that
// lists every missing tensor, every unexpected tensor and every shape mismatch (name, file, shape
// on disk vs expected). `why` says where the expectation comes from.
void safetensors_check_tensors(const SafetensorsDir& dir, const std::vector<ExpectedTensor>& expected,
                               const std::string& why);

// Streams a tensor's bytes in order through `write` (any number of calls whose lengths sum to
// the tensor's bytes), so a writer can convert a tensor piece by piece instead of holding it.
using TensorSink = std::function<void(const void* bytes, size_t n)>;
using TensorStream = std::function<void(const TensorSink& write)>;

struct TensorToWrite {
  using Fill = std::function<void(uint64_t offset, void* dst, size_t bytes)>;
  TensorToWrite() = default;
  TensorToWrite(std::string n, DType t, std::vector<int64_t> s, const void* d)
      : name(std::move(n)), dtype(t), shape(std::move(s)), data(d) {}
  TensorToWrite(std::string n, DType t, std::vector<int64_t> s, Fill f)
      : name(std::move(n)), dtype(t), shape(std::move(s)), fill(std::move(f)) {}

  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype_size bytes; or, when null, `stream` or `fill` produces them
  TensorStream stream = {};
  // Instead of data (streaming: the tensor is never whole in RAM): fill(offset, dst, bytes)
  // puts bytes [offset, offset + bytes) of the tensor into dst. The writer asks for pieces of at
  // most kSafetensorsFillBytes, in order, each a whole number of elements.
  Fill fill;
};
constexpr size_t kSafetensorsFillBytes = size_t(16) << 20;

// Writes one file: tensors laid out in the given order, header padded with spaces to a multiple
// of 8, metadata {"format": "pt"} plus extras. Written to path + ".tmp", fsync'd, renamed.
// I/O failures throw strata::Error of kind io naming the path and the errno text.
void safetensors_write_file(const std::string& path, const std::vector<TensorToWrite>& tensors,
                            const std::map<std::string, std::string>& metadata = {});

// Writes an HF model's weights into dir (created if missing): "model.safetensors" when all
// tensors fit in max_shard_bytes, otherwise "model-00001-of-0000N.safetensors" shards (greedy in
// the given order; a tensor bigger than the limit gets its own shard) plus
// "model.safetensors.index.json" {"metadata": {"total_size": <sum of tensor bytes>},
// "weight_map": {name: file}}. Removes a stale model.safetensors / index / model-*-of-*.safetensors
// left by an earlier write of a different layout, so transformers cannot load an old file.
void safetensors_write_dir(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                           uint64_t max_shard_bytes);

// "[4096, 128]"
std::string safetensors_format_shape(const std::vector<int64_t>& shape);

}  // namespace strata
