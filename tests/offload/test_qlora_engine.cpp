// QLoRA on the engine (offload/state/nf4_layout.h): the packed host store (its rows, round trip and
// refusals), an NF4 base's passes against a plain base holding its dequantized weights (bit for
// bit), the adapters' gradients against the fp64 PEFT + bitsandbytes goldens
// (tools/golden/make_qlora_grad_goldens.py), layer-major accumulation, and the decoder layers'
// link and host bytes measured from the engine's counters against a bf16 LoRA run.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/cpu/nf4.h"
#include "offload/plan/plan_search.h"
#include "tests/offload/qlora_testing.h"

namespace strata {
namespace {

using testing::QloraBase;
using testing::QloraStep;
using testing::qlora_step;

void check_bit_equal(const QloraStep& a, const QloraStep& b) {
  CHECK(a.loss == b.loss);
  CHECK(a.losses == b.losses);
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    INFO(a.grads[i].first);
    CHECK(a.grads[i].second == b.grads[i].second);
  }
}

}  // namespace

TEST_CASE("an NF4 host store packs the decoder layers' linears as bitsandbytes does and unpacks them", "[qlora][nf4]") {
  auto dev = device_create(DeviceOptions{});
  const testing::Golden g = testing::Golden::load("qwen3");
  const ModelSpec plain = model_spec_build(hf_config_load(g.dir), DType::bf16);
  HostStoreOptions so;
  so.weights_only = true;
  for (bool dq : {true, false}) {
    INFO("double quantization " << dq);
    ModelSpec spec = plain;
    nf4_base_enable(spec, dq);
    HostStore store(*dev, spec, so), reference(*dev, plain, so);
    model_load_weights(store, g.dir);
    model_load_weights(reference, g.dir);
    const std::vector<bool> packed = nf4_packed_rows(spec);
    size_t packed_count = 0;
    for (size_t r = 0; r < spec.params.size(); ++r) {
      INFO(spec.params[r].name);
      const int64_t n = spec.params[r].numel();
      std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
      store.get_param(r, got.data());
      reference.get_param(r, want.data());
      CHECK((store.working_table()[r].dtype == DType::u8) == bool(packed[r]));
      if (!packed[r]) {
        CHECK(got == want);  // embeddings, norms, lm_head: the working dtype, untouched
        continue;
      }
      ++packed_count;
      CHECK(store.working_table()[r].bytes() == Nf4RowLayout::of(n, dq).bytes);
      // the kernel's quantization of the bf16 weights (bitsandbytes' bits: tests/kernels/test_nf4.cpp)
      std::vector<bf16> w(static_cast<size_t>(n)), deq(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) w[size_t(i)] = f32_to_bf16(want[size_t(i)]);
      std::vector<uint8_t> codes(size_t(cpu::nf4_code_bytes(n))), q(size_t(cpu::nf4_blocks(n)));
      std::vector<float> absmax(size_t(cpu::nf4_blocks(n))), absmax2(size_t(cpu::nf4_nested_blocks(n)));
      float offset = 0;
      cpu::nf4_quantize(codes.data(), absmax.data(), w.data(), n);
      if (dq) cpu::nf4_double_quantize(q.data(), absmax2.data(), &offset, absmax.data(), cpu::nf4_blocks(n), 1);
      cpu::nf4_dequantize_bf16(deq.data(), codes.data(), dq ? q.data() : nullptr, dq ? absmax2.data() : absmax.data(),
                               offset, n);
      for (int64_t i = 0; i < n; ++i) REQUIRE(got[size_t(i)] == bf16_to_f32(deq[size_t(i)]));
      CHECK(got != want);  // 4 bits do change them
    }
    CHECK(packed_count == 7 * spec.layers.size());
    // the device table keeps the plain layout: the engine's views of a decoded slot
    CHECK(store.device_table().tier_bytes(Tier::host_pinned) == reference.working_table().tier_bytes(Tier::host_pinned));
    CHECK(store.working_table().tier_bytes(Tier::host_pinned) < reference.working_table().tier_bytes(Tier::host_pinned));
  }
  // a packed base is frozen: a store with optimizer state is refused, naming the fix
  ModelSpec spec = plain;
  nf4_base_enable(spec, true);
  CHECK_THROWS_WITH(HostStore(*dev, spec, HostStoreOptions{}), Catch::Contains("LoRA adapters only"));
  ModelSpec f16 = model_spec_build(hf_config_load(g.dir), DType::f16);
  CHECK_THROWS_WITH(nf4_base_enable(f16, true), Catch::Contains("model.dtype = \"bf16\""));
}

