// The one buffer alignment of strata: every arena allocation, tensor-table offset and carved
// workspace starts on a multiple of kBufferAlignment bytes (cache lines, SIMD loads, cuBLAS and
// O_DIRECT-friendly offsets). Change it here and everything that rounds follows.
#pragma once
#include <cstddef>

namespace strata {

constexpr size_t kBufferAlignment = 256;

// bytes rounded up to the next multiple of kBufferAlignment (0 stays 0).
constexpr size_t align_up(size_t bytes) {
  return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
}

}  // namespace strata
