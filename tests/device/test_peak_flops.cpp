// The MFU denominator (issue 10, item 5): the device's peak matmul FLOP/s per dtype — the GPU
// datasheet table by name, the CPU backend's measured GEMM (positive, cached, per dtype).
#include <catch2/catch.hpp>

#include "src/device/device.h"
#include "src/device/peak_flops.h"

namespace strata {

TEST_CASE("GPUs are found in the datasheet table by their CUDA names", "[mfu]") {
  auto bf16 = [](const char* name) { return gpu_datasheet_peak(name, DType::bf16); };
  struct Row {
    const char* name;
    DType dtype;
    double flops_per_s;
  };
  for (const Row& r : {Row{"NVIDIA H100 80GB HBM3", DType::bf16, 989e12}, Row{"NVIDIA H100 80GB HBM3", DType::f32, 67e12},
                       Row{"NVIDIA H100 PCIe", DType::bf16, 756e12}, Row{"NVIDIA H100 NVL", DType::bf16, 835e12},
                       Row{"NVIDIA H200", DType::bf16, 989e12}, Row{"NVIDIA A100-SXM4-80GB", DType::bf16, 312e12},
                       Row{"NVIDIA A100 80GB PCIe", DType::f32, 19.5e12}, Row{"NVIDIA L40S", DType::bf16, 362e12},
                       Row{"NVIDIA L4", DType::bf16, 121e12}, Row{"NVIDIA A10", DType::bf16, 125e12},
                       Row{"NVIDIA GeForce RTX 4090", DType::bf16, 165e12},
                       Row{"NVIDIA GeForce RTX 3090", DType::bf16, 71e12}}) {
    INFO(r.name << " " << dtype_name(r.dtype));
    const auto peak = gpu_datasheet_peak(r.name, r.dtype);
    REQUIRE(peak);
    CHECK(peak->flops_per_s == r.flops_per_s);
  }
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
