// cuemu_control.h - the test-facing knobs of cuemu, strata's CPU emulator of CUDA (tools/cuemu).
//
// Plain C++ (no CUDA qualifiers), so host-side tests include it next to <cuda_runtime_api.h>.
// Every knob has an environment variable, read once at start-up; tests may override them with
// cuemu_set_options() between launches (not while work is in flight).
//   CUEMU_THREADS=1     one OS thread per CUDA thread (ThreadSanitizer sees races); default: fibers
//   CUEMU_SEED=N        seeds block-order shuffling and stream delays (default 1)
//   CUEMU_SHUFFLE=0     run blocks in launch order instead of a seeded shuffle
//   CUEMU_DELAY_US=N    each stream op waits a random 0..N µs first (default 50; 0 = off)
//   CUEMU_HAZARD=record record pinned-buffer hazards and carry on (default: report and abort)
//   CUEMU_DEVICES=N     cudaGetDeviceCount reports N (0: no GPU); read at each call, as is CUEMU_DRIVER
//   CUEMU_DRIVER=N      cudaDriverGetVersion reports N (e.g. 11080 emulates an old driver)
//   CUEMU_MEM_MIB=N     emulated device memory; cudaMalloc beyond it fails (default 81559, an H100)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cuemu {

enum class Executor { fibers, threads };
enum class HazardPolicy { abort_process, record };

struct Options {
  Executor executor = Executor::fibers;
  uint64_t seed = 1;
  bool shuffle_blocks = true;
  int max_delay_us = 50;
  HazardPolicy hazard_policy = HazardPolicy::abort_process;
  bool check_pointer_args = true;  // a kernel pointer argument must be device, pinned or null
};

Options cuemu_get_options();
void cuemu_set_options(const Options& options);

// A host access to a pinned buffer while an async copy using it was in flight.
struct Hazard {
  uintptr_t address = 0;        // the faulting host address
  uintptr_t buffer = 0;         // start of the pinned allocation / registration holding it
  size_t offset = 0;            // address - buffer
  bool host_wrote = false;      // the host access was a write (else a read)
  bool copy_to_host = false;    // the copy in flight was device->host (else host->device)
};
// Hazards seen so far under HazardPolicy::record; taking them clears the list.
std::vector<Hazard> cuemu_take_hazards();

// Bytes of emulated device memory currently allocated by cudaMalloc.
size_t cuemu_device_bytes_in_use();

}  // namespace cuemu
