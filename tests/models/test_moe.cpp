// Mixture-of-experts layers (models/moe_layer.h): the qwen3_moe and mixtral configs, the host
// routing and its gradient (against finite differences), the combine kernels (against their
// plain-loop twins), and `strata grad`'s engine path against transformers' own modeling code in
// float64 (tests/golden/qwen3_moe, tests/golden/mixtral; tools/golden/make_moe_goldens.py), with and
// without the load-balancing loss; and the streamed step equal to the resident one bit for bit.
#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref/moe.h"
#include "models/moe_layer.h"
#include "models/moe_routing.h"
#include "models/model_spec.h"
#include "offload/engine/generator.h"
#include "src/recipe/recipe_modes.h"
#include "tests/models/moe_golden.h"
#include "tests/testing.h"

namespace strata {
namespace {

ModelConfig parse(const nlohmann::json& j) { return hf_config_parse(j.dump(), "test config"); }

nlohmann::json qwen3_moe_json() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"hidden_size", 16},
          {"intermediate_size", 24}, {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"vocab_size", 50}};
}

EngineOptions options(const std::string& weights, const std::string& checkpoints) {
  EngineOptions eo;
  eo.weights = weights_mode_parse(weights);
  eo.checkpoints = checkpoint_mode_parse(checkpoints);
  return eo;
}

}  // namespace

TEST_CASE("qwen3_moe and mixtral configs parse with transformers' defaults", "[moe][config]") {
  const ModelConfig q = parse(qwen3_moe_json());
  CHECK(q.family == "qwen3_moe");
  CHECK(q.num_experts == 128);  // Qwen3MoeConfig's defaults
  CHECK(q.num_experts_per_tok == 8);
  CHECK(q.moe_intermediate_size == 768);
  CHECK_FALSE(q.norm_topk_prob);
  CHECK(q.num_key_value_heads == 4);
  CHECK(q.head_dim == 4);  // hidden / heads: no 128 default as Qwen3Config has
  CHECK(q.qk_norm);
  CHECK(q.router_aux_loss_coef == 0.001);
  CHECK_FALSE(q.output_router_logits);
  for (int64_t l = 0; l < 4; ++l) CHECK(q.moe_layer(l));

  nlohmann::json j = qwen3_moe_json();
  j["num_local_experts"] = 6;  // what transformers 5 saves
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  j["norm_topk_prob"] = true;
  j["num_experts_per_tok"] = 2;
  const ModelConfig q2 = parse(j);
  CHECK(q2.num_experts == 6);
  CHECK(q2.norm_topk_prob);
  CHECK_FALSE(q2.moe_layer(0));  // (0 + 1) % 2 != 0
  CHECK(q2.moe_layer(1));
  CHECK_FALSE(q2.moe_layer(2));
  CHECK_FALSE(q2.moe_layer(3));  // mlp_only_layers
  const ModelSpec spec = model_spec_build(q2, DType::f32);
  CHECK(spec.layers[0].kind == &dense_layer_kind());
  CHECK(spec.layers[1].kind == &moe_layer_kind(q2));
  CHECK(spec.params.find("model.layers.1.mlp.experts.5.down_proj.weight") != nullptr);
  CHECK(spec.params.find("model.layers.1.mlp.gate.weight")->shape == Shape{6, 16});
  CHECK(spec.params.find("model.layers.0.mlp.gate_proj.weight")->shape == Shape{24, 16});  // dense: intermediate_size

  const ModelConfig m = parse({{"architectures", {"MixtralForCausalLM"}}, {"model_type", "mixtral"},
                               {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 2},
                               {"num_attention_heads", 8}, {"vocab_size", 50}});
  CHECK(m.num_experts == 8);
  CHECK(m.num_experts_per_tok == 2);
  CHECK(m.moe_intermediate_size == 24);
  CHECK(m.norm_topk_prob);  // MixtralTopKRouter always renormalises
  CHECK(m.rms_norm_eps == 1e-5);
  CHECK(m.rope_theta == 1e6);
  CHECK(m.sliding_window == 0);
  CHECK(m.num_key_value_heads == 8);
  CHECK_FALSE(m.qk_norm);
  const ModelSpec ms = model_spec_build(m, DType::bf16);
  CHECK(ms.params.find("model.layers.1.block_sparse_moe.experts.7.w2.weight")->shape == Shape{16, 24});
  CHECK(ms.params.find("model.layers.0.block_sparse_moe.gate.weight") != nullptr);

  j = qwen3_moe_json();
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 5;
  CHECK_THAT(testing::error_of([&] { parse(j); }), Catch::Contains("num_experts_per_tok"));
  j = qwen3_moe_json();
  j["mlp_only_layers"] = {7};
  CHECK_THAT(testing::error_of([&] { parse(j); }), Catch::Contains("mlp_only_layers"));
}

