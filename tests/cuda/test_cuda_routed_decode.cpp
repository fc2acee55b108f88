// The generator's routed decode on the CUDA backend (offload/engine/routed_decode.h): the same
// checks as the CPU backend's (tests/offload/routed_decode_testing.h): transformers' greedy
// tokens on the MoE goldens, and the link bytes of routed against whole-layer decode, also on an
// NF4 base.
#include <catch2/catch.hpp>

#include "tests/cuda/cuda_testing.h"
#include "tests/offload/routed_decode_testing.h"

namespace strata {

TEST_CASE("CUDA routed decode of streamed MoE layers gives transformers' greedy tokens", "[cuda-emu][moe][routed]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (const char* name : {"qwen3_moe", "mixtral"}) routed_testing::golden_tokens_check(*dev, name);
}

TEST_CASE("CUDA routed decode uploads the shared part and the routed experts only", "[cuda-emu][moe][routed]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  for (int64_t B : {1, 3}) routed_testing::routed_bytes_check(*dev, B);
}

TEST_CASE("CUDA routed decode on an NF4 base uploads its packed shared part and the routed experts only",
          "[cuda-emu][moe][routed][qlora]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  routed_testing::routed_bytes_check(*dev, 3, /*nf4=*/true);
}

}  // namespace strata
