// The CPU backend as a device: streams run in order on their own threads, events order work
// across streams, copies are asynchronous, the link throttle holds, errors are sticky.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/recipe/recipe_modes.h"
#include "src/core/fault.h"
#include "src/core/threads.h"
#include "src/device/device.h"
#include "tests/core/watchdog.h"

namespace strata {

TEST_CASE("device memory is budgeted and NaN-poisoned", "[device]") {
  DeviceOptions o;
  o.memory_bytes = 1 << 20;
  auto dev = device_create(o);
  float* p = static_cast<float*>(dev->alloc(64 * 4, "probe"));
  CHECK(std::isnan(p[0]));
  CHECK(std::isnan(p[63]));
  CHECK_THROWS_AS(dev->alloc(2 << 20, "too big"), Error);
  dev->free(p);
  CHECK(dev->used_bytes() == 0);
}

TEST_CASE("copies and ops are asynchronous and ordered by events across streams", "[device]") {
  auto dev = device_create(DeviceOptions{});
  const int64_t n = 1 << 16;
  std::vector<float> host(n, 2.f), back(n, 0.f);
  float* a = static_cast<float*>(dev->alloc(n * 4, "a"));
  float* b = static_cast<float*>(dev->alloc(n * 4, "b"));
  auto uploaded = dev->event_create();
  auto computed = dev->event_create();
  dev->copy_h2d(a, host.data(), n * 4, Stream::h2d);
  dev->event_record(*uploaded, Stream::h2d);
  dev->stream_wait_event(Stream::compute, *uploaded);
  dev->memset_zero(b, n * 4, Stream::compute);
  dev->add_inplace(b, a, n, Stream::compute);  // b = 2
  dev->add_inplace(b, a, n, Stream::compute);  // b = 4
  dev->event_record(*computed, Stream::compute);
  dev->stream_wait_event(Stream::d2h, *computed);
  dev->copy_d2h(back.data(), b, n * 4, Stream::d2h);
  dev->stream_synchronize(Stream::d2h);
  for (int64_t i = 0; i < n; i += 997) REQUIRE(back[size_t(i)] == 4.f);
  CHECK(back[size_t(n - 1)] == 4.f);
  CHECK(dev->counters().h2d_bytes == size_t(n) * 4);
  CHECK(dev->counters().d2h_bytes == size_t(n) * 4);
  dev->free(a);
  dev->free(b);
}

TEST_CASE("an event waits only for the work recorded before it", "[device]") {
  // One stream: [slow copy][x = 1] record(E) [slow copy][marker = 1]. The slow copies are
  // throttled link transfers (the CPU backend's only way to keep a stream busy). After
  // event_synchronize(E):
  //   - x must be 1: an event that did not wait for the work before it fails here (the slow copy
  //     ahead of x keeps x unwritten for its whole duration);
  //   - marker must still be unwritten (NaN): an event that waited for the whole stream fails
  //     here. A correct device could only fail this if this thread stalled for the whole second
  //     the second slow copy takes.
  DeviceOptions o;
  o.link_bytes_per_s = 1e6;  // 1 MB/s
  auto dev = device_create(o);
  const size_t slow = 1'000'000;  // 1 s per slow copy at 1 MB/s
  std::vector<char> junk(slow, 0);
  char* pad = static_cast<char*>(dev->alloc(slow, "pad"));
  float* x = static_cast<float*>(dev->alloc(4, "x"));
  float* marker = static_cast<float*>(dev->alloc(4, "marker"));
  std::vector<float> one(1, 1.f);
  auto ev = dev->event_create();
  dev->copy_h2d(pad, junk.data(), slow / 4, Stream::h2d);  // 0.25 s
  dev->copy_h2d(x, one.data(), 4, Stream::h2d);
  dev->event_record(*ev, Stream::h2d);
  dev->copy_h2d(pad, junk.data(), slow, Stream::h2d);  // 1 s
  dev->copy_h2d(marker, one.data(), 4, Stream::h2d);
  dev->event_synchronize(*ev);
  const float x_seen = x[0], marker_seen = marker[0];  // device memory is host memory on this backend
  CHECK(x_seen == 1.f);
  CHECK(std::isnan(marker_seen));
  dev->stream_synchronize(Stream::h2d);
  CHECK(marker[0] == 1.f);
  dev->free(pad);
  dev->free(x);
  dev->free(marker);
}

TEST_CASE("the link throttle holds copies to the set bandwidth", "[device]") {
  // Asserts on the device's own accounting, not on this thread's clock: the h2d stream's busy
  // time for 8 MB at 100 MB/s is at least the 80 ms the throttle must take (a throttle that did
  // not hold would show the memcpy's few milliseconds), and the bytes are all counted.
  DeviceOptions o;
  o.link_bytes_per_s = 100e6;
  auto dev = device_create(o);
  const size_t bytes = 8'000'000;
  std::vector<char> host(bytes, 1);
  void* d = dev->alloc(bytes, "d");
  dev->copy_h2d(d, host.data(), bytes, Stream::h2d);
  dev->stream_synchronize(Stream::h2d);
  const DeviceCounters c = dev->counters();
  CHECK(c.h2d_bytes == bytes);
  CHECK(c.h2d_busy_s >= 0.079);
  dev->free(d);
}

TEST_CASE("a kernel error is sticky and surfaces at synchronize", "[device]") {
  auto dev = device_create(DeviceOptions{});
  const int64_t n = 4, c = 8, v = 5;
  float* h = static_cast<float*>(dev->alloc(n * c * 4, "h"));
  float* w = static_cast<float*>(dev->alloc(v * c * 4, "w"));
  int32_t* t = static_cast<int32_t*>(dev->alloc(n * 4, "t"));
  double* stats = static_cast<double*>(dev->alloc(n * 3 * 8, "stats"));
  std::vector<float> zeros(size_t(v * c), 0.f);
  std::vector<int32_t> bad = {0, 1, 99, 2};  // 99 is outside the vocabulary
  dev->copy_h2d(h, zeros.data(), n * c * 4, Stream::compute);
  dev->copy_h2d(w, zeros.data(), v * c * 4, Stream::compute);
  dev->copy_h2d(t, bad.data(), n * 4, Stream::compute);
  dev->lm_head_ce_chunk_stats(stats, h, w, DType::f32, t, n, c, v, 0, v, true, nullptr, Stream::compute);
  CHECK_THROWS_AS(dev->stream_synchronize(Stream::compute), Error);
  dev->stream_synchronize(Stream::compute);  // cleared once reported
}

TEST_CASE("unknown and unavailable backends are clear input errors", "[device]") {
  DeviceOptions o;
#ifndef STRATA_HAVE_CUDA
  o.backend = DeviceBackend::cuda;  // not built in: says how to build it (a CUDA build is tested in tests/cuda)
  CHECK_THROWS_WITH(device_create(o), Catch::Contains("not built into this strata"));
#endif
  // an unknown backend is refused where the recipe's strings are parsed, once
  CHECK_THROWS_AS(device_backend_parse("tpu"), Error);
  CHECK_THROWS_WITH(device_backend_parse("tpu"), Catch::Contains("device.backend must be \"cpu\", \"cuda\" or \"auto\""));
}

// STRATA_FAULT set in this process for one scope (the count starts again from the set).
struct FaultScope {
  explicit FaultScope(const char* value) {
    setenv("STRATA_FAULT", value, 1);
    fault_reload_for_tests();
  }
  ~FaultScope() {
    unsetenv("STRATA_FAULT");
    fault_reload_for_tests();
  }
};

// What each wait of the failure test saw: the error's text, or "" when it returned normally.
struct Waits {
  std::string event_sync, h2d_sync, compute_sync, d2h_sync, compute_again;
  float after = 0;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("a task that throws fails every stream waiting on its events, and nothing hangs", "[device][task-faults]") {
  // h2d: [memset: throws] [copy] record(up); compute: wait(up) [add] record(done); d2h: wait(done)
  // [copy] record(back). Before event records ran after a failure, `up` never completed and
  // compute, d2h and the host blocked for ever.
  auto w = std::make_shared<Waits>();
  const bool finished = testing::finishes_within(60, [w] {
    FaultScope fault("throw@task:1");
    auto dev = device_create(DeviceOptions{});
    const int64_t n = 1024;
    std::vector<float> host(n, 1.f), back(n, 0.f);
    float* a = static_cast<float*>(dev->alloc(n * 4, "a"));
    float* b = static_cast<float*>(dev->alloc(n * 4, "b"));
    auto up = dev->event_create(), done = dev->event_create(), copied = dev->event_create();
    // upload, add, download: three streams chained by the three events
    auto chain = [&] {
      dev->copy_h2d(a, host.data(), n * 4, Stream::h2d);
      dev->event_record(*up, Stream::h2d);
      dev->stream_wait_event(Stream::compute, *up);
      dev->memset_zero(b, n * 4, Stream::compute);
      dev->add_inplace(b, a, n, Stream::compute);
      dev->event_record(*done, Stream::compute);
      dev->stream_wait_event(Stream::d2h, *done);
      dev->copy_d2h(back.data(), b, n * 4, Stream::d2h);
      dev->event_record(*copied, Stream::d2h);
    };
    dev->memset_zero(a, n * 4, Stream::h2d);  // the process's first task since the set: throws
    chain();
    w->event_sync = error_of([&] { dev->event_synchronize(*copied); });
    w->h2d_sync = error_of([&] { dev->stream_synchronize(Stream::h2d); });
    w->compute_sync = error_of([&] { dev->stream_synchronize(Stream::compute); });
    w->d2h_sync = error_of([&] { dev->stream_synchronize(Stream::d2h); });
    // collected once per stream: the device works again, events recorded anew complete cleanly
    w->compute_again = error_of([&] { dev->synchronize(); });
    chain();
    dev->event_synchronize(*copied);
    w->after = back[n - 1];
    dev->free(a);
    dev->free(b);
  });
  REQUIRE(finished);
  CHECK_THAT(w->event_sync, Catch::Contains("STRATA_FAULT: a task threw at task"));
  CHECK_THAT(w->h2d_sync, Catch::Contains("STRATA_FAULT: a task threw at task"));
  CHECK_THAT(w->compute_sync, Catch::Contains("STRATA_FAULT: a task threw at task"));
  CHECK_THAT(w->d2h_sync, Catch::Contains("STRATA_FAULT: a task threw at task"));
  CHECK(w->compute_again.empty());
  CHECK(w->after == 1.f);
}

TEST_CASE("a device destroyed with a failed stream and waiters on it does not hang", "[device][task-faults]") {
  const bool finished = testing::finishes_within(60, [] {
    FaultScope fault("throw@task:2");
    auto dev = device_create(DeviceOptions{});
    float* a = static_cast<float*>(dev->alloc(4096, "a"));
    auto ev = dev->event_create();
    for (int i = 0; i < 3; ++i) dev->memset_zero(a, 4096, Stream::compute);  // the second throws
    dev->event_record(*ev, Stream::compute);
    dev->stream_wait_event(Stream::h2d, *ev);
    dev->stream_wait_event(Stream::d2h, *ev);
    dev->memset_zero(a, 4096, Stream::d2h);
    // no synchronize: the event goes first (with tasks on it still queued, as cudaEventDestroy
    // allows), then the device, whose destructor drains every stream, dropping the errors
  });
  CHECK(finished);
}

TEST_CASE("an arena allocation fails as out of budget under STRATA_FAULT=alloc@arena-alloc", "[device][task-faults]") {
  auto dev = device_create(DeviceOptions{});
  FaultScope fault("alloc@arena-alloc:2");
  void* first = dev->alloc(64, "first");
  try {
    dev->alloc(64, "second");
    FAIL("the second allocation did not fail");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::budget);
    CHECK_THAT(std::string(e.what()), Catch::Contains("exhausted allocating second"));
  }
  void* third = dev->alloc(64, "third");  // fires once
  dev->free(first);
  dev->free(third);
  CHECK(dev->used_bytes() == 0);
}

TEST_CASE("pinned host memory fails as the allocator would under STRATA_FAULT=alloc@host-alloc", "[device][task-faults]") {
  auto dev = device_create(DeviceOptions{});
  FaultScope fault("alloc@host-alloc");
  try {
    dev->alloc_pinned(1 << 20);
    FAIL("the allocation did not fail");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::budget);
    CHECK_THAT(std::string(e.what()), Catch::Contains("pinned host memory"));
  }
  void* p = dev->alloc_pinned(1 << 20);
  CHECK(p != nullptr);
  dev->free_pinned(p);
}

