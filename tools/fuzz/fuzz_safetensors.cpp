// Seeded mutation fuzzer for SafetensorsFile::open: mutates valid files (bit flips, truncation,
// header-length edits, digit edits, token splices, chunk copies), writes each mutant to a temp
// dir, opens it and reads every tensor's bytes. Every mutant must open or throw strata::Error.
// Links against io/safetensors.cpp, src/core/error.cpp and src/core/dtype.cpp only; build with
//   g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -I. (one line)
//       tools/fuzz/fuzz_safetensors.cpp io/safetensors.cpp src/core/error.cpp src/core/dtype.cpp -o fuzz_safetensors
// Usage: fuzz_safetensors SEED ITERATIONS [SECONDS] [-v]   (stops at whichever limit comes first;
//        -v prints how often each kind of error was raised)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/files.h"
#include "io/safetensors.h"
#include "src/core/error.h"
#include "tools/fuzz/safetensors_mutator.h"

namespace fs = std::filesystem;
using namespace strata;
using namespace strata::safetensors_mutator;

namespace {

bool write_all(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(s.data(), std::streamsize(s.size()));
  return f.good();
}

// Builds a few valid seed files with different shapes of header.
std::vector<std::string> make_seeds(const fs::path& dir) {
  std::vector<std::string> seeds;
  std::vector<float> f(33);
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(i) * 0.25f - 3.f;
  std::vector<int64_t> ids = {1, -2, 3};
  std::vector<float> none;
  auto add = [&](const std::vector<TensorToWrite>& ts, const std::map<std::string, std::string>& meta) {
    std::string p = (dir / "seed.safetensors").string();
    safetensors_write_file(p, ts, meta);
    seeds.push_back(file_read(p));
  };
  add({{"w", DType::f32, {3, 11}, f.data()}}, {});
  add({{"model.layers.0.self_attn.q_proj.weight", DType::bf16, {4, 4}, f.data()},
       {"b", DType::f16, {1}, f.data()},
       {"e", DType::f32, {0, 5}, none.data()},
       {"ids", DType::i64, {3}, ids.data()},
       {"s", DType::i32, {}, ids.data()}},
      {{"note", "seed"}, {"step", "7"}});
  add({}, {{"empty", ""}});
  return seeds;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SEED ITERATIONS [SECONDS]\n", argv[0]);
    return 2;
  }
  const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const long long iters = std::strtoll(argv[2], nullptr, 10);
  const double seconds = argc > 3 ? std::atof(argv[3]) : 1e18;
  const bool verbose = argc > 4 && std::strcmp(argv[4], "-v") == 0;
  std::map<std::string, long long> kinds;  // error message with names and numbers blanked
  fs::path dir = fs::temp_directory_path() / ("strata_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::vector<std::string> seeds = make_seeds(dir);
  const std::string path = (dir / "mutant.safetensors").string();
  std::mt19937_64 rng(seed);
  long long opened = 0, rejected = 0, done = 0;
  uint64_t checksum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (; done < iters; ++done) {
    if ((done & 255) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds)
      break;
    const std::string m = mutate(seeds[rng() % seeds.size()], rng);
    ::unlink(path.c_str());  // a fresh file: ext4 flushes a truncated-and-rewritten file on close (slow)
    if (!write_all(path, m)) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      for (const auto& e : f.entries()) {
        const auto* q = static_cast<const unsigned char*>(f.data(e));
        for (uint64_t i = 0; i < e.bytes(); ++i) checksum += q[i];
        if (f.find(e.name) != &e) {
          std::fprintf(stderr, "find() disagrees with entries() for '%s'\n", e.name.c_str());
          write_all((dir / "failing.safetensors").string(), m);
          return 1;
        }
      }
      ++opened;
    } catch (const Error& e) {
      if (std::strstr(e.what(), path.c_str()) == nullptr) {
        std::fprintf(stderr, "error message lacks the path: %s\n", e.what());
        write_all((dir / "failing.safetensors").string(), m);
        return 1;
      }
      ++rejected;
      if (verbose) {
        std::string k = e.what() + path.size();
        std::string out;
        bool quoted = false;
        for (char ch : k) {
          if (ch == '\'') { quoted = !quoted; out += ch; continue; }
          if (quoted || (ch >= '0' && ch <= '9')) { if (out.empty() || out.back() != '#') out += '#'; continue; }
          out += ch;
          if (out.size() > 70) break;
        }
        ++kinds[out];
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("seed %llu: %lld mutants in %.1f s, %lld opened, %lld rejected (checksum %llu)\n",
              (unsigned long long)seed, done, secs, opened, rejected, (unsigned long long)checksum);
  for (const auto& [k, n] : kinds) std::printf("%8lld %s\n", n, k.c_str());
  fs::remove_all(dir);
  return 0;
}
