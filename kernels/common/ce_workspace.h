// The CUDA backend's lm_head_ce workspace (kernels/cuda/cross_entropy.cu): one tile of
// kCeTileRows rows of f32 logits, their bf16 copy and the tile's bf16 hidden states, each
// 256-byte aligned. Here so that the kernel and the memory planners (src/device/device.h,
// cuda_backend_workspace_bytes) count the same bytes.
#pragma once
#include <cstddef>
#include <cstdint>

#include "src/core/align.h"

namespace strata {

inline constexpr int64_t kCeTileRows = 128;

inline size_t lm_head_ce_tile_workspace_bytes(int64_t c, int64_t vc) {
  return align_up(size_t(kCeTileRows * vc) * 4) + align_up(size_t(kCeTileRows * c) * 2) +
         align_up(size_t(kCeTileRows * vc) * 2);
}

}  // namespace strata
