// A run's output directory (checkpoint.output_dir): one process at a time, no silent mixing of
// two runs, and metrics.jsonl that reads as one run after a resume.
//
//   .strata.lock   held (flock) by the process writing the dir; holds its pid. The kernel drops
//                  the lock when the process ends, however it ends, so a stale file is harmless.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// Holds output_dir's lock for its lifetime. A second holder (another process, or another run
// in this one) gets Error (exit 2) naming the holder's pid.
class RunLock {
 public:
  explicit RunLock(const std::string& output_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// Creates output_dir (exit 4 when it cannot be created or written). A fresh run (not resuming)
// into a dir that already holds a run's checkpoints or metrics is refused (exit 2, naming
// --resume auto and --overwrite) unless `overwrite`, which removes them first.
void run_dir_prepare(const std::string& output_dir, bool resuming, bool overwrite);

// Keeps the records of steps <= last_step in metrics.jsonl (a resumed run rewrites what came after).
void run_dir_truncate_metrics(const std::string& output_dir, int64_t last_step);

// Warnings for recipe keys that changed between a checkpoint's effective recipe and this run's
// (keys that may change on resume — output, device, offload, lengths of the run — excepted).
void run_dir_warn_recipe_changes(const std::string& saved_toml, const std::string& now_toml);

// `strata train RECIPE [overrides] --resume auto`, each argument quoted for a POSIX shell when it
// needs it: what to paste to continue the run.
std::string run_dir_resume_command(const std::string& recipe_path, const std::vector<std::string>& overrides);

}  // namespace strata
