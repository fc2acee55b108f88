// The NCCL comm (src/comm/comm_nccl.cpp) with its ranks as threads of this process, each with its
// own CUDA device: under the emulator (strata_cuda_emu_tests, tools/cuemu/cuemu_nccl.cpp) always;
// against real NCCL (strata_cuda_tests) when the machine has a GPU per rank, else skipped.
#if defined(STRATA_TEST_NCCL)
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>

#include "src/comm/comm_nccl.h"
#include "tools/comm/comm_inputs.h"
#include "tests/cuda/cuda_testing.h"

using namespace strata;
using strata::cuda_testing::Buffer;

namespace {

using comm_testing::input;
using comm_testing::mix;

// Runs body(rank, device, comm) on `n` threads, one rank each; returns each rank's error text
// ("" when it returned normally). Null when the machine cannot host n ranks (real GPUs only).
std::unique_ptr<std::vector<std::string>> run_ranks(
    int n, double timeout_s, const std::function<void(int, Device&, Comm&)>& body) {
#if !defined(STRATA_CUEMU)
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < n) {
    WARN("skipped: " << n << " NCCL ranks need " << n << " GPUs, this machine has " << gpus);
    return nullptr;
  }
#endif
  const CommNcclId id = comm_nccl_unique_id();
  auto errors = std::make_unique<std::vector<std::string>>(size_t(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
#if !defined(STRATA_CUEMU)
        cudaSetDevice(r);
#endif
        std::unique_ptr<Device> dev = cuda_testing::test_device(size_t(64) << 20);
        std::unique_ptr<Comm> comm = comm_create_nccl(*dev, r, n, r, id, timeout_s);
        body(r, *dev, *comm);
      } catch (const std::exception& e) {
        (*errors)[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("nccl comm: all-reduce of awkward sizes, scalars, broadcast and barrier, 2 and 3 ranks",
          "[cuda][comm]") {
  const size_t sizes[] = {1, 17, 4097, (size_t(1) << 20) + 3};
  for (int n : {2, 3}) {
    CAPTURE(n);
    // results[rank][k]: rank's f32 all-reduce of sizes[k]; scalars, broadcast bytes per rank
    std::vector<std::vector<std::vector<float>>> results{size_t(n)};
    std::vector<std::vector<double>> scalars{size_t(n)};
    std::vector<std::vector<unsigned char>> bcast{size_t(n)};
    std::vector<std::string> identity{size_t(n)};
    auto errors = run_ranks(n, 60, [&](int r, Device& dev, Comm& comm) {
      identity[size_t(r)] = str_cat(comm.name(), " ", comm.rank(), "/", comm.size(), " local ",
                                    comm.local_rank(), " device_buffers ", comm.device_buffers());
      std::vector<std::unique_ptr<Buffer<float>>> bufs;
      std::vector<CommTicket> tickets;
      for (size_t k = 0; k < std::size(sizes); ++k) {
        // input = a + b with b added on the device stream right before the all-reduce (no host
        // sync): the collective must run after the work already queued on its stream.
        std::vector<float> a(sizes[k]), b(sizes[k]);
        for (size_t i = 0; i < a.size(); ++i) {
          a[i] = input<float>(r, i, k);
          b[i] = a[i];
          a[i] = 0.0f;
        }
        bufs.push_back(std::make_unique<Buffer<float>>(dev, a));
        Buffer<float> addend(dev, b);
        dev.add_inplace(*bufs.back(), addend, int64_t(sizes[k]), Stream::compute);
        tickets.push_back(comm.all_reduce_sum(bufs.back()->get(), sizes[k], Stream::compute));
        dev.stream_synchronize(Stream::compute);  // addend is freed at the end of this scope
      }
      for (auto& t : tickets) t.wait();
      for (auto& buf : bufs) results[size_t(r)].push_back(buf->download());

      std::vector<double> s = {input<double>(r, 0, 9), input<double>(r, 1, 9), double(r + 1)};
      comm.all_reduce_sum(s.data(), s.size()).wait();
      scalars[size_t(r)] = s;

      std::vector<unsigned char> bytes(100003, 0xAA);
      if (r == n - 1)
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)(mix(i) & 0xff);
      Buffer<unsigned char> db(dev, bytes);
      comm.broadcast(db.get(), bytes.size(), n - 1, Stream::h2d).wait();
      bcast[size_t(r)] = db.download();
      comm.barrier();
    });
    if (!errors) return;
    std::string all_errors;
    for (int r = 0; r < n; ++r) all_errors += (*errors)[size_t(r)];
    INFO("errors: " << all_errors);
    REQUIRE(all_errors.empty());
    for (int r = 0; r < n; ++r) {
      CHECK(identity[size_t(r)] == str_cat("nccl ", r, "/", n, " local ", r, " device_buffers 1"));
    }
    for (size_t k = 0; k < std::size(sizes); ++k) {
      CAPTURE(sizes[k]);
      size_t differ_from_rank0 = 0, differ_from_serial = 0, beyond_bound = 0;
      for (size_t i = 0; i < sizes[k]; ++i) {
        float serial = input<float>(0, i, k);  // ((x0 + x1) + x2) in f32
        double exact = double(serial), mag = std::fabs(double(serial));
        for (int r = 1; r < n; ++r) {
          serial += input<float>(r, i, k);
          exact += double(input<float>(r, i, k));
          mag += std::fabs(double(input<float>(r, i, k)));
        }
        const float got = results[0][k][i];
        for (int r = 1; r < n; ++r)
          differ_from_rank0 += std::memcmp(&results[size_t(r)][k][i], &got, sizeof got) != 0;
        differ_from_serial += std::memcmp(&serial, &got, sizeof got) != 0;
        // n-1 f32 additions in any order: |error| <= (n-1) * 2^-24 * sum |x_r|
        beyond_bound += std::fabs(double(got) - exact) > (n - 1) * std::ldexp(mag, -24);
      }
      CHECK(differ_from_rank0 == 0);  // every rank holds the same bits
      CHECK(beyond_bound == 0);
      if (n == 2) CHECK(differ_from_serial == 0);  // a + b = b + a
    }
    for (int r = 0; r < n; ++r) {
      double want0 = 0, want1 = 0;
      for (int q = 0; q < n; ++q) want0 += input<double>(q, 0, 9), want1 += input<double>(q, 1, 9);
      CHECK(std::fabs(scalars[size_t(r)][0] - want0) <= 1e-15 * 4);
      CHECK(std::fabs(scalars[size_t(r)][1] - want1) <= 1e-15 * 4);
      CHECK(scalars[size_t(r)][2] == double(n * (n + 1) / 2));
      CHECK(std::memcmp(scalars[size_t(r)].data(), scalars[0].data(), 3 * sizeof(double)) == 0);
      size_t bad = 0;
      for (size_t i = 0; i < bcast[size_t(r)].size(); ++i)
        bad += bcast[size_t(r)][i] != (unsigned char)(mix(i) & 0xff);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("nccl comm: a rank that never joins a collective makes the others' wait fail within "
          "the timeout, and the comm stays failed", "[cuda][comm]") {
  std::string first, second;
  auto errors = run_ranks(2, 0.5, [&](int r, Device& dev, Comm& comm) {
    if (r == 1) return;  // rank 1 leaves without joining the all-reduce
    Buffer<float> b(dev, std::vector<float>(17, 1.0f));
    CommTicket t = comm.all_reduce_sum(b.get(), 17);
    try {
      t.wait();
    } catch (const Error& e) {
      first = e.what();
      CHECK(e.kind() == ErrorKind::io);
    }
    try {
      comm.all_reduce_sum(b.get(), 17).wait();
    } catch (const Error& e) {
      second = e.what();
    }
  });
  if (!errors) return;
  CHECK((*errors)[0].empty());
  CHECK((*errors)[1].empty());
  CHECK_THAT(first, Catch::Contains("rank 0: NCCL all-reduce #1 (17 f32) did not complete within "
                                    "0.5 s: a peer rank died or hangs"));
  CHECK(second == first);
}
#endif  // STRATA_TEST_NCCL
