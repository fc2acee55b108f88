// Backend selection, the bookkeeping both backends share (the device arena, pinned host
// allocations that fell back to pageable memory) and the byte/bandwidth parsers used by recipes.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "src/core/error.h"
#include "src/core/tensor.h"
#include "src/core/threads.h"
#include "src/device/device.h"

#include "src/device/arena.h"
#include "kernels/common/ce_workspace.h"
#include "kernels/cpu/ops.h"

namespace strata {

std::unique_ptr<Device> device_create_cpu(const DeviceOptions& options);
#ifdef STRATA_HAVE_CUDA
std::unique_ptr<Device> device_create_cuda(const DeviceOptions& options);  // cuda_device.cpp
#endif

ArenaDevice::ArenaDevice() {
  const char* fake = std::getenv("STRATA_FAKE_PINNED_FAIL");
  pinned_fail_forced_ = fake && std::string(fake) == "1";
}
ArenaDevice::~ArenaDevice() = default;

void* ArenaDevice::pageable_fallback_alloc(size_t bytes, const std::string& why) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded);
  STRATA_CHECK_BUDGET(p, "cannot allocate ", format_bytes(bytes), " of host memory (pinning it failed: ",
                      why, ", and pageable memory is exhausted too); lower the host memory the "
                      "recipe needs (a smaller model, micro_batch_size or sequence_len)");
  {
    std::lock_guard lock(arena_mu_);
    pageable_[p] = bytes;
    pageable_bytes_ += bytes;
  }
  pageable_warning(bytes, why);
  return p;
}

void ArenaDevice::pageable_warning(size_t bytes, const std::string& why) {
  std::lock_guard lock(arena_mu_);
  if (!pageable_warned_) {
    pageable_warned_ = true;
    std::fprintf(stderr,
                 "strata: warning: cannot pin %s of host memory (%s); using pageable memory for it "
                 "instead. Copies between pageable memory and the device are staged by the driver "
                 "through its own pinned buffer: they typically run at about half the bandwidth and "
                 "block the host thread, so streaming overlaps less and steps get slower. Further "
                 "fallbacks are not repeated here; they are counted as host (not pinned) bytes.\n",
                 format_bytes(bytes).c_str(), why.c_str());
  }
}

bool ArenaDevice::pageable_fallback_free(void* p) {
  {
    std::lock_guard lock(arena_mu_);
    auto it = pageable_.find(p);
    if (it == pageable_.end()) return false;
    pageable_bytes_ -= it->second;
    pageable_.erase(it);
  }
  std::free(p);
  return true;
}

bool ArenaDevice::host_is_pinned(const void* p) const {
  std::lock_guard lock(arena_mu_);
  return pageable_.find(p) == pageable_.end();
}

size_t ArenaDevice::pageable_fallback_bytes() const {
  std::lock_guard lock(arena_mu_);
  return pageable_bytes_;
}

void ArenaDevice::arena_init(char* base, size_t bytes) {
  arena_ = std::make_unique<Arena>(base, bytes, "device");
}
char* ArenaDevice::arena_alloc(size_t bytes, const std::string& tensor) {
  std::lock_guard lock(arena_mu_);
  return arena_->alloc(bytes, tensor);
}
void ArenaDevice::free(void* p) {
  std::lock_guard lock(arena_mu_);
  arena_->free(p);
}
size_t ArenaDevice::budget_bytes() const { return arena_->budget_bytes(); }
size_t ArenaDevice::used_bytes() const {
  std::lock_guard lock(arena_mu_);
  return arena_->used_bytes();
}
size_t ArenaDevice::peak_bytes() const {
  std::lock_guard lock(arena_mu_);
  return arena_->peak_bytes();
}
void ArenaDevice::reset_peak() {
  std::lock_guard lock(arena_mu_);
  arena_->reset_peak();
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::matmul: return "matmul";
    case OpKind::attention: return "attention";
    case OpKind::cross_entropy: return "cross_entropy";
    case OpKind::norm: return "norm";
    case OpKind::rope: return "rope";
    case OpKind::elementwise: return "elementwise";
    case OpKind::embedding: return "embedding";
    case OpKind::count: break;
  }
  return "?";
}

std::unique_ptr<Device> device_create(const DeviceOptions& options) {
  if (options.backend != DeviceBackend::cuda) return device_create_cpu(options);  // cpu, and auto
#ifdef STRATA_HAVE_CUDA
  return device_create_cuda(options);
#else
  STRATA_CHECK(false, "device backend 'cuda' is not built into this strata (configure with "
               "-DSTRATA_CUDA=ON on a machine with the CUDA Toolkit); use [device] backend = \"cpu\"");
  return nullptr;
#endif
}

size_t cuda_backend_workspace_bytes(int64_t c, int64_t vc) {
  return Arena::footprint(kCudaCublasWorkspaceBytes) + Arena::footprint(lm_head_ce_tile_workspace_bytes(c, vc));
}

const char* cpu_backend_attention_kernel() { return cpu::attention_isa_name(cpu::attention_isa_active()); }

size_t cpu_backend_scratch_bytes(const CpuScratchShape& s, int threads) {
  // the GEMMs' longest sum: hidden, heads x head dim, intermediate, tokens (weight gradients),
  // or a vocab chunk (the loss's d(hidden))
  const int64_t k_max = std::max({s.c, s.h * s.d, s.f, s.b * s.t, s.vc});
  return cpu::attention_scratch_bytes(s.b, s.t, s.h, s.hk, s.d, s.dtype, cpu::attention_isa_active()) +
         cpu::lm_head_ce_scratch_bytes(s.b * s.t, s.c, s.vc, s.dtype) +
         size_t(threads > 0 ? threads : cpu_threads_count()) * cpu::matmul_scratch_bytes(k_max, s.dtype);
}

}  // namespace strata
