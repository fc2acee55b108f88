// The inputs of the collective tests, shared by the MPI probe (tools/comm/comm_probe.cpp, run
// under mpirun) and the emulated NCCL test (tests/cuda/test_comm_nccl.cpp); here beside the probe,
// since a tool may not include test code and a test may include anything: rank r's i-th value,
// of mixed sign and magnitude 2^-10 .. 2^10, so the order of the additions changes the rounded
// sum and an order other than the one promised shows.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "src/core/hash.h"

namespace strata::comm_testing {

inline uint64_t mix(uint64_t x) { return hash_mix64(x); }

template <class T>
T input(int rank, size_t i, uint64_t salt) {
  const uint64_t h = mix((uint64_t(rank) << 40) ^ i ^ (salt << 52));
  const double unit = double(h >> 11) / double(1ull << 53) * 2.0 - 1.0;
  return T(std::ldexp(unit, int(h % 21) - 10));
}

}  // namespace strata::comm_testing
