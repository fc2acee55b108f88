// The MFU denominator (issue 10, item 5): the device's peak matmul FLOP/s per dtype — the GPU
// datasheet table by name, the CPU backend's measured oneDNN GEMM (positive, cached, per dtype).
#include <catch2/catch.hpp>

#include "src/device/device.h"
#include "src/device/peak_flops.h"

namespace strata {

TEST_CASE("GPUs are found in the datasheet table by their CUDA names", "[mfu]") {
  auto bf16 = [](const char* name) { return gpu_datasheet_peak(name, DType::bf16); };
  auto f32 = [](const char* name) { return gpu_datasheet_peak(name, DType::f32); };
  REQUIRE(bf16("NVIDIA H100 80GB HBM3"));
  CHECK(bf16("NVIDIA H100 80GB HBM3")->flops_per_s == 989e12);
  CHECK(f32("NVIDIA H100 80GB HBM3")->flops_per_s == 67e12);
  CHECK(bf16("NVIDIA H100 PCIe")->flops_per_s == 756e12);
  CHECK(bf16("NVIDIA H100 NVL")->flops_per_s == 835e12);
  CHECK(bf16("NVIDIA H200")->flops_per_s == 989e12);
  CHECK(bf16("NVIDIA A100-SXM4-80GB")->flops_per_s == 312e12);
  CHECK(f32("NVIDIA A100 80GB PCIe")->flops_per_s == 19.5e12);
  CHECK(bf16("NVIDIA L40S")->flops_per_s == 362e12);
  CHECK(bf16("NVIDIA L4")->flops_per_s == 121e12);
  CHECK(bf16("NVIDIA A10")->flops_per_s == 125e12);
  CHECK(bf16("NVIDIA GeForce RTX 4090")->flops_per_s == 165e12);
  CHECK(bf16("NVIDIA GeForce RTX 3090")->flops_per_s == 71e12);
  CHECK(bf16("NVIDIA H100 80GB HBM3")->source.find("H100 SXM") != std::string::npos);
  CHECK_FALSE(bf16("NVIDIA GeForce GTX 1080"));  // not listed: the CUDA backend measures instead
  CHECK_FALSE(bf16(""));
}

TEST_CASE("the CPU backend measures its peak per dtype, once", "[mfu][device]") {
  DeviceOptions o;
  o.memory_bytes = 16 << 20;
  auto dev = device_create(o);
  const DevicePeak f = dev->peak_flops(DType::f32), b = dev->peak_flops(DType::bf16);
  CHECK(f.flops_per_s > 1e8);  // any CPU this runs on does 0.1 GFLOP/s
  CHECK(b.flops_per_s > 1e8);
  CHECK(f.source.find("f32") != std::string::npos);
  CHECK(b.source.find("bf16") != std::string::npos);
  CHECK(f.source.find("fastest of 5") != std::string::npos);
  // cached: the same figure, not a new measurement
  CHECK(dev->peak_flops(DType::f32).flops_per_s == f.flops_per_s);
  CHECK(cpu_measured_peak(DType::bf16).flops_per_s == b.flops_per_s);
}

TEST_CASE("median_seconds is the middle value", "[mfu]") {
  CHECK(median_seconds({3.0, 1.0, 2.0}) == 2.0);
  CHECK(median_seconds({4.0, 1.0, 2.0, 3.0}) == 2.5);
  CHECK(median_seconds({9.0}) == 9.0);
}

}  // namespace strata
