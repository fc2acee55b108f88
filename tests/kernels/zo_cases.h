// The (seed, tensor, offset) cases the ZO bit-identity tests walk, on the CPU (tests/kernels/
// test_zo.cpp) and against the CUDA backend (tests/cuda/test_cuda_zo.cpp): offsets inside and
// across Philox blocks and 256-element chunks, and past 2^32 and 2^62 elements.
#pragma once
#include <cstdint>

namespace strata::zo_testing {

struct Where {
  uint64_t seed;
  uint32_t tensor;
  uint64_t offset;
};

inline constexpr Where kWheres[] = {
    {0, 0, 0},
    {1, 0, 1},
    {42, 3, 3},
    {0x0123456789ABCDEFull, 17, 255},
    {7, 0xFFFFFFFFu, 257},
    {~0ull, 5, (1ull << 32) - 3},
    {99, 1, (1ull << 32) + 1},
    {12345, 250, (1ull << 40) + 7},
    {3, 2, (1ull << 62) - 2},
};

}  // namespace strata::zo_testing
