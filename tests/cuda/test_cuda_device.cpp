// The CUDA device backend itself (src/device/cuda_device.cpp): the errors a user meets (no GPU,
// an old driver, not enough GPU memory, the arena budget naming the tensor), kernel-found bad
// input reported at synchronize, and streams, events and pinned copies ordering a small
// upload -> compute -> download pipeline.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

#if defined(STRATA_CUEMU)
// Sets an emulator environment knob for one scope (cuemu reads these at each call).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

TEST_CASE("cuda device: no GPU and an old driver are clear errors that point to the cpu backend", "[cuda-emu]") {
  DeviceOptions o;
  o.backend = DeviceBackend::cuda;
  o.memory_bytes = 1 << 20;
  {
    ScopedEnv none("CUEMU_DEVICES", "0");
    CHECK_THROWS_WITH(device_create_cuda(o), Catch::Contains("no CUDA GPU found") &&
                                                 Catch::Contains("backend = \"cpu\""));
  }
  {
    ScopedEnv old("CUEMU_DRIVER", "12080");
    CHECK_THROWS_WITH(device_create_cuda(o), Catch::Contains("driver supports CUDA 12.8") &&
                                                 Catch::Contains("update the driver"));
  }
  {
    ScopedEnv none("CUEMU_DRIVER", "0");
    CHECK_THROWS_WITH(device_create_cuda(o), Catch::Contains("no NVIDIA driver"));
  }
  CHECK_NOTHROW(device_create_cuda(o));  // and fine again with a GPU
}

TEST_CASE("cuda device: a budget larger than the GPU is a memory error", "[cuda-emu]") {
  DeviceOptions o;
  o.backend = DeviceBackend::cuda;
  o.memory_bytes = size_t(1) << 40;  // 1 TiB: more than the emulated 80 GiB GPU
  try {
    device_create_cuda(o);
    FAIL("a 1 TiB arena was granted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::budget);
    CHECK_THAT(e.what(), Catch::Contains("GPU memory") && Catch::Contains("lower [device] memory"));
  }
}
#endif

TEST_CASE("cuda device: the arena budget names the tensor that does not fit", "[cuda-emu]") {
  auto dev = cuda_testing::test_device(size_t(4) << 20);
  if (!dev) return;
  void* a = dev->alloc(size_t(1) << 20, "small");
  CHECK(dev->used_bytes() >= (size_t(1) << 20));
  try {
    dev->alloc(size_t(8) << 20, "layers.3.mlp.up_proj.weight");
    FAIL("an allocation over budget succeeded");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::budget);
    CHECK_THAT(e.what(), Catch::Contains("layers.3.mlp.up_proj.weight"));
  }
  dev->free(a);
  // Allocations come back NaN-poisoned, as on the CPU backend.
  Buffer<float> fresh(*dev, 5);
  for (float x : fresh.download()) CHECK(std::isnan(x));
}

TEST_CASE("cuda device: bad targets and token ids found by kernels throw at synchronize", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  const int64_t n = 3, c = 4, v = 7;
  Buffer<float> h(*dev, testing::random_floats(size_t(n * c), 91));
  Buffer<float> w(*dev, testing::random_floats(size_t(v * c), 92));
  Buffer<int32_t> targets(*dev, std::vector<int32_t>{1, 7, -100});  // 7 is outside [0, 7)
  Buffer<double> stats(*dev, size_t(n * 3));
  dev->lm_head_ce_chunk_stats(stats, h, w, DType::f32, targets, n, c, v, 0, v, true, nullptr, Stream::compute);
  CHECK_THROWS_WITH(dev->stream_synchronize(Stream::compute), Catch::Contains("target id"));
  dev->stream_synchronize(Stream::compute);  // cleared once reported

  Buffer<int32_t> ids(*dev, std::vector<int32_t>{0, -3, 2});
  Buffer<float> out(*dev, size_t(n * c));
  dev->embedding_forward(out, w, DType::f32, ids, n, c, Stream::compute);
  CHECK_THROWS_WITH(dev->stream_synchronize(Stream::compute), Catch::Contains("token id"));
}

TEST_CASE("cuda device: streams and events order pinned uploads, compute and downloads", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  const int64_t n = 4099;  // not a multiple of anything
  const size_t bytes = size_t(n) * sizeof(float);
  auto* up = static_cast<float*>(dev->alloc_pinned(bytes));
  auto* down = static_cast<float*>(dev->alloc_pinned(bytes));
  auto* x = static_cast<float*>(dev->alloc(bytes, "x"));
  auto* y = static_cast<float*>(dev->alloc(bytes, "y"));
  dev->memset_zero(y, bytes, Stream::compute);
  auto uploaded = dev->event_create(), computed = dev->event_create();
  std::vector<float> want(size_t(n), 0.f);
  for (int round = 1; round <= 3; ++round) {
    for (int64_t i = 0; i < n; ++i) up[i] = float(round * 1000 + i);
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] += up[i];
    dev->copy_h2d(x, up, bytes, Stream::h2d);
    dev->event_record(*uploaded, Stream::h2d);
    dev->stream_wait_event(Stream::compute, *uploaded);
    dev->add_inplace(y, x, n, Stream::compute);
    dev->event_record(*computed, Stream::compute);
    dev->stream_wait_event(Stream::d2h, *computed);
    dev->copy_d2h(down, y, bytes, Stream::d2h);
    dev->stream_synchronize(Stream::d2h);   // `down` is ready; `up` is free once h2d is done
    dev->event_synchronize(*uploaded);
    CHECK(std::memcmp(down, want.data(), bytes) == 0);
  }
  const DeviceCounters counters = dev->counters();
  CHECK(counters.h2d_bytes == 3 * bytes);
  CHECK(counters.d2h_bytes == 3 * bytes);
  dev->free(y);
  dev->free(x);
  dev->free_pinned(down);
  dev->free_pinned(up);
}

}  // namespace
}  // namespace strata

namespace strata {

TEST_CASE("cuda device: the MFU peak comes from the datasheet table by GPU name, per dtype", "[cuda-emu]") {
  auto dev = cuda_testing::test_device(size_t(64) << 20);  // no GPU: reported skipped
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  const DevicePeak b = dev->peak_flops(DType::bf16), f = dev->peak_flops(DType::f32);
  auto known_b = gpu_datasheet_peak(prop.name, DType::bf16), known_f = gpu_datasheet_peak(prop.name, DType::f32);
  if (known_b) {  // the emulator says "H100-like": the table's H100 SXM row, not a CPU figure
    CHECK(b.flops_per_s == known_b->flops_per_s);
    CHECK(f.flops_per_s == known_f->flops_per_s);
    CHECK(b.source.find("datasheet") != std::string::npos);
  } else {
    CHECK(b.source.find("measured") != std::string::npos);
  }
  CHECK(b.flops_per_s > f.flops_per_s);  // tensor cores
  CHECK(dev->peak_flops(DType::bf16).flops_per_s == b.flops_per_s);
}

}  // namespace strata
