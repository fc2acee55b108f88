// Shared test helpers: seeded inputs, error measures, central finite differences, paths,
// temporary directories, running the strata binary as users and batch jobs do, and the
// golden-test harness (one engine step on a tests/golden model, compared tensor by tensor).
#pragma once
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <iostream>
#include <utility>
#include <sstream>
#include <random>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "io/files.h"
#include "src/core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "src/core/bf16.h"
#include "models/micro_batch.h"
#include "offload/engine/engine.h"
#include "offload/state/model_io.h"
#include "src/device/device.h"

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
// How many elements of a and b differ in their bits (a length difference counts as that many).
inline size_t bf16_mismatches(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t bad = std::max(a.size(), b.size()) - n;
  for (size_t i = 0; i < n; ++i) bad += a[i].bits != b[i].bits;
  return bad;
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

template <class A, class B>
double max_rel_error(const A* a, const B* b, size_t n, double floor = 1e-30) {
  double num = 0, den = floor;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}

// The worst relative error of a sweep of cases: each must be within tol as it comes (a REQUIRE,
// so the caller's INFO names the case), and check() reports the worst.
struct WorstError {
  const char* what;
  double tol;
  double worst = 0;
  void add(double e) {
    REQUIRE(e <= tol);
    worst = std::max(worst, e);
  }
  void check() const {
    INFO("worst rel err: " << what << " " << worst);
    CHECK(worst <= tol);
  }
};

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

// All of a file the test expects to exist (an I/O error naming the path when it cannot be read).
inline std::string read_file(const std::string& path) { return file_read(path, "test file"); }

// The records of OUT/metrics.jsonl, in order; with `key`, only those holding it.
inline std::vector<nlohmann::json> metrics_records(const std::string& out, const std::string& key = "") {
  std::ifstream in(out + "/metrics.jsonl");
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (key.empty() || j.contains(key)) rows.push_back(std::move(j));
  }
  return rows;
}

// Replaces the contents of `path` with `bytes`.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// How many times `what` occurs in `text`, overlapping occurrences counted.
inline size_t count_occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The message of the strata::Error that fn() throws (a test failure when it throws none), its
// kind checked unless `kind` is empty.
template <class Fn>
std::string error_of(Fn&& fn, std::optional<ErrorKind> kind = ErrorKind::input) {
  try {
    fn();
  } catch (const Error& e) {
    if (kind) CHECK(e.kind() == *kind);
    return e.what();
  }
  FAIL("expected a strata::Error");
  return "";
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

// Every tensor of two HF model dirs (or checkpoints), bit for bit.
inline void require_same_tensors(const std::string& a, const std::string& b) {
  SafetensorsDir x = SafetensorsDir::open(a), y = SafetensorsDir::open(b);
  REQUIRE(x.names() == y.names());
  for (const auto& name : x.names()) {
    std::vector<float> vx(size_t(x.find(name)->numel())), vy(vx.size());
    x.read(name, DType::f32, vx.data());
    y.read(name, DType::f32, vy.data());
    INFO(name);
    REQUIRE(vx == vy);
  }
}

inline std::string source_path(const std::string& rel) { return std::string(STRATA_SOURCE_DIR) + "/" + rel; }

// A real tokenizer directory (tokenizer.json + tokenizer_config.json): "bpe-qwen3" or "sp-bpe-32k",
// kept in tests/fixtures/tokenizers/tokenizers.tar.xz and unpacked into the build tree by CMake.
inline std::string tokenizer_fixture(const std::string& name) {
  return std::string(STRATA_BINARY_DIR) + "/fixtures/tokenizers/" + name;
}

// While alive, this process may write files of at most `bytes` (RLIMIT_FSIZE, SIGXFSZ ignored):
// write() then fails part way with EFBIG, the way a full disk fails it with ENOSPC.
struct FileSizeLimit {
  struct rlimit old {};
  void (*old_handler)(int) = nullptr;
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old);
    old_handler = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
  }
};

