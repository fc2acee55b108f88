// The safetensors mutator shared by the fuzzer (tools/fuzz/fuzz_safetensors.cpp) and the
// reader's mutation test (tests/io/test_safetensors.cpp): seeded edits of a valid file that
// reach every check of the reader — bit flips, truncation, header-length edits, digit edits and
// token splices in the header, chunk duplication and removal, appended data, and header-aware
// edits that keep the JSON valid (offsets, shapes, dtypes) — 1 to 3 stacked per mutant, with the
// header length fixed up often enough that the JSON gets parsed.
#pragma once
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace strata::safetensors_mutator {

inline uint64_t get_len(const std::string& s) {
  uint64_t v = 0;
  for (int i = 7; i >= 0 && s.size() >= 8; --i) v = (v << 8) | uint8_t(s[i]);
  return v;
}

inline void set_len(std::string& s, uint64_t v) {
  if (s.size() < 8) return;
  for (int i = 0; i < 8; ++i) s[i] = char(v >> (8 * i));
}

inline const char* kTokens[] = {"{", "}", "[", "]", ",", ":", "\"", "-1", "0", "1e30", "-0", "1.5", "2.0",
                         "18446744073709551615", "18446744073709551616", "9223372036854775807",
                         "9223372036854775808", "4294967296", "null", "true", "false", "\"F64\"",
                         "\"BF16\"", "\"F16\"", "\"I32\"", "\"I64\"", "\"F32\"", "\"\"", "\"__metadata__\"",
                         "\"data_offsets\"", "\"shape\"", "\"dtype\"", "[0,0]", "[0,18446744073709551615]",
                         "[]", "{}", "\\u0000", "\"\\ud800\"", "\xff", "\xc3\xa9", "[[[[", "]]]]", "{\"a\":"};

// Header-aware edit: re-serialises the header with one entry changed in a way that keeps the JSON
// valid and often keeps the sizes consistent, to reach the overlap / range / size checks.
inline bool mutate_header(std::string& s, std::mt19937_64& rng) {
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
inline std::string mutate(const std::string& base, std::mt19937_64& rng) {
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

}  // namespace strata::safetensors_mutator