TEST_CASE("a MoE config that would slide a layer's attention is refused: exit 2, the key named", "[moe][config][cli]") {
  // strata's MoE layers attend over the whole context (hf_config.cpp): qwen3_moe with
  // use_sliding_window slides every layer, and mixtral with a sliding_window does
  testing::TempDir tmp("moe_sliding_refused");
  nlohmann::json q = qwen3_moe_json();
  q["use_sliding_window"] = true;
  q["sliding_window"] = 8;
  nlohmann::json m = {{"architectures", {"MixtralForCausalLM"}}, {"model_type", "mixtral"}, {"hidden_size", 16},
                      {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"vocab_size", 50}, {"sliding_window", 5}};
  for (const auto& [name, cfg] : {std::pair<const char*, nlohmann::json>{"qwen3_moe", q}, {"mixtral", m}}) {
    INFO(name);
    const std::string config = tmp.file(std::string(name) + ".json", cfg.dump());
    testing::check_run(testing::run_strata("estimate --model " + config), 2,
                       {"sliding_window", "slides layer 0", "mixture-of-experts", "set sliding_window to null"});
  }
  // without the window both load
  q["use_sliding_window"] = false;
  m["sliding_window"] = nullptr;
  CHECK(parse(q).sliding_window == 0);
  CHECK(parse(m).sliding_window == 0);
}

TEST_CASE("MoE routing picks the top k, renormalises, and lays rows out expert by expert", "[moe]") {
  // 3 tokens, 4 experts, k = 2
  const std::vector<float> logits = {0.f, 2.f, 1.f, -1.f,   // token 0: experts 1, 2
                                     3.f, 0.f, 0.f, 2.5f,   // token 1: experts 0, 3
                                     0.f, 0.5f, 4.f, 1.f};  // token 2: experts 2, 3
  for (bool norm : {false, true}) {
    const MoeRouting r = moe_route(logits.data(), 3, 4, 2, norm);
    CHECK(r.expert == std::vector<int32_t>{1, 2, 0, 3, 2, 3});
    CHECK(r.offsets == std::vector<int32_t>{0, 1, 2, 4, 6});
    CHECK(r.row_token == std::vector<int32_t>{1, 0, 0, 2, 1, 2});
    CHECK(r.token_row == std::vector<int32_t>{1, 2, 0, 4, 3, 5});
    double s0 = 0;
    for (int x = 0; x < 4; ++x) s0 += std::exp(double(logits[size_t(x)]));
    const double p01 = std::exp(2.0) / s0, p02 = std::exp(1.0) / s0;
    CHECK(r.weight[0] == Approx(norm ? p01 / (p01 + p02) : p01).epsilon(1e-6));
    CHECK(r.weight[1] == Approx(norm ? p02 / (p01 + p02) : p02).epsilon(1e-6));
    CHECK(r.row_weight[size_t(r.token_row[0])] == r.weight[0]);
  }
}

