// Scratch the CPU kernels keep on a thread from one call to the next (attention's bf16 inputs and
// kept dS, the lm_head loss's row tiles): vectors that only grow, and then to exactly what the
// call asks, so what a thread holds is the largest call's (kernels/cpu/ops.h, *_scratch_bytes),
// not a growth policy's multiple of it.
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace strata::cpu {

// An allocator whose blocks start on a 64-byte line. AMX tile loads read 64-byte rows: from a
// block that malloc placed 16 bytes past a line every row straddles two lines, and on an AMX VM
// (Emerald Rapids, 2 vCPUs) strata's 2 x 2 GEMM loop took ~49 cycles per TDPBF16PS from such a
// buffer against ~18 from an aligned one, the same data interleaved in one process.
template <class T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kLine{64};
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kLine)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kLine); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const { return true; }
};

// Scratch whose data starts on a 64-byte line (what the AMX kernels pack into).
template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;

// v holds at least n elements afterwards; when it grows, to exactly n.
template <class T, class A>
T* scratch_grow(std::vector<T, A>& v, size_t n) {
  if (v.size() < n) {
    v.reserve(n);
    v.resize(n);
  }
  return v.data();
}

}  // namespace strata::cpu