TEST_CASE("an NF4 base's LoRA pass equals a plain base of its dequantized weights bit for bit", "[qlora][engine]") {
  // The device dequantizes each uploaded layer into its slot: the same weights as a bf16 (or f32)
  // store holding the NF4 round trip, so the same losses and adapter gradients to the bit.
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"llama", "qwen3"})
    for (DType dtype : {DType::bf16, DType::f32}) {
      INFO(name << " " << dtype_name(dtype));
      check_bit_equal(qlora_step(*dev, name, dtype, QloraBase::nf4), qlora_step(*dev, name, dtype, QloraBase::dequantized));
    }
  // layer-major: 3 micro-batches in one pass give the micro-batch schedule's bits
  const QloraStep mb = qlora_step(*dev, "llama", DType::bf16, QloraBase::nf4, 3, false);
  const QloraStep lm = qlora_step(*dev, "llama", DType::bf16, QloraBase::nf4, 3, true);
  REQUIRE(mb.losses.size() == 3);
  check_bit_equal(mb, lm);
  CHECK(lm.stats.layer_upload_bytes > 0);
}

TEST_CASE("QLoRA adapter gradients match the fp64 PEFT + bitsandbytes goldens for every family", "[qlora][golden]") {
  // f32 compute on the dequantized bf16 weights (the golden's math exactly, in f32): the worst
  // tensor is ~1e-6 relative L2. A wrong absmax block, a code nibble swapped or the base not
  // quantized at all moves them by > 1e-2 (the NF4 round trip changes each weight up to 15% of
  // its block's absmax). bf16 compute (the run's dtype) rounds activations too: printed, and held
  // to 3e-2.
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3"}) {
    INFO(name);
    const nlohmann::json expected =
        nlohmann::json::parse(testing::read_file(testing::source_path("tests/golden/qlora_grad/") + name + "/expected.json"));
    const QloraStep s = qlora_step(*dev, name, DType::f32, QloraBase::nf4);
    const double err = testing::qlora_golden_error(s, name, "grads.safetensors");
    const double want_loss = expected["loss"].get<double>();
    CHECK(std::abs(s.loss - want_loss) <= 2e-6 * want_loss);
    CHECK(err <= 1e-4);
    const QloraStep plain = qlora_step(*dev, name, DType::f32, QloraBase::nf4_no_double_quant);
    const double err_plain = testing::qlora_golden_error(plain, name, "grads_nodq.safetensors");
    CHECK(std::abs(plain.loss - expected["loss_nodq"].get<double>()) <= 2e-6 * want_loss);
    CHECK(err_plain <= 1e-4);
    // the other quantization's goldens differ: the test sees which absmax the base used
    CHECK(testing::qlora_golden_error(plain, name, "grads.safetensors") > 10 * err_plain);
    const QloraStep bf = qlora_step(*dev, name, DType::bf16, QloraBase::nf4);
    const double err_bf16 = testing::qlora_golden_error(bf, name, "grads.safetensors");
    CHECK(err_bf16 <= 3e-2);
    std::printf("qlora golden %-7s loss %.9f (want %.9f) worst adapter grad rel L2 %.2e (plain absmax %.2e), "
                "bf16 compute %.2e\n", name, s.loss, want_loss, err, err_plain, err_bf16);
  }
}