TEST_CASE("MoE routing's backward matches central differences", "[moe]") {
  // f = sum_r c_r row_weight_r + sum_{t,e} a_e p_{t,e} (the second term: the aux loss's shape)
  const int64_t n = 5, e = 6, k = 3;
  std::vector<float> logits = testing::random_floats(size_t(n * e), 11, -2.f, 2.f);
  for (int64_t i = 0; i < n * e; ++i) logits[size_t(i)] += 0.7f * float(i % e);  // distinct, clear gaps
  const std::vector<float> c = testing::random_floats(size_t(n * k), 12);
  const std::vector<float> a32 = testing::random_floats(size_t(e), 13);
  const std::vector<double> a(a32.begin(), a32.end());
  for (bool norm : {false, true}) {
    INFO("norm_topk_prob " << norm);
    const MoeRouting r = moe_route(logits.data(), n, e, k, norm);
    std::vector<float> dlogits(size_t(n * e));
    moe_route_backward(dlogits.data(), r, c.data(), a.data());
    auto f = [&](const std::vector<float>& l) {
      const MoeRouting q = moe_route(l.data(), n, e, k, norm);
      REQUIRE(q.row_token == r.row_token);  // the step keeps the routing (each token's set of experts)
      REQUIRE(q.offsets == r.offsets);
      double v = 0;
      for (int64_t i = 0; i < n * k; ++i) v += double(c[size_t(i)]) * double(q.row_weight[size_t(i)]);
      for (int64_t i = 0; i < n * e; ++i) v += a[size_t(i % e)] * double(q.probs[size_t(i)]);
      return v;
    };
    double worst = 0;
    for (int64_t i = 0; i < n * e; ++i) {
      const float h = 1e-2f;
      std::vector<float> lp = logits, lm = logits;
      lp[size_t(i)] += h;
      lm[size_t(i)] -= h;
      const double fd = (f(lp) - f(lm)) / (double(lp[size_t(i)]) - double(lm[size_t(i)]));
      worst = std::max(worst, std::abs(fd - double(dlogits[size_t(i)])));
    }
    // f32 probabilities: central differences carry ~1e-5 of rounding and O(h^2) ~1e-4 of curvature
    CHECK(worst <= 5e-4);
  }
}

TEST_CASE("moe_combine CPU kernels equal their plain-loop twins", "[moe][kernels]") {
  for (auto [n, k, c] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 3, 17}, {33, 8, 130}}) {
    INFO("n=" << n << " k=" << k << " c=" << c);
    const int64_t m = n * k;
    std::vector<float> logits = testing::random_floats(size_t(n * (k + 3)), uint64_t(n + c));
    const MoeRouting r = moe_route(logits.data(), n, k + 3, k, true);
    const std::vector<float> y = testing::random_floats(size_t(m * c), 1), dout = testing::random_floats(size_t(n * c), 2);
    std::vector<float> out = testing::random_floats(size_t(n * c), 3), out_ref = out;
    cpu::moe_combine_forward(out.data(), y.data(), r.row_weight.data(), r.token_row.data(), n, k, c);
    ref::moe_combine_forward(out_ref.data(), y.data(), r.row_weight.data(), r.token_row.data(), n, k, c);
    // the same sums in the same order; the compiler may contract a different multiply-add to an FMA
    CHECK(testing::max_rel_error(out, out_ref) <= 1e-6);
    std::vector<float> dy(static_cast<size_t>(m * c)), dy_ref(dy), dw(static_cast<size_t>(m)), dw_ref(dw);
    cpu::moe_combine_backward(dy.data(), dw.data(), dout.data(), y.data(), r.row_weight.data(), r.row_token.data(), m, c);
    ref::moe_combine_backward(dy_ref.data(), dw_ref.data(), dout.data(), y.data(), r.row_weight.data(),
                              r.row_token.data(), m, c);
    CHECK(dy == dy_ref);  // one product each
    CHECK(testing::max_rel_error(dw, dw_ref) <= 1e-5);
  }
}

TEST_CASE("strata grad on qwen3_moe and mixtral matches transformers in float64", "[moe][golden]") {
  // The bar: the loss within 1e-5 relative, every gradient within 1e-4 relative L2 (f32
  // weights). transformers' own f32 rerun is within 1.1e-5 of its f64 gradients (expected.json).
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"qwen3_moe", "mixtral"})
    for (bool aux : {false, true}) {
      INFO(name << (aux ? " with the load-balancing loss" : ""));
      moe_testing::moe_golden_check(*dev, name, DType::f32, options("device", "device"), aux, 1e-5, 1e-4);
    }
}

TEST_CASE("strata grad on the MoE goldens in bf16 stays near float64", "[moe][golden]") {
  // bf16 matmul inputs: the loss within 1%, all gradients together within 10% relative L2 (bf16's
  // router logits may cross a top-k margin on a token, moving a few experts' gradients wholesale,
  // as transformers' own bf16 run would)
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    INFO(name);
    moe_testing::moe_golden_check(*dev, name, DType::bf16, options("device", "device"), false, 1e-2, 0.1, nullptr,
                                  false);
  }
}

