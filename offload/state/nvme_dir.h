// The NVMe directory of a run (offload.nvme_path, DESIGN §8a): checked before any work, one
// run-specific subfolder that strata creates and removes, and the space budget
// (offload.nvme_memory) that everything placed there is counted against.
//
//   nvme_path_check(path)                   // exit 2: missing, not a directory, not writable
//   auto dir = NvmeRunDir::acquire(path);   // <path>/strata-<pid>-<n>/, shared by every user
//   dir->reserve(bytes, budget, "AdamW state");  // exit 3 when the budget is exceeded
//   ... files under dir->path() ...
//   // the last owner's destructor removes the subfolder with everything in it
//
// A run killed before it could clean up leaves its subfolder behind; the next run on the same
// path removes subfolders whose process no longer exists.
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

namespace strata {

// Throws Error(input) naming offload.nvme_path unless `path` is an existing directory in which
// strata can create a folder.
void nvme_path_check(const std::string& path);
// Free bytes for an unprivileged writer on the filesystem holding `path` (0 when unknown).
size_t nvme_free_bytes(const std::string& path);
// The budget: `configured` when set (> 0), else the free space minus 10%.
size_t nvme_budget_bytes(size_t configured, const std::string& path);

// Reserves the blocks of the file at `path` (already created) up to `bytes`, so that a disk
// without room fails now, naming the file (Error(io)); a filesystem without fallocate (some
// network ones) is left to fail on first write instead.
void nvme_file_reserve(const std::string& path, size_t bytes);

class NvmeRunDir {
 public:
  // The run folder under nvme_path, created on first use; later calls while it lives share it.
  static std::shared_ptr<NvmeRunDir> acquire(const std::string& nvme_path);
  ~NvmeRunDir();
  NvmeRunDir(const NvmeRunDir&) = delete;
  NvmeRunDir& operator=(const NvmeRunDir&) = delete;

  const std::string& path() const { return path_; }
  const std::string& nvme_path() const { return nvme_path_; }
  // Counts `bytes` for `what` against `budget`; Error(budget) naming offload.nvme_memory when
  // the run's files would exceed it.
  void reserve(size_t bytes, size_t budget, const std::string& what);

 private:
  NvmeRunDir(std::string nvme_path, std::string path) : nvme_path_(std::move(nvme_path)), path_(std::move(path)) {}
  std::string nvme_path_, path_;
  std::mutex mu_;
  size_t reserved_ = 0;
};

}  // namespace strata
