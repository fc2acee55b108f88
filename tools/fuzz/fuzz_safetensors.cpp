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

#include "io/safetensors.h"
#include "src/core/error.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool write_all(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(s.data(), std::streamsize(s.size()));
  return f.good();
}

uint64_t get_len(const std::string& s) {
  uint64_t v = 0;
  for (int i = 7; i >= 0 && s.size() >= 8; --i) v = (v << 8) | uint8_t(s[i]);
  return v;
}

void set_len(std::string& s, uint64_t v) {
  if (s.size() < 8) return;
  for (int i = 0; i < 8; ++i) s[i] = char(v >> (8 * i));
}

const char* kTokens[] = {"{", "}", "[", "]", ",", ":", "\"", "-1", "0", "1e30", "-0", "1.5", "2.0",
                         "18446744073709551615", "18446744073709551616", "9223372036854775807",
                         "9223372036854775808", "4294967296", "null", "true", "false", "\"F64\"",
                         "\"BF16\"", "\"F16\"", "\"I32\"", "\"I64\"", "\"F32\"", "\"\"", "\"__metadata__\"",
                         "\"data_offsets\"", "\"shape\"", "\"dtype\"", "[0,0]", "[0,18446744073709551615]",
                         "[]", "{}", "\\u0000", "\"\\ud800\"", "\xff", "\xc3\xa9", "[[[[", "]]]]", "{\"a\":"};

// Header-aware edit: re-serialises the header with one entry changed in a way that keeps the JSON
// valid and often keeps the sizes consistent, to reach the overlap / range / size checks.
bool mutate_header(std::string& s, std::mt19937_64& rng) {
  const uint64_t hlen = get_len(s);
  if (s.size() < 8 || hlen > s.size() - 8) return false;
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(s.substr(8, hlen));
  } catch (...) {
    return false;
  }
  if (!h.is_object() || h.empty()) return false;
  std::vector<std::string> names;
  for (auto it = h.begin(); it != h.end(); ++it) names.push_back(it.key());
  auto& e = h[names[rng() % names.size()]];
  const uint64_t data_bytes = s.size() - 8 - hlen;
  auto u = [&](uint64_t n) { return n ? rng() % n : 0; };
  const uint64_t big[] = {~uint64_t(0), ~uint64_t(0) - 7, uint64_t(1) << 63, (uint64_t(1) << 63) - 1, uint64_t(1) << 32};
  if (e.is_object() && e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2 &&
      e["data_offsets"][0].is_number_unsigned() && e["data_offsets"][1].is_number_unsigned()) {
    uint64_t b = e["data_offsets"][0], en = e["data_offsets"][1], n = en - b;
    switch (rng() % 8) {
      case 0: b = u(data_bytes + 1); break;                         // move, keep size: overlaps
      case 1: b = data_bytes - std::min(n, data_bytes) + u(3); break;  // near the end
      case 2: b = big[rng() % std::size(big)]; break;              // huge begin, size kept (wraps)
      case 3: en = big[rng() % std::size(big)]; n = en - b; break;
      case 4: e["shape"] = nlohmann::json::array({u(5), u(5), u(5)}); break;
      case 5: e["shape"] = nlohmann::json::array({big[rng() % std::size(big)], 0}); break;
      case 6: e["dtype"] = std::vector<const char*>{"F32", "BF16", "F16", "I32", "I64", "F8_E4M3", "BOOL"}[rng() % 7]; break;
      case 7: e.erase(rng() % 2 ? "shape" : "dtype"); break;
    }
    e["data_offsets"] = {b, b + n};
  } else if (e.is_object()) {  // __metadata__
    e[std::to_string(rng() % 4)] = rng() % 2 ? nlohmann::json(int(rng() % 9)) : nlohmann::json("v");
  }
  std::string text = h.dump();
  text.append(rng() % 8, ' ');
  s = std::string(8, '\0') + text + s.substr(8 + hlen);
  set_len(s, text.size());
  return true;
}

// One mutation; applies 1..3 stacked edits so that combinations get explored too.
std::string mutate(const std::string& base, std::mt19937_64& rng) {
  std::string s = base;
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  const int edits = 1 + int(rng() % 3);
  for (int ed = 0; ed < edits; ++ed) {
    const uint64_t hlen = get_len(s);
    const size_t before = s.size();
    bool fix_len = false;
    switch (rng() % 10) {
      case 8:
      case 9:
        mutate_header(s, rng);
        break;
      case 0:
        for (int i = 0, n = 1 + int(rng() % 8); i < n && !s.empty(); ++i) s[pick(s.size())] ^= char(1 << (rng() % 8));
        break;
      case 1:
        s.resize(pick(s.size() + 1));
        break;
      case 2: {
        uint64_t c[] = {hlen + 1, hlen - 1, hlen + 8, hlen - 8, 0, 1, uint64_t(s.size()), uint64_t(s.size()) - 8,
                        uint64_t(s.size()) - 7, rng(), hlen ^ (uint64_t(1) << (rng() % 64)), ~uint64_t(0),
                        kSafetensorsMaxHeaderBytes, kSafetensorsMaxHeaderBytes + 1};
        set_len(s, c[pick(std::size(c))]);
        break;
      }
      case 3:
      case 4: {
        std::vector<size_t> digits;
        for (size_t i = 8; i < 8 + hlen && i < s.size(); ++i)
          if (s[i] >= '0' && s[i] <= '9') digits.push_back(i);
        for (int i = 0, n = 1 + int(rng() % 3); i < n && !digits.empty(); ++i) {
          size_t at = digits[pick(digits.size())];
          if (at >= s.size()) continue;
          switch (rng() % 4) {
            case 0: s.insert(at, 1, char('0' + rng() % 10)); break;
            case 1: s.erase(at, 1); break;
            default: s[at] = char('0' + rng() % 10);
          }
        }
        fix_len = true;
        break;
      }
      case 5: {
        size_t at = std::min(s.size(), 8 + pick(size_t(std::min<uint64_t>(hlen, s.size()))));
        size_t len = std::min(pick(8), s.size() - at);
        s.replace(at, len, kTokens[pick(std::size(kTokens))]);
        fix_len = rng() % 4 != 0;
        break;
      }
      case 6: {
        size_t at = pick(s.size() + 1), len = std::min(pick(128), s.size() - at);
        if (rng() % 2)
          s.insert(pick(s.size() + 1), s.substr(at, len));
        else
          s.erase(at, len);
        fix_len = rng() % 2;
        break;
      }
      case 7:  // append garbage or zeros to the data section
        s.append(pick(64), rng() % 2 ? '\0' : char(rng()));
        break;
    }
    if (fix_len) set_len(s, hlen + uint64_t(int64_t(s.size()) - int64_t(before)));
  }
  return s;
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
    seeds.push_back(read_all(p));
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
