// strata-bench attention: the device's causal GQA attention, forward and backward, through the
// Device interface (src/device/device.h) as a training step runs it: q, k, v, dout in f32, read
// as bf16 (dot_type bf16), f32 accumulation and softmax. Times each at every --tokens size and
// reports TFLOP/s counted as FlashAttention's benchmarks count them (the useful products of a
// causal mask: forward 4·B·H·T²·D / 2, backward 2.5 × that), so the figures compare with
// torch's scaled_dot_product_attention timed the same way (scripts/gpu_scale.py sdpa). With
// --gemm N, also the device's bf16 GEMM rate on an N³ product, the ceiling to read them against.
// Runs on the CPU backend too, at small sizes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>
#include <nlohmann/json.hpp>

#include "src/core/cli_args.h"
#include "src/core/error.h"
#include "src/recipe/recipe.h"
#include "src/recipe/recipe_modes.h"
#include "tools/bench/bench_util.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct AttentionShape {
  int64_t b = 1, t = 0, h = 32, hk = 8, d = 128;
  size_t q_count() const { return size_t(b * t * h * d); }    // q, out, dout, dq: (B,T,H,D)
  size_t kv_count() const { return size_t(b * t * hk * d); }  // k, v, dk, dv: (B,T,Hk,D)
  size_t lse_count() const { return size_t(b * t * h); }      // lse: (B,T,H)
  size_t bytes() const { return (4 * q_count() + 4 * kv_count() + lse_count()) * sizeof(float); }
  // Useful FLOPs of the causal forward: QK^T and PV over the lower triangle.
  double forward_flops() const { return 4.0 * double(b * h * d) * double(t) * double(t) / 2; }
  double backward_flops() const { return 2.5 * forward_flops(); }  // dV, dP, dQ, dK: 5 products vs 2
};

struct AttentionTiming {
  double forward_s = 0, backward_s = 0;  // medians
};

// The median forward and backward time over `reps` timed calls after one warm-up of each.
AttentionTiming time_attention(Device& dev, const AttentionShape& sh, int reps) {
  std::vector<float*> owned;
  auto upload = [&](size_t count, uint64_t seed, const char* name) {
    auto* p = static_cast<float*>(dev.alloc(count * sizeof(float), name));
    const std::vector<float> noise = bench_noise_floats(count, seed);
    dev.copy_h2d(p, noise.data(), count * sizeof(float), Stream::compute);
    dev.stream_synchronize(Stream::compute);
    owned.push_back(p);
    return p;
  };
  auto scratch = [&](size_t count, const char* name) {
    auto* p = static_cast<float*>(dev.alloc(count * sizeof(float), name));
    owned.push_back(p);
    return p;
  };
  const float* q = upload(sh.q_count(), 11, "bench attention q");      // (B,T,H,D)
  const float* k = upload(sh.kv_count(), 12, "bench attention k");     // (B,T,Hk,D)
  const float* v = upload(sh.kv_count(), 13, "bench attention v");     // (B,T,Hk,D)
  const float* dout = upload(sh.q_count(), 14, "bench attention dout");  // (B,T,H,D)
  float* out = scratch(sh.q_count(), "bench attention out");   // (B,T,H,D)
  float* lse = scratch(sh.lse_count(), "bench attention lse");  // (B,T,H)
  float* dq = scratch(sh.q_count(), "bench attention dq");     // (B,T,H,D)
  float* dk = scratch(sh.kv_count(), "bench attention dk");    // (B,T,Hk,D)
  float* dv = scratch(sh.kv_count(), "bench attention dv");    // (B,T,Hk,D)
  const float scale = 1.f / std::sqrt(float(sh.d));
  auto timed = [&](auto&& op) {
    dev.stream_synchronize(Stream::compute);
    const auto t0 = Clock::now();
    op();
    dev.stream_synchronize(Stream::compute);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto forward = [&] {
    dev.attention_forward(out, lse, q, k, v, nullptr, sh.b, sh.t, sh.h, sh.hk, sh.d, scale, DType::bf16,
                          Stream::compute);
  };
  auto backward = [&] {
    dev.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, nullptr, sh.b, sh.t, sh.h, sh.hk, sh.d, scale,
                           DType::bf16, Stream::compute);
  };
  timed(forward);  // warm-up: module load, first-touch of the buffers
  timed(backward);
  std::vector<double> f, bw;
  for (int r = 0; r < reps; ++r) {  // interleaved, as a step runs them
    f.push_back(timed(forward));
    bw.push_back(timed(backward));
  }
  // Every output written and finite: a kernel that skipped work would time fast.
  std::vector<float> check(sh.q_count());
  dev.copy_d2h(check.data(), dq, check.size() * sizeof(float), Stream::compute);
  dev.stream_synchronize(Stream::compute);
  STRATA_ASSERT(std::all_of(check.begin(), check.end(), [](float x) { return std::isfinite(x); }),
                "attention backward wrote a non-finite dq on random inputs");
  for (auto it = owned.rbegin(); it != owned.rend(); ++it) dev.free(*it);
  return {bench_median(f), bench_median(bw)};
}

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> sizes;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const long long t = std::strtoll(item.c_str(), &end, 10);
    STRATA_CHECK(end && *end == '\0' && t >= 1, "--tokens takes sizes separated by commas (4096,8192); got '",
                 list, "'");
    sizes.push_back(t);
  }
  STRATA_CHECK(!sizes.empty(), "--tokens needs at least one size");
  return sizes;
}

}  // namespace