TEST_CASE("an MoE model's streamed step equals its resident step bit for bit", "[moe][engine]") {
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    INFO(name);
    testing::GoldenStep resident, streamed, kept;
    moe_testing::moe_golden_check(*dev, name, DType::f32, options("device", "device"), true, 1e-5, 1e-4, &resident);
    moe_testing::moe_golden_check(*dev, name, DType::f32, options("stream", "host"), true, 1e-5, 1e-4, &streamed);
    EngineOptions never = options("stream", "device");
    never.recompute = RecomputeMode::never;  // backward_saved: the forward's activations, no recompute
    moe_testing::moe_golden_check(*dev, name, DType::f32, never, true, 1e-5, 1e-4, &kept);
    CHECK(streamed.loss == resident.loss);
    CHECK(kept.loss == resident.loss);
    size_t differing = 0;
    for (const auto& e : testing::tensor_errors(resident.table, streamed.grads, resident.grads)) differing += !e.identical;
    for (const auto& e : testing::tensor_errors(resident.table, kept.grads, resident.grads)) differing += !e.identical;
    CHECK(differing == 0);
  }
}

}  // namespace strata

namespace strata {

TEST_CASE("MoE checkpoints load from the Hub's per-expert layout and the packed 3-D layout alike", "[moe][golden]") {
  // tests/golden/<name>/packed: the same weights under transformers 5's in-memory names
  // (mlp.experts.gate_up_proj (E, 2I, C), mlp.experts.down_proj (E, C, I), mlp.gate.weight)
  auto dev = device_create(DeviceOptions{});
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    INFO(name);
    const std::string dir = testing::source_path(std::string("tests/golden/") + name);
    const ModelSpec spec = model_spec_build(hf_config_load(dir), DType::f32);
    HostStore hub(*dev, spec), packed(*dev, spec);
    model_load_weights(hub, dir);
    model_load_weights(packed, dir + "/packed");
    size_t differing = 0;
    std::vector<float> a, b;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      a.resize(size_t(spec.params[i].numel()));
      b.resize(a.size());
      hub.get_param(i, a.data());
      packed.get_param(i, b.data());
      differing += a != b;
    }
    CHECK(differing == 0);
    CHECK(spec.params.size() > 3 * size_t(spec.config.num_experts));
  }
}

}  // namespace strata

namespace strata {

TEST_CASE("greedy generation on the MoE goldens equals transformers' token for token", "[moe][generate]") {
  // expected.json's generate: transformers' greedy continuation in float64, every step's top-two
  // logit gap >= 1e-3 (so f32 picks the same tokens)
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    INFO(name);
    const testing::Golden g = testing::Golden::load(name);
    const nlohmann::json want = moe_testing::moe_expected(g)["generate"];
    const std::vector<int32_t> prompt = want["prompt"].get<std::vector<int32_t>>();
    const std::vector<int32_t> tokens = want["tokens"].get<std::vector<int32_t>>();
    auto dev = device_create(DeviceOptions{});
    HostStore store(*dev, model_spec_build(hf_config_load(g.dir), DType::f32));
    model_load_weights(store, g.dir);
    SamplingOptions so;
    so.max_new_tokens = int64_t(tokens.size());
    const int64_t len = int64_t(prompt.size());
    Generator gen(*dev, store, GeneratorShape{1, len, len + int64_t(tokens.size())});
    const std::vector<GenerateResult> got = gen.generate({prompt}, so, 0);
    REQUIRE(got.size() == 1);
    CHECK(got[0].tokens == tokens);
  }
}

}  // namespace strata

namespace strata {

TEST_CASE("Qwen3-30B-A3B: bytes from every parameter, FLOPs from the active ones", "[moe][estimate]") {
  // hand count (recipes/configs/qwen3-30b-a3b): per layer attention 2048 x (4096 + 512 + 512) +
  // 4096 x 2048 = 18,874,368, norms 2 x 2048 + 2 x 128, router 128 x 2048 = 262,144, experts
  // 128 x 3 x 768 x 2048 = 603,979,776; 48 layers, embedding and lm_head 151,936 x 2048 each, final norm
  const ModelSpec spec = model_spec_build(hf_config_load(testing::source_path("recipes/configs/qwen3-30b-a3b")), DType::bf16);
  CHECK(spec.parameter_count() == 30532122624);
  CHECK(spec.layers.size() == 48);
  // active per token and layer: attention, the router over all 128 experts, 8 experts' 3 matrices
  double active = 0;
  for (const ModelLayer& l : spec.layers) active += l.kind->cost(spec.config, DType::bf16, 1, 1).matmul_flops / 8;
  CHECK(active == 48.0 * (18874368 + 262144 + 8 * 3 * 768 * 2048));  // 2,730,491,904
}

}  // namespace strata