// <system temp>/<group>_<pid>: one root per process, so test processes running at once (ctest -j,
// another checkout's tests on the same machine) never share it; removed when the process exits.
inline std::filesystem::path process_root(const std::string& group) {
  struct Roots {
    std::set<std::filesystem::path> paths;
    ~Roots() {
      std::error_code ec;
      for (const auto& p : paths) std::filesystem::remove_all(p, ec);
    }
  };
  static Roots roots;
  const std::filesystem::path root = std::filesystem::temp_directory_path() / (group + "_" + std::to_string(::getpid()));
  roots.paths.insert(root);
  return root;
}

// A fresh path (removed, not created) for a test's run directory: process_root(group) / name.
inline std::string fresh_path(const std::string& group, const std::string& name) {
  const std::filesystem::path root = process_root(group);
  std::filesystem::remove_all(root / name);
  return (root / name).string();
}

// process_root(group), created (its contents kept while the process runs).
inline std::string process_dir(const std::string& group) {
  const std::filesystem::path root = process_root(group);
  std::filesystem::create_directories(root);
  return root.string();
}

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

// Checks that a run exited with `code` and that its output says each of `says` and none of `never`.
inline void check_run(const ProcessResult& r, int code, const std::vector<std::string>& says,
                      const std::vector<std::string>& never = {}) {
  INFO(r.out);
  CHECK(r.code == code);
  for (const std::string& s : says) CHECK(contains(r.out, s));
  for (const std::string& s : never) CHECK_FALSE(contains(r.out, s));
}

// `strata ARGS` (ARGS as a shell would split them).
inline ProcessResult run_strata(const std::string& args, bool stdout_only = false) {
  return run_shell(strata_binary() + " " + args, stdout_only);
}

// `strata estimate ARGS --json` (standard output only): its one JSON object, the exit code
// required to be `want_code` (0 fits, 3 does not).
inline nlohmann::json estimate_json(const std::string& args, int want_code = 0) {
  const ProcessResult r = run_strata("estimate " + args + " --json", true);
  INFO(args << "\n" << r.out);
  REQUIRE(r.code == want_code);
  return nlohmann::json::parse(r.out);
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

// A small Llama (4 heads, 2 kv heads unless given) as hf_config reads it, for the engine, plan and
// host-store tests.
struct TinyLlama {
  int64_t hidden, ffn, layers, vocab, max_positions;
  bool tied;
  int64_t heads = 4, kv_heads = 2;
};
inline ModelConfig tiny_llama_config(const TinyLlama& t) {
  const nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                            {"hidden_size", t.hidden}, {"intermediate_size", t.ffn},
                            {"num_hidden_layers", t.layers}, {"num_attention_heads", t.heads},
                            {"num_key_value_heads", t.kv_heads}, {"vocab_size", t.vocab},
                            {"max_position_embeddings", t.max_positions}, {"tie_word_embeddings", t.tied}};
  return hf_config_parse(j.dump(), "test config");
}

// ---- the golden-test harness ------------------------------------------------------------------
// tests/golden/NAME holds a tiny model (config.json, safetensors), batch.json ({"input_ids",
// optional "labels"}), expected.json ({"loss", "tokens"}: the fp64 torch reference of
// tools/golden/make_model_goldens.py) and grads.safetensors (d loss / d parameter, F32, HF names).
struct Golden {
  std::string dir;
  MicroBatch batch;
  double loss = 0;     // mean loss per counted token
  int64_t tokens = 0;  // counted tokens

