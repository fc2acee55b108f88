// QLoRA on the CUDA backend (offload/state/nf4_layout.h): the Device op nf4_dequantize (bf16, and
// the bf16 values widened to f32) against the CPU backend's, and the engine's NF4 base against the
// fp64 PEFT + bitsandbytes goldens, the CPU backend and a plain base of the dequantized weights.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/nf4.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/offload/qlora_testing.h"
#include "tests/seeded_inputs.h"

namespace strata {

TEST_CASE("cuda Device::nf4_dequantize equals the CPU backend's bits, bf16 and f32", "[cuda-emu][qlora][nf4]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  for (int64_t n : {int64_t(1), int64_t(17), int64_t(129), int64_t(4097), int64_t(70001)}) {
    std::vector<float> x = random_floats(size_t(n), uint64_t(n) + 9, -1.f, 1.f);
    if (n > 200) x[150] = 50.f;  // an outlier block
    const int64_t blocks = cpu::nf4_blocks(n);
    std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(n))), q(static_cast<size_t>(blocks));
    std::vector<float> absmax(static_cast<size_t>(blocks)), absmax2(size_t(cpu::nf4_nested_blocks(n)));
    float offset = 0;
    cpu::nf4_quantize(codes.data(), absmax.data(), x.data(), n);
    cpu::nf4_double_quantize(q.data(), absmax2.data(), &offset, absmax.data(), blocks, 1);
    // shift 1: the output one weight past an aligned address (the kernel's one-weight stores; not
    // on the largest size, which the TSan suite runs with a thread per CUDA thread)
    const std::vector<size_t> shifts = n > 4097 ? std::vector<size_t>{0} : std::vector<size_t>{0, 1};
    for (bool dq : {false, true})
      for (DType t : {DType::bf16, DType::f32})
        for (size_t shift : shifts) {
          INFO("n " << n << " double quantization " << dq << " " << dtype_name(t) << " shift " << shift);
          const std::vector<float>& scales = dq ? absmax2 : absmax;
          std::vector<std::vector<char>> out;
          for (Device* dev : {cpu.get(), cuda.get()}) {
            cuda_testing::Buffer<uint8_t> d_codes(*dev, codes), d_q(*dev, q);
            cuda_testing::Buffer<float> d_scales(*dev, scales);
            cuda_testing::Buffer<float> d_w(*dev, size_t(n) + 1);  // f32-sized: room for either type
            char* w = reinterpret_cast<char*>(d_w.get()) + shift * dtype_size(t);
            dev->nf4_dequantize(w, t, d_codes, dq ? d_q.get() : nullptr, d_scales, offset, n, Stream::compute);
            dev->synchronize();
            std::vector<char> host(size_t(n) * dtype_size(t));
            dev->copy_d2h(host.data(), w, host.size(), Stream::compute);
            dev->synchronize();
            out.push_back(std::move(host));
          }
          CHECK(out[0] == out[1]);
          if (t == DType::f32) {  // the bf16 values, widened
            std::vector<bf16> b(static_cast<size_t>(n));
            cpu::nf4_dequantize_bf16(b.data(), codes.data(), dq ? q.data() : nullptr, scales.data(), offset, n);
            for (int64_t i = 0; i < n; ++i) {
              float f;
              std::memcpy(&f, out[1].data() + 4 * i, 4);
              REQUIRE(f == bf16_to_f32(b[size_t(i)]));
            }
          }
        }
  }
}

TEST_CASE("QLoRA on the CUDA backend: adapter gradients match the goldens, the CPU backend and the dequantized base",
          "[cuda-emu][qlora]") {
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  using testing::QloraBase;
  for (const char* name : {"llama", "qwen3"}) {
    INFO(name);
    const testing::QloraStep on_cuda = testing::qlora_step(*cuda, name, DType::f32, QloraBase::nf4);
    const testing::QloraStep on_cpu = testing::qlora_step(*cpu, name, DType::f32, QloraBase::nf4);
    const double err = testing::qlora_golden_error(on_cuda, name, "grads.safetensors");
    double vs_cpu = 0;
    for (size_t i = 0; i < on_cuda.grads.size(); ++i)
      vs_cpu = std::max(vs_cpu, testing::qlora_rel_l2(on_cuda.grads[i].second, on_cpu.grads[i].second.data()));
    std::printf("cuda-emu qlora %-6s loss %.9f (cpu %.9f) worst adapter grad rel L2 %.2e vs fp64 golden, %.2e vs cpu\n",
                name, on_cuda.loss, on_cpu.loss, err, vs_cpu);
    CHECK(err <= 1e-4);
    CHECK(vs_cpu <= 1e-4);
    CHECK(std::abs(on_cuda.loss - on_cpu.loss) <= 2e-6 * on_cpu.loss);
    // bf16: the NF4 base decoded on the device equals a bf16 base of its dequantized weights
    const testing::QloraStep nf4 = testing::qlora_step(*cuda, name, DType::bf16, QloraBase::nf4);
    const testing::QloraStep deq = testing::qlora_step(*cuda, name, DType::bf16, QloraBase::dequantized);
    CHECK(nf4.loss == deq.loss);
    REQUIRE(nf4.grads.size() == deq.grads.size());
    for (size_t i = 0; i < nf4.grads.size(); ++i) CHECK(nf4.grads[i].second == deq.grads[i].second);
  }
}

TEST_CASE("QLoRA on the CUDA backend for the fused and MoE families: phi3 and qwen3_moe against PEFT and bitsandbytes",
          "[cuda-emu][qlora][phi3][moe]") {
  // tests/golden/qlora_grad/{phi3,qwen3_moe} (tools/golden/make_qlora_family_goldens.py): Phi-3's
  // fused projections decoded from NF4 on the device; qwen3_moe's attention NF4, its experts bf16
  auto cuda = cuda_testing::test_device();
  if (!cuda) return;
  auto cpu = device_create(DeviceOptions{});
  using testing::QloraBase;
  for (const char* name : {"phi3", "qwen3_moe"}) {
    INFO(name);
    const testing::QloraStep on_cuda = testing::qlora_step(*cuda, name, DType::f32, QloraBase::nf4);
    const testing::QloraStep on_cpu = testing::qlora_step(*cpu, name, DType::f32, QloraBase::nf4);
    const double err = testing::qlora_golden_error(on_cuda, name, "grads.safetensors");
    double vs_cpu = 0;
    for (size_t i = 0; i < on_cuda.grads.size(); ++i)
      vs_cpu = std::max(vs_cpu, testing::qlora_rel_l2(on_cuda.grads[i].second, on_cpu.grads[i].second.data()));
    const double want = nlohmann::json::parse(testing::read_file(testing::source_path("tests/golden/qlora_grad/") + name +
                                                                 "/expected.json"))["loss"].get<double>();
    std::printf("cuda-emu qlora %-9s loss %.9f (cpu %.9f, golden %.9f) worst adapter grad rel L2 %.2e vs fp64 golden, "
                "%.2e vs cpu\n", name, on_cuda.loss, on_cpu.loss, want, err, vs_cpu);
    CHECK(err <= 1e-4);
    CHECK(vs_cpu <= 1e-4);
    CHECK(std::abs(on_cuda.loss - want) <= 2e-6 * want);
  }
}

}  // namespace strata