int bench_attention(const std::vector<std::string>& args) {
  CLI::App app{"The device's causal GQA attention forward + backward (bf16 dots), TFLOP/s", "strata-bench attention"};
  std::string backend = "cpu", tokens = "512,1024", memory = "auto";
  AttentionShape shape;
  int reps = 5;
  int64_t gemm = 0;
  app.add_option("--backend", backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--tokens", tokens, "sequence lengths T, separated by commas");
  app.add_option("--batch", shape.b, "rows B");
  app.add_option("--heads", shape.h, "query heads H");
  app.add_option("--kv-heads", shape.hk, "key/value heads Hk (divides H)");
  app.add_option("--head-dim", shape.d, "head size D");
  app.add_option("--reps", reps, "timed forward + backward pairs per size (the median is reported)");
  app.add_option("--gemm", gemm, "also the bf16 GEMM rate on an N x N x N product (0: not measured)");
  app.add_option("--device-memory", memory, "device arena budget (auto: what the largest size needs)");
  int rc = 0;
  if (!parse_args(app, args, &rc)) return rc;  // 0 after --help, 2 on bad usage
  STRATA_CHECK(shape.b >= 1 && shape.h >= 1 && shape.hk >= 1 && shape.d >= 1, "--batch, --heads, --kv-heads and "
               "--head-dim must be positive");
  STRATA_CHECK(shape.h % shape.hk == 0, "--kv-heads must divide --heads (", shape.h, " query heads, ", shape.hk,
               " kv heads)");
  STRATA_CHECK(reps >= 1, "--reps must be at least 1");
  STRATA_CHECK(gemm >= 0, "--gemm must be 0 or a size");
  const std::vector<int64_t> sizes = parse_sizes(tokens);

  DeviceOptions dopt;
  dopt.backend = device_backend_parse(backend);
  if (memory == "auto") {  // the largest size's buffers or the GEMM's, plus the backend's own workspace
    AttentionShape largest = shape;
    largest.t = *std::max_element(sizes.begin(), sizes.end());
    const size_t gemm_bytes = size_t(gemm * gemm) * (2 * sizeof(bf16) + sizeof(float));
    dopt.memory_bytes = std::max(largest.bytes(), gemm_bytes) + (size_t(64) << 20);
  } else {
    dopt.memory_bytes = parse_bytes(memory, "--device-memory");
  }
  auto dev = device_create(dopt);

  std::printf("strata-bench attention (%s: %s): causal, B %ld, H %ld, Hk %ld, D %ld, bf16 dots on f32 inputs, "
              "f32 accumulation\n", backend.c_str(), dev->name().c_str(), long(shape.b), long(shape.h),
              long(shape.hk), long(shape.d));
  std::printf("  %8s %12s %12s %12s %10s %10s %10s\n", "T", "forward s", "backward s", "fwd+bwd s", "fwd TF/s",
              "bwd TF/s", "f+b TF/s");
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t t : sizes) {
    AttentionShape sh = shape;
    sh.t = t;
    const AttentionTiming r = time_attention(*dev, sh, reps);
    const double both_s = r.forward_s + r.backward_s;
    const double f_tf = sh.forward_flops() / r.forward_s / 1e12, b_tf = sh.backward_flops() / r.backward_s / 1e12;
    const double fb_tf = (sh.forward_flops() + sh.backward_flops()) / both_s / 1e12;
    std::printf("  %8ld %12.5f %12.5f %12.5f %10.2f %10.2f %10.2f\n", long(t), r.forward_s, r.backward_s, both_s,
                f_tf, b_tf, fb_tf);
    rows.push_back({{"t", t}, {"forward_s", r.forward_s}, {"backward_s", r.backward_s}, {"fwd_bwd_s", both_s},
                    {"forward_tflops", f_tf}, {"backward_tflops", b_tf}, {"fwd_bwd_tflops", fb_tf},
                    {"fwd_bwd_flops", sh.forward_flops() + sh.backward_flops()}});
  }
  double gemm_flops = 0;
  if (gemm > 0) {
    gemm_flops = bench_gemm_flops(*dev, gemm);
    std::printf("  bf16 GEMM %ld^3 on random operands: %.1f TFLOP/s\n", long(gemm), gemm_flops / 1e12);
  }
  nlohmann::json j = {{"attention", {{"backend", backend}, {"device", dev->name()}, {"batch", shape.b},
                                     {"heads", shape.h}, {"kv_heads", shape.hk}, {"head_dim", shape.d},
                                     {"dtype", "bf16"}, {"causal", true}, {"reps", reps}, {"sizes", rows},
                                     {"gemm_n", gemm}, {"gemm_flops_per_s", gemm_flops}}}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace strata::bench
