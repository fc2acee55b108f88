// The generator's routed decode on the CPU backend (offload/engine/routed_decode.h): transformers'
// greedy tokens on the MoE goldens with streamed weights, and a decode pass's link bytes routed
// against whole-layer (tests/offload/routed_decode_testing.h says what each check holds).
#include <catch2/catch.hpp>

#include "tests/offload/routed_decode_testing.h"

namespace strata {

TEST_CASE("routed decode of streamed MoE layers gives transformers' greedy tokens", "[moe][generate][routed]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"qwen3_moe", "mixtral"}) routed_testing::golden_tokens_check(*dev, name);
}

TEST_CASE("routed decode uploads the shared part and the routed experts only", "[moe][generate][routed]") {
  auto dev = device_create(DeviceOptions{});
  for (int64_t B : {1, 3}) routed_testing::routed_bytes_check(*dev, B);
}

TEST_CASE("routed decode on an NF4 base uploads its packed shared part and the routed experts only",
          "[moe][generate][routed][qlora]") {
  auto dev = device_create(DeviceOptions{});
  for (int64_t B : {1, 3}) routed_testing::routed_bytes_check(*dev, B, /*nf4=*/true);
}

}  // namespace strata
