// Shared test helpers: seeded inputs, error measures, central finite differences, paths,
// temporary directories, and running the strata binary as users and batch jobs do.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <utility>
#include <sstream>
#include <random>
#include <string>
#include <vector>

#include "src/core/bf16.h"

namespace strata::testing {

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

template <class T, class U>
std::vector<T> convert(const std::vector<U>& v) {
  return std::vector<T>(v.begin(), v.end());
}

inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}
inline std::vector<float> round_bf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(f32_to_bf16(v[i]));
  return out;
}

// ||a - b||_inf / max(||b||_inf, floor): the per-tensor relative error used across the suite.
template <class A, class B>
double max_rel_error(const A& a, const B& b, double floor = 1e-30) {
  double num = 0, den = floor;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}

// Central finite difference of a scalar function f(x) in fp64: returns df/dx for every x.
inline std::vector<double> finite_difference(std::vector<double> x,
                                             const std::function<double(const std::vector<double>&)>& f,
                                             double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + h;
    double fp = f(x);
    x[i] = keep - h;
    double fm = f(x);
    x[i] = keep;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// Runs a CLI subcommand in-process with `input` as standard input; returns standard output
// and the exit code through *rc. The streams are restored even when the command throws.
inline std::string run_cli(int (*cmd)(const std::vector<std::string>&),
                           const std::vector<std::string>& args, const std::string& input, int* rc) {
  std::istringstream in(input);
  std::ostringstream out;
  auto* old_in = std::cin.rdbuf(in.rdbuf());
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  try {
    *rc = cmd(args);
  } catch (...) {
    std::cin.rdbuf(old_in);
    std::cout.rdbuf(old_out);
    throw;
  }
  std::cin.rdbuf(old_in);
  std::cout.rdbuf(old_out);
  return out.str();
}

inline std::string source_path(const std::string& rel) { return std::string(STRATA_SOURCE_DIR) + "/" + rel; }

// A fresh directory under the build tree, removed when the test ends.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::path(STRATA_BINARY_DIR) / "test_tmp" / name) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return (path / name).string();
  }
};

// The strata binary under test: $STRATA_BIN, else the build tree's.
inline std::string strata_binary() {
  const char* bin = std::getenv("STRATA_BIN");
  return bin ? bin : std::string(STRATA_BINARY_DIR) + "/strata";
}

struct ProcessResult {
  int code = -1;    // exit status; -1 when killed by a signal
  std::string out;  // standard output and standard error together (stdout alone when asked)
};

// Runs a shell command line and waits for it.
inline ProcessResult run_shell(const std::string& command, bool stdout_only = false) {
  ProcessResult r;
  FILE* p = popen((command + (stdout_only ? " 2>/dev/null" : " 2>&1")).c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `strata ARGS` (ARGS as a shell would split them).
inline ProcessResult run_strata(const std::string& args, bool stdout_only = false) {
  return run_shell(strata_binary() + " " + args, stdout_only);
}

// `strata ARGS`, sending signal triggers[i].second as soon as its output contains
// triggers[i].first, one trigger after the other. *fired counts the signals sent.
inline ProcessResult run_strata_signalled(const std::string& args,
                                          const std::vector<std::pair<std::string, int>>& triggers,
                                          size_t* fired) {
  ProcessResult r;
  *fired = 0;
  int fd[2];
  if (pipe(fd) != 0) return r;
  pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    dup2(fd[1], 1);
    dup2(fd[1], 2);
    close(fd[0]);
    const std::string cmd = "exec " + strata_binary() + " " + args;
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fd[1]);
  char buf[512];
  ssize_t n;
  while ((n = read(fd[0], buf, sizeof buf)) > 0) {
    r.out.append(buf, size_t(n));
    if (*fired < triggers.size() && r.out.find(triggers[*fired].first) != std::string::npos) {
      kill(pid, triggers[*fired].second);  // one at a time: two pending signals of a kind merge
      ++*fired;
    }
  }
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace strata::testing
