// The CUDA backend's busy, per-op and wait times (DeviceCounters, measured with CUDA timing
// events in src/device/cuda_device.cpp): each op's time lands in its own family and on the
// stream that ran it, copies count as their stream's busy time, and a stream held up by
// stream_wait_event reports the wait. Values are checked for being there (positive) and for
// being absent where nothing ran, never against a clock.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

// after - before, field by field.
DeviceCounters counters_delta(const DeviceCounters& after, const DeviceCounters& before) {
  DeviceCounters d;
  d.h2d_bytes = after.h2d_bytes - before.h2d_bytes;
  d.d2h_bytes = after.d2h_bytes - before.d2h_bytes;
  d.compute_busy_s = after.compute_busy_s - before.compute_busy_s;
  d.h2d_busy_s = after.h2d_busy_s - before.h2d_busy_s;
  d.d2h_busy_s = after.d2h_busy_s - before.d2h_busy_s;
  for (int k = 0; k < int(OpKind::count); ++k) d.op_s[k] = after.op_s[k] - before.op_s[k];
  for (int k = 0; k < kStreamCount; ++k) d.stream_wait_s[k] = after.stream_wait_s[k] - before.stream_wait_s[k];
  return d;
}

double op_seconds(const DeviceCounters& c, OpKind k) { return c.op_s[int(k)]; }

TEST_CASE("cuda device counters: op time per family, busy time per stream, stream waits", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  const int64_t n = 37, c = 48;
  Buffer<float> x(*dev, random_floats(size_t(n * c), 1)), w(*dev, random_floats(size_t(c), 2));
  Buffer<float> y(*dev, size_t(n * c)), rstd(*dev, size_t(n)), prod(*dev, size_t(n * n));
  dev->synchronize();
  const DeviceCounters before = dev->counters();

  // compute: norm, matmul and an elementwise add; nothing of the other families
  dev->rmsnorm_forward(y, rstd, x, w, n, c, 1e-5f, Stream::compute);
  dev->matmul(prod, y, x, DType::f32, n, n, c, false, true, 0.f, Stream::compute);
  for (int i = 0; i < 3; ++i) dev->add_inplace(y, x, n * c, Stream::compute);
  // h2d: a large pinned upload, which the compute stream then waits for
  const size_t big = size_t(4) << 20;
  auto* host = static_cast<char*>(dev->alloc_pinned(big));
  std::memset(host, 0, big);
  char* dst = static_cast<char*>(dev->alloc(big, "upload target"));
  auto uploaded = dev->event_create();
  dev->copy_h2d(dst, host, big, Stream::h2d);
  dev->event_record(*uploaded, Stream::h2d);
  dev->stream_wait_event(Stream::compute, *uploaded);
  dev->add_inplace(reinterpret_cast<float*>(dst), x, n * c, Stream::compute);
  dev->synchronize();
  const DeviceCounters d = counters_delta(dev->counters(), before);

  CHECK(op_seconds(d, OpKind::norm) > 0);
  CHECK(op_seconds(d, OpKind::matmul) > 0);
  CHECK(op_seconds(d, OpKind::elementwise) > 0);
  for (OpKind idle : {OpKind::attention, OpKind::cross_entropy, OpKind::rope, OpKind::embedding})
    CHECK(op_seconds(d, idle) == 0);
  // every op ran on the compute stream, so its busy time is their sum (no copies on it here)
  double ops = 0;
  for (int k = 0; k < int(OpKind::count); ++k) ops += d.op_s[k];
  CHECK(d.compute_busy_s == Approx(ops).epsilon(1e-9));
  CHECK(d.h2d_busy_s > 0);           // the upload
  CHECK(d.d2h_busy_s == 0);          // nothing ran there
  CHECK(d.stream_wait_s[int(Stream::compute)] > 0);
  CHECK(d.stream_wait_s[int(Stream::h2d)] == 0);
  CHECK(d.stream_wait_s[int(Stream::d2h)] == 0);
  CHECK(d.h2d_bytes == big);

  dev->free(dst);
  dev->free_pinned(host);
}

TEST_CASE("cuda device counters: many queued ops are all counted, reading them does not wait", "[cuda-emu]") {
  auto dev = cuda_testing::test_device();
  if (!dev) return;
  const int64_t n = 1000;
  Buffer<float> y(*dev, std::vector<float>(size_t(n), 0.f)), x(*dev, std::vector<float>(size_t(n), 1.f));
  dev->synchronize();
  const DeviceCounters before = dev->counters();
  const int kOps = 300;  // more spans than the timer starts with events: they get recycled
  for (int i = 0; i < kOps; ++i) {
    dev->add_inplace(y, x, n, Stream::compute);
    if (i % 50 == 0) (void)dev->counters();  // mid-flight: reads what has finished so far
  }
  dev->synchronize();
  const DeviceCounters d = counters_delta(dev->counters(), before);
  CHECK(op_seconds(d, OpKind::elementwise) > 0);
  CHECK(d.compute_busy_s == Approx(op_seconds(d, OpKind::elementwise)).epsilon(1e-9));
  // and the ops all ran, in order
  for (float v : y.download()) REQUIRE(v == float(kOps));
}

}  // namespace
}  // namespace strata