TEST_CASE("the start-up thread check fails as exit 3 naming device.cpu_threads and the ulimits", "[device][task-faults]") {
  // a count above any this process has checked, so that the check runs; the fault stops it at
  // its second thread (had it not fired, this would start 512 threads here)
  const int keep = cpu_threads_count(), big = 512;
  cpu_threads_set(big);
  {
    FaultScope fault("thread@thread-start:2");
    try {
      cpu_threads_start();
      FAIL("the thread check passed");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::budget);
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("thread 2 of the"));
      CHECK_THAT(what, Catch::Contains("Resource temporarily unavailable"));
      CHECK_THAT(what, Catch::Contains("device.cpu_threads (now " + std::to_string(big) + ")"));
      CHECK_THAT(what, Catch::Contains("ulimit -v"));
      CHECK_THAT(what, Catch::Contains("ulimit -u"));
    }
  }
  cpu_threads_set(keep);
}

}  // namespace strata

namespace strata {
TEST_CASE("the cpu backend's attention takes a sliding window: 1 sees only itself, one as long as T changes nothing", "[device]") {
  auto dev = device_create(DeviceOptions{});
  const int64_t T = 5, D = 8, n = T * D;  // B 1, H = Hk = 1
  auto buf = [&](const char* what) { return static_cast<float*>(dev->alloc(sizeof(float) * size_t(n), what)); };
  float *q = buf("q"), *k = buf("k"), *v = buf("v"), *out = buf("out"), *wide = buf("wide"), *full = buf("full");
  float* lse = static_cast<float*>(dev->alloc(sizeof(float) * size_t(T), "lse"));
  for (int64_t i = 0; i < n; ++i) q[i] = 0.1f * float(i % 7) - 0.3f, k[i] = 0.05f * float(i % 11), v[i] = float(i) - 3.f;
  const float scale = 1.f / std::sqrt(float(D));
  dev->attention_forward(out, lse, q, k, v, nullptr, 1, T, 1, 1, D, scale, DType::f32, Stream::compute, 1);
  dev->attention_forward(wide, lse, q, k, v, nullptr, 1, T, 1, 1, D, scale, DType::f32, Stream::compute, T);
  dev->attention_forward(full, lse, q, k, v, nullptr, 1, T, 1, 1, D, scale, DType::f32, Stream::compute, 0);
  dev->stream_synchronize(Stream::compute);
  for (int64_t i = 0; i < n; ++i) {
    CHECK(out[i] == Approx(v[i]).margin(1e-6));  // the softmax over one key is 1
    CHECK(wide[i] == full[i]);                    // a window of T keys is the causal mask
  }
  CHECK(out[n - 1] != full[n - 1]);  // and a window of 1 did narrow the last query's keys
  for (float* p : {q, k, v, out, wide, full, lse}) dev->free(p);
}
}  // namespace strata