TEST_CASE("QLoRA link and host bytes of the decoder layers against bf16 LoRA, from the engine's counters", "[qlora][engine]") {
  // A random model wide enough that each tensor's 256-byte alignment is noise (C = 256, F = 512):
  // per step the decoder layers' uploads are <= 0.3 of the bf16 LoRA run's (codes 0.25 + scales),
  // and their host bytes <= 0.6 per decoder-layer parameter (0.516 + the f32 norms).
  ModelConfig cfg = hf_config_parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 300, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "max_position_embeddings": 64})", "qlora test config");
  auto dev = device_create(DeviceOptions{});
  const MicroBatch mb = testing::strided_batch(2, 16, cfg.vocab_size, 11, 3);
  struct Run {
    EngineStats stats;
    size_t layer_host = 0, plan_layers = 0;
    int64_t layer_params = 0;
    double loss = 0;
  };
  auto run = [&](bool nf4) {
    ModelSpec spec = model_spec_build(cfg, DType::bf16);
    if (nf4) nf4_base_enable(spec, true);
    HostStoreOptions so;
    so.weights_only = true;
    HostStore store(*dev, spec, so);
    model_init_weights(store, 5);
    LoraOptions lo;
    lo.r = 4;
    LoraStore lora(*dev, spec, lo);
    lora.init(1);
    EngineOptions eo;
    eo.weights = WeightsMode::stream;
    eo.max_batch = mb.B;
    eo.max_tokens = mb.T;
    eo.lora = lo;
    Engine engine(*dev, store, eo, &lora);
    Run r;
    const EngineStats s0 = engine.stats();
    r.loss = engine.forward_backward(mb, 1.f);
    engine.optimizer_step(AdamWParams{}, 0.0, 0.0);
    engine.forward_backward(mb, 1.f);  // the next step's pass: its forward uploads after the update
    engine.synchronize();
    r.stats = engine.stats();
    r.stats.layer_upload_bytes -= s0.layer_upload_bytes;
    for (size_t l = 0; l < spec.layers.size(); ++l) {
      r.layer_host += store.layer_group(l).working_bytes;
      for (size_t row = store.layer_group(l).first_row; row < store.layer_group(l).end_row; ++row)
        r.layer_params += spec.params[row].numel();
    }
    PlanInputs in;
    in.lora = lo;
    in.weights = WeightsMode::stream;
    in.micro_batch = mb.B;
    in.sequence_len = mb.T;
    const RunPlan plan = placement_plan(spec, in, PlanBudgets{});
    for (const PlanState& st : plan.states)
      if (st.kind.rfind("working weights: decoder layers", 0) == 0) r.plan_layers = st.bytes;
    return r;
  };
  const Run bf16 = run(false), nf4 = run(true);
  const double link_ratio = double(nf4.stats.layer_upload_bytes) / double(bf16.stats.layer_upload_bytes);
  const double host_per_param = double(nf4.layer_host) / double(nf4.layer_params);
  std::printf("qlora bytes: decoder layers' uploads over 2 passes %zu (bf16 LoRA %zu), ratio %.4f; host %.4f B per "
              "decoder-layer parameter (bf16 %.4f); loss %.6f (bf16 base %.6f)\n",
              nf4.stats.layer_upload_bytes, bf16.stats.layer_upload_bytes, link_ratio, host_per_param,
              double(bf16.layer_host) / double(bf16.layer_params), nf4.loss, bf16.loss);
  CHECK(nf4.stats.layer_upload_bytes > 0);
  CHECK(link_ratio <= 0.3);
  CHECK(host_per_param <= 0.6);
  CHECK(nf4.plan_layers == nf4.layer_host);  // the plan counts the packed layers exactly, apart
  CHECK(bf16.plan_layers == 0);              // a bf16 base: one working-weights row, as before
  CHECK(std::abs(nf4.loss - bf16.loss) < 0.05 * std::abs(bf16.loss));  // the same model, 4-bit
}

}  // namespace strata
