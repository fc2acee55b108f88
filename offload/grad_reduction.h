// The gradient-reduction seam: called where a gradient lands, before it is added into the
// host accumulation — on the device for every layer, lm_head chunk and the final norm (just
// before the copy to the host), and on the host for the embedding (just after its scatter).
//
// Today: a single process, nothing to reduce. Next: data parallel all-reduces each gradient
// across ranks here (bucketed, overlapped with the rest of the backward).
#pragma once
#include <cstdint>

#include "src/device/device.h"

namespace strata {

class GradReduction {
 public:
  virtual ~GradReduction() = default;
  // grad (n f32, device) was written on stream s; reduce it in place on s.
  virtual void device_grad(float* grad, int64_t n, Device& dev, Stream s) = 0;
  // grad (n f32, host) was just accumulated on the host queue; reduce it in place.
  virtual void host_grad(float* grad, int64_t n) = 0;
};

class NoGradReduction final : public GradReduction {
 public:
  void device_grad(float*, int64_t, Device&, Stream) override {}
  void host_grad(float*, int64_t) override {}
};

}  // namespace strata
