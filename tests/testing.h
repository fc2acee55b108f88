// Shared test helpers: seeded inputs, error measures, central finite differences, paths.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <sstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/bf16.h"

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

}  // namespace strata::testing
