#include "offload/state/nvme_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "src/core/error.h"
#include "src/core/tensor.h"

namespace strata {
namespace fs = std::filesystem;

namespace {

std::mutex registry_mu;
std::map<std::string, std::weak_ptr<NvmeRunDir>>& registry() {
  static std::map<std::string, std::weak_ptr<NvmeRunDir>> r;
  return r;
}

// strata-<pid>-<n>: the pid of a run that no longer exists marks a folder left behind.
void remove_abandoned(const std::string& nvme_path) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(nvme_path, ec)) {
    const std::string name = e.path().filename().string();
    long pid = 0;
    int n = 0;
    if (std::sscanf(name.c_str(), "strata-%ld-%d", &pid, &n) != 2 || pid <= 0 || pid == long(::getpid())) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code ec2;
    fs::remove_all(e.path(), ec2);
    if (!ec2) std::fprintf(stderr, "strata: removed %s, left behind by an earlier run\n", e.path().c_str());
  }
}

}  // namespace

void nvme_path_check(const std::string& path) {
  std::error_code ec;
  STRATA_CHECK(fs::exists(path, ec), "offload.nvme_path ", path, " does not exist: create the directory (on a "
               "fast local disk) or point offload.nvme_path at one");
  STRATA_CHECK(fs::is_directory(path, ec), "offload.nvme_path ", path, " is not a directory: point it at a "
               "directory on a fast local disk");
  const std::string probe = path + "/.strata-probe-" + std::to_string(::getpid());
  const int rc = ::mkdir(probe.c_str(), 0700);
  const int err = errno;
  if (rc == 0) ::rmdir(probe.c_str());
  STRATA_CHECK(rc == 0 || err == EEXIST, "offload.nvme_path ", path, " is not writable (", std::strerror(err),
               "): strata creates its files in a subfolder there; give a writable directory");
}

size_t nvme_free_bytes(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) return 0;
  return size_t(st.f_bavail) * size_t(st.f_frsize);
}

size_t nvme_budget_bytes(size_t configured, const std::string& path) {
  return configured > 0 ? configured : nvme_free_bytes(path) / 10 * 9;
}

void nvme_file_reserve(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  STRATA_CHECK_IO(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  const int err = ::posix_fallocate(fd, 0, off_t(bytes));
  ::close(fd);
  STRATA_CHECK_IO(err == 0 || err == EOPNOTSUPP || err == EINVAL, "cannot reserve ", bytes, " bytes for ", path,
                  ": ", std::strerror(err), " (offset 0, length ", bytes,
                  "); free space under offload.nvme_path or point it at a larger disk");
}

std::shared_ptr<NvmeRunDir> NvmeRunDir::acquire(const std::string& nvme_path) {
  std::lock_guard<std::mutex> lock(registry_mu);
  const std::string key = fs::absolute(nvme_path).lexically_normal().string();
  if (auto live = registry()[key].lock()) return live;
  nvme_path_check(nvme_path);
  remove_abandoned(nvme_path);
  static std::atomic<int> counter{0};
  std::string path;
  for (;;) {
    path = str_cat(key, "/strata-", ::getpid(), "-", counter++);
    if (::mkdir(path.c_str(), 0700) == 0) break;
    STRATA_CHECK(errno == EEXIST, "cannot create ", path, " under offload.nvme_path (", std::strerror(errno),
                 "): give a writable directory");
  }
  std::shared_ptr<NvmeRunDir> dir(new NvmeRunDir(key, path));
  registry()[key] = dir;
  return dir;
}

NvmeRunDir::~NvmeRunDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (ec) std::fprintf(stderr, "strata: warning: cannot remove %s: %s\n", path_.c_str(), ec.message().c_str());
}

void NvmeRunDir::reserve(size_t bytes, size_t budget, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_CHECK_BUDGET(budget == 0 || reserved_ + bytes <= budget, "the NVMe budget of ", format_bytes(budget),
                      " under ", nvme_path_, " is too small: ", what, " needs ", format_bytes(bytes),
                      reserved_ ? str_cat(" beside ", format_bytes(reserved_), " already placed there") : std::string(),
                      "; free space there, raise offload.nvme_memory, or keep that state in RAM");
  reserved_ += bytes;
}

}  // namespace strata