  static Golden load(const std::string& name) {
    Golden g;
    g.dir = source_path("tests/golden/" + name);
    const auto rows_of = [](const nlohmann::json& j) {
      std::vector<std::vector<int32_t>> rows;
      for (auto& r : j) rows.push_back(r.get<std::vector<int32_t>>());
      return rows;
    };
    std::ifstream batch_in(g.dir + "/batch.json"), expected_in(g.dir + "/expected.json");
    if (!batch_in || !expected_in) throw std::runtime_error("golden " + name + ": batch.json or expected.json missing in " + g.dir);
    const nlohmann::json batch = nlohmann::json::parse(batch_in), expected = nlohmann::json::parse(expected_in);
    g.batch = micro_batch_from_labels(rows_of(batch["input_ids"]),
                                      batch.contains("labels") ? rows_of(batch["labels"]) : std::vector<std::vector<int32_t>>{});
    g.loss = expected["loss"].get<double>();
    g.tokens = expected["tokens"].get<int64_t>();
    return g;
  }

  // The reference gradients laid out like `table` (a host store's f32 table), `floats` long.
  std::vector<float> grads(const TensorTable& table, size_t floats) const {
    SafetensorsFile file = SafetensorsFile::open(dir + "/grads.safetensors");
    if (file.entries().size() != table.size())
      throw std::runtime_error(dir + "/grads.safetensors: " + std::to_string(file.entries().size()) +
                               " tensors, the model has " + std::to_string(table.size()));
    std::vector<float> out(floats, 0.f);
    for (const auto& row : table.rows()) {
      const SafetensorsEntry* e = file.find(row.name);
      if (!e || e->shape != row.shape) throw std::runtime_error(dir + "/grads.safetensors: no " + row.name + " of its shape");
      const float* w = static_cast<const float*>(file.data(*e));
      std::copy(w, w + row.numel(), out.begin() + std::ptrdiff_t(row.offset / 4));
    }
    return out;
  }
};

// What one engine step on a golden model gave.
// f(name, golden) for each of the four golden models in turn, under INFO(name).
template <class F>
void for_each_golden(F&& f) {
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3"}) {
    INFO(name);
    f(name, Golden::load(name));
  }
}

struct GoldenStep {
  double loss = 0;             // mean per counted token
  int64_t tokens = 0;          // counted tokens
  std::vector<float> grads;    // the store's f32 table layout
  TensorTable table;
  size_t pageable_bytes = 0;   // the device's pageable fallback after the step
};

// Loads the golden model into a host store of `dtype` on `dev` and runs one forward_backward
// (scale 1 / counted tokens) through an engine built with `eo` (its batch capacity is set here).
inline GoldenStep golden_step(Device& dev, const Golden& g, DType dtype, EngineOptions eo) {
  HostStore store(dev, model_spec_build(hf_config_load(g.dir), dtype));
  model_load_weights(store, g.dir);
  eo.max_batch = g.batch.B;
  eo.max_tokens = g.batch.T;
  Engine engine(dev, store, eo);
  GoldenStep r;
  r.tokens = g.batch.counted();
  r.loss = engine.forward_backward(g.batch, float(1.0 / double(r.tokens))) / double(r.tokens);
  engine.synchronize();
  r.grads.assign(store.grad(), store.grad() + store.f32_floats());
  r.table = store.f32_table();
  r.pageable_bytes = dev.pageable_fallback_bytes();
  return r;
}

// Per tensor of `table`: max |got - want| / max |want| over the tensor (max_rel_error), in table order.
struct TensorError {
  std::string name;
  double error = 0;
  bool identical = false;  // the same bits
};
inline std::vector<TensorError> tensor_errors(const TensorTable& table, const std::vector<float>& got,
                                              const std::vector<float>& want) {
  std::vector<TensorError> out;
  for (const auto& row : table.rows()) {
    const float* a = got.data() + row.offset / 4;
    const float* b = want.data() + row.offset / 4;
    const size_t n = size_t(row.numel());
    out.push_back({row.name, max_rel_error(a, b, n), std::memcmp(a, b, n * 4) == 0});
  }
  return out;
}
inline TensorError worst_tensor_error(const std::vector<TensorError>& errors) {
  TensorError worst;
  for (const auto& e : errors)
    if (e.error >= worst.error) worst = e;
  return worst;
}

}  // namespace strata::testing
