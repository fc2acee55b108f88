#include "src/train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "io/files.h"
#include "io/safetensors.h"
#include "src/core/error.h"
#include "src/core/tensor.h"

namespace strata {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".strata.lock";

bool is_run_entry(const std::string& name) {
  return name == "metrics.jsonl" || name == "final" || name.rfind("checkpoint-", 0) == 0 ||
         name.rfind(".checkpoint-", 0) == 0 || name == ".final.tmp" || name == ".final.old" ||
         name == ".final.step";
}

}  // namespace

RunLock::RunLock(const std::string& output_dir) {
  const std::string path = (fs::path(output_dir) / kLockFile).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  STRATA_CHECK_IO(fd_ >= 0, "cannot open the lock file ", path, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    STRATA_CHECK_IO(err == EWOULDBLOCK, "cannot lock ", path, ": ", std::strerror(err));
    const std::string pid = n > 0 ? std::string(buf, size_t(n)) : std::string("unknown");
    STRATA_CHECK(false, "checkpoint.output_dir ", output_dir, " is in use by another strata process (pid ",
                 pid.substr(0, pid.find_first_of("\n ")), "); wait for it to finish, stop it, or choose another "
                 "output_dir");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
    // the lock holds without the pid; a second process then says "pid unknown"
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // drops the flock
}

void run_dir_create(const std::string& output_dir) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  STRATA_CHECK_IO(!ec, "cannot create checkpoint.output_dir ", output_dir, ": ", ec.message());
  STRATA_CHECK_IO(::access(output_dir.c_str(), W_OK) == 0, "checkpoint.output_dir ", output_dir,
                  " is not writable: choose another output_dir or fix its permissions");
}

namespace {

// a and b as absolute, symlink-free paths where they exist (an input given through a symlink
// into the run dir is still inside it)
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

// true when `inner` is `outer` or lies inside it
bool path_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

void run_dir_prepare(const std::string& output_dir, bool resuming, bool overwrite, const std::vector<RunInput>& inputs) {
  run_dir_create(output_dir);
  if (resuming) return;
  std::error_code ec;
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(output_dir, ec))
    if (is_run_entry(e.path().filename().string())) found.push_back(e.path().filename().string());
  std::sort(found.begin(), found.end());
  if (found.empty()) return;
  if (!overwrite) {
    std::vector<std::string> shown;  // what a user sees with ls: the hidden entries go unnamed
    for (const std::string& n : found)
      if (n[0] != '.') shown.push_back(n);
    if (shown.empty()) shown = found;
    std::string list;
    for (size_t i = 0; i < shown.size() && i < 6; ++i) list += (i ? ", " : "") + shown[i];
    if (shown.size() > 6) list += ", ...";
    STRATA_CHECK(false, "checkpoint.output_dir ", output_dir, " already holds a run (", list,
                 "); continue it with --resume auto, start over with --overwrite (which deletes its "
                 "checkpoints, metrics and final model), or choose another output_dir");
  }
  // Everything is checked before anything is removed: a refused --overwrite deletes nothing.
  for (const std::string& name : found) {
    const fs::path entry = resolved(fs::path(output_dir) / name);
    for (const RunInput& in : inputs) {
      if (in.path.empty()) continue;
      const fs::path p = resolved(in.path);
      STRATA_CHECK(!path_within(p, entry) && !path_within(entry, p), "--overwrite would delete ",
                   (fs::path(output_dir) / name).string(), ", but this run reads ", in.key, " = ", in.path,
                   path_within(p, entry) ? " (that directory, or inside it)" : " (which holds it)",
                   "; nothing was deleted. Move the input out of checkpoint.output_dir (or copy it: cp -r ",
                   in.path, " elsewhere), or choose another checkpoint.output_dir");
    }
  }
  for (const std::string& name : found) {
    fs::remove_all(fs::path(output_dir) / name, ec);
    STRATA_CHECK_IO(!ec, "--overwrite: cannot remove ", (fs::path(output_dir) / name).string(), ": ", ec.message());
  }
}

void run_dir_truncate_metrics(const std::string& output_dir, int64_t last_step) {
  run_dir_truncate_steps(output_dir + "/metrics.jsonl", last_step);
}

void run_dir_truncate_steps(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.contains("step") && j["step"].get<int64_t>() <= last_step) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      // a torn last line of an interrupted run: dropped
    }
  }
  file_write_atomic(path, kept.data(), kept.size());
}

namespace {

// "section.key = value" lines of an effective recipe.
std::map<std::string, std::string> recipe_lines(const std::string& toml) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.size() > 2 && line.front() == '[') section = line.substr(1, line.find(']') - 1);
    size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

bool may_change_on_resume(const std::string& k) {
  return k.rfind("checkpoint.", 0) == 0 || k.rfind("device.", 0) == 0 || k.rfind("offload.", 0) == 0 ||
         k == "train.max_steps" || k == "train.log_steps" || k == "train.eval_steps";
}

}  // namespace

void run_dir_warn_recipe_changes(const std::string& saved_toml, const std::string& now_toml, bool batch_split_exempt) {
  auto was = recipe_lines(saved_toml), now = recipe_lines(now_toml);
  for (auto& [k, v] : now) {
    if (may_change_on_resume(k)) continue;
    if (batch_split_exempt && (k == "train.micro_batch_size" || k == "train.gradient_accumulation_steps")) continue;
    auto it = was.find(k);
    if (it != was.end() && it->second != v)
      std::fprintf(stderr, "strata train: warning: %s is %s now but was %s in the checkpoint; the resumed run "
                   "is not the run it continues\n", k.c_str(), v.c_str(), it->second.c_str());
  }
}

std::string run_dir_space_warning(const std::string& output_dir, size_t need_bytes, size_t available_bytes) {
  if (available_bytes >= need_bytes) return "";
  return str_cat("checkpoint.output_dir ", output_dir, " has ", format_bytes(available_bytes), " free, but one ",
                 "checkpoint takes about ", format_bytes(need_bytes), " (", format_bytes(need_bytes - available_bytes),
                 " short): the first save will fail with a full disk (earlier checkpoints stay intact); free space "
                 "there, or choose a checkpoint.output_dir on a larger disk");
}

namespace {
constexpr const char* kFinalStepFile = ".final.step";
}  // namespace

int64_t run_dir_final_step(const std::string& output_dir) {
  std::ifstream in(output_dir + "/" + kFinalStepFile);
  int64_t step = -1;
  if (!(in >> step)) return -1;
  std::error_code ec;
  return fs::is_directory(fs::path(output_dir) / "final", ec) ? step : -1;
}

void run_dir_mark_final(const std::string& output_dir, int64_t step) {
  const std::string s = std::to_string(step) + "\n";
  file_write_atomic(output_dir + "/" + kFinalStepFile, s.data(), s.size());
}

namespace {

std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                       "0123456789_-./=:,+@%") == std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::string run_dir_resume_command(const std::string& recipe_path, const std::vector<std::string>& overrides) {
  std::string cmd = "strata train ";  // appends, not "x" + string: GCC 12 warns falsely (-Wrestrict)
  cmd += shell_quote(recipe_path);
  for (const std::string& o : overrides) {
    cmd += ' ';
    cmd += shell_quote(o);
  }
  cmd += " --resume auto";
  return cmd;
}

}  // namespace strata
