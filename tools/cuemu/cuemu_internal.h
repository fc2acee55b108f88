// cuemu_internal.h - what the parts of the cuemu library (executor, runtime, pinned-memory hazard
// detector, cuBLAS) share; not for kernels or tests.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "tools/cuemu/cuemu_control.h"

namespace cuemu::detail {

// Options as currently set (environment at start-up, then cuemu_set_options).
const Options& options_current();

// printf-style message to stderr, prefixed "cuemu: ".
void report(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Records an error for the calling host thread's cudaGetLastError and returns it.
cudaError_t set_last_error(cudaError_t e);

// Queues `op` on stream `s` (0 / cudaStreamLegacy: runs it now, after all queued work).
// Returns cudaErrorInvalidResourceHandle for a destroyed or unknown stream.
cudaError_t stream_submit(cudaStream_t s, std::function<void()> op);
bool stream_known(cudaStream_t s);

// Memory kinds, by address.
bool is_device_range(const void* p, size_t bytes);  // inside one live cudaMalloc allocation
bool is_pinned_range(const void* p, size_t bytes);  // inside one cudaMallocHost / cudaHostRegister range

// Pinned-buffer hazard detector (cuemu_pinned.cpp). copy_begin protects the pages of an in-flight
// copy's host side from the host (write-protect for a host->device source, no access for a
// device->host destination); copy_end lifts it. While protected, the copy engine reaches the bytes
// through pinned_read / pinned_write, which bypass page protection.
struct PinnedCopy {
  int slot = -1;
};
PinnedCopy pinned_copy_begin(const void* host, size_t bytes, bool copy_to_host);
void pinned_copy_end(PinnedCopy c);
void pinned_read(void* dst, const void* pinned_src, size_t bytes);
void pinned_write(void* pinned_dst, const void* src, size_t bytes);
void pinned_register(void* p, size_t bytes);
bool pinned_unregister(void* p);  // false: not a registered range

// Largest dynamic shared memory a launch of `kernel` may ask for (48 KiB unless raised by
// cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)).
size_t kernel_max_dynamic_smem(const void* kernel);

inline constexpr size_t kDefaultDynamicSmemBytes = 48 * 1024;
inline constexpr size_t kOptInDynamicSmemBytes = 232448;  // 227 KiB, sm_90

}  // namespace cuemu::detail
