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

// Creates output_dir (exit 4 when it cannot be created or written). Called before RunLock,
// which lives in it; touches nothing else there.
void run_dir_create(const std::string& output_dir);

// A path the run reads (model.path, data.path, the checkpoint it resumes from, ...), named by the
// recipe key or option that gives it, so --overwrite can refuse to delete it.
struct RunInput {
  std::string key;   // "model.path", "--resume", ...
  std::string path;
};

// Called with output_dir's lock held (RunLock), so no live run's files are touched. A fresh run
// (not resuming) into a dir that already holds a run's checkpoints or metrics is refused (exit 2,
// naming --resume auto and --overwrite) unless `overwrite`, which removes them first — unless one
// of them is, holds or lies inside one of `inputs`: then nothing is removed and the run is refused
// (exit 2) naming the input.
void run_dir_prepare(const std::string& output_dir, bool resuming, bool overwrite,
                     const std::vector<RunInput>& inputs = {});

// Keeps the records of steps <= last_step in metrics.jsonl (a resumed run rewrites what came after).
void run_dir_truncate_metrics(const std::string& output_dir, int64_t last_step);
// The same for any JSON-lines file of {"step", ...} records (GRPO's completions.jsonl); a torn
// last line is dropped, a missing file left alone.
void run_dir_truncate_steps(const std::string& path, int64_t last_step);

// Warnings for recipe keys that changed between a checkpoint's effective recipe and this run's
// (keys that may change on resume — output, device, offload, lengths of the run — excepted).
// batch_split_exempt: train.micro_batch_size and train.gradient_accumulation_steps are excepted
// too (the caller compares the global batch, which is what decides whether the run continues).
void run_dir_warn_recipe_changes(const std::string& saved_toml, const std::string& now_toml,
                                 bool batch_split_exempt = false);

// The warning `strata train` prints before step 1 when one checkpoint (`need_bytes`) would not
// fit in the `available_bytes` free at output_dir; "" when it fits.
std::string run_dir_space_warning(const std::string& output_dir, size_t need_bytes, size_t available_bytes);

// The step whose model final/ holds (written after each complete export), or -1 when the export
// never finished (or is from before the record was kept).
int64_t run_dir_final_step(const std::string& output_dir);
void run_dir_mark_final(const std::string& output_dir, int64_t step);

// `strata train RECIPE [overrides] --resume auto`, each argument quoted for a POSIX shell when it
// needs it: what to paste to continue the run.
std::string run_dir_resume_command(const std::string& recipe_path, const std::vector<std::string>& overrides);

}  // namespace strata
