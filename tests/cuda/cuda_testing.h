// Helpers of the CUDA backend tests (tests/cuda): the device under test and typed buffers.
// The same test sources build twice: under the CPU emulator (strata_cuda_emu_tests, g++ with
// tools/cuemu/cuemu.h force-included, STRATA_CUEMU defined), where the CUDA device always
// exists, and against the real CUDA runtime (strata_cuda_tests), where on a machine without a
// GPU every case that asks for the device is reported skipped: the process exits with
// kSkipExitCode, which ctest (one process per case, SKIP_RETURN_CODE in kernels/cuda/cuda.cmake)
// counts as skipped, never as passed.
#pragma once
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/device/device.h"
#include "tests/testing.h"

namespace strata {

std::unique_ptr<Device> device_create_cuda(const DeviceOptions& options);  // cuda_device.cpp

namespace cuda_testing {

// The exit code of a case skipped for want of a GPU (automake's convention).
constexpr int kSkipExitCode = 77;

// The CUDA device. On a machine without a usable GPU (real runtime only) the test process
// ends here with kSkipExitCode after saying why; callers keep their `if (!dev) return;` guard.
inline std::unique_ptr<Device> test_device(size_t memory_bytes = size_t(96) << 20) {
  DeviceOptions o;
  o.backend = DeviceBackend::cuda;
  o.memory_bytes = memory_bytes;
#if defined(STRATA_CUEMU)
  return device_create_cuda(o);
#else
  try {
    return device_create_cuda(o);
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "SKIPPED: no usable CUDA GPU: %s\n", e.what());
    std::exit(kSkipExitCode);
  }
#endif
}

// A device buffer of n elements of T, filled from / read into host vectors synchronously.
template <class T>
class Buffer {
 public:
  Buffer(Device& dev, size_t n, const std::string& name = "test buffer")
      : dev_(dev), n_(n), p_(static_cast<T*>(dev.alloc(std::max<size_t>(n, 1) * sizeof(T), name))) {}
  Buffer(Device& dev, const std::vector<T>& host, const std::string& name = "test buffer")
      : Buffer(dev, host.size(), name) {
    upload(host);
  }
  ~Buffer() { dev_.free(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* get() const { return p_; }
  operator T*() const { return p_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    if (n_ == 0) return;
    dev_.copy_h2d(p_, host.data(), n_ * sizeof(T), Stream::compute);
    dev_.stream_synchronize(Stream::compute);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    dev_.synchronize();
    if (n_ == 0) return host;
    dev_.copy_d2h(host.data(), p_, n_ * sizeof(T), Stream::compute);
    dev_.stream_synchronize(Stream::compute);
    return host;
  }

 private:
  Device& dev_;
  size_t n_;
  T* p_;
};

}  // namespace cuda_testing

// The names the CUDA test files use unqualified: device buffers, and the host-side inputs and
// error measures of tests/testing.h.
using cuda_testing::Buffer;
using testing::convert;
using testing::max_rel_error;
using testing::random_floats;

}  // namespace strata
