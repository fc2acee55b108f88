// The generation engine (offload/engine/generator.h) and its cached-attention kernel:
//   - attention_cached_forward (CPU) against its fp64 plain-loop twin on awkward sizes (a cache
//     longer than one key tile, D = 17, rows at different positions), and against the training
//     attention's twin when the queries are the whole sequence;
//   - greedy generation equals, token for token, the argmax of the full-sequence forward (the
//     training layer_forward over prompt + generated tokens, the head in fp64 on the host) at
//     every generated position, on the four golden families in f32, two prompts of different
//     lengths batched in one pass, weights resident and streamed through two slots;
//   - generation stops at an EOS id; seeded sampling is reproducible; the token choice draws
//     from the temperature / top-k / top-p distribution it states.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>

#include "kernels/cpu/attention_cached.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ref.h"
#include "kernels/cpu/ref/attention_cached.h"
#include "models/dense_layer.h"
#include "offload/engine/generator.h"
#include "offload/plan/run_engines.h"
#include "offload/state/model_io.h"
#include "src/core/bf16.h"
#include "tests/seeded_inputs.h"
#include "tests/testing.h"

namespace strata {
namespace {

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST_CASE("attention_cached_forward matches its fp64 twin, f32 and bf16 dots", "[generate][attention_cached]") {
  // bf16 dots: the twin runs on q, k, v rounded to bf16 (products of bf16 values are exact in
  // f32, so the kernel differs from it by f32 summation only).
  const int64_t B = 3, tq = 3, tcap = 150, H = 6, Hk = 2, D = 17;
  const std::vector<int32_t> start = {0, 67, 147};  // 147 + 3 = tcap: the last row fills the cache
  const float scale = 1.f / std::sqrt(float(D));
  const auto q = uniform(size_t(B * tq * H * D), 1), k = uniform(size_t(B * tcap * Hk * D), 2),
             v = uniform(size_t(B * tcap * Hk * D), 3);
  std::vector<float> out_f32;
  for (DType dot : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dot));
    std::vector<float> out(q.size());
    cpu::attention_cached_forward(out.data(), q.data(), k.data(), v.data(), start.data(), B, tq, tcap, H, Hk, D, scale,
                                  dot);
    auto widen = [&](const std::vector<float>& x) {
      std::vector<double> w(x.size());
      for (size_t i = 0; i < x.size(); ++i) w[i] = dot == DType::bf16 ? bf16_to_f32(f32_to_bf16(x[i])) : x[i];
      return w;
    };
    const std::vector<double> qd = widen(q), kd = widen(k), vd = widen(v);
    std::vector<double> want(q.size());
    ref::attention_cached_forward(want.data(), qd.data(), kd.data(), vd.data(), start.data(), B, tq, tcap, H, Hk, D,
                                  double(scale));
    double worst = 0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(double(out[i]) - want[i]));
    INFO("max abs error " << worst);
    CHECK(worst < 2e-6);
    if (dot == DType::f32) out_f32 = out;
    else CHECK(out != out_f32);  // the rounding is there
  }
}

TEST_CASE("attention_cached_forward with bf16 dots computes what the bf16 prefill attention does",
          "[generate][attention_cached]") {
  // The decode step and the prefill (attention_forward, the training kernel) round alike: the
  // cached kernel over a whole sequence against attention_forward with bf16 dots, to f32
  // summation order; the f32 cached kernel is 100x further away.
  const int64_t B = 2, T = 70, H = 4, Hk = 2, D = 16;
  const float scale = 0.25f;
  const auto q = uniform(size_t(B * T * H * D), 7), k = uniform(size_t(B * T * Hk * D), 8),
             v = uniform(size_t(B * T * Hk * D), 9);
  const std::vector<int32_t> start = {0, 0};
  std::vector<float> prefill(q.size()), lse(size_t(B * T * H)), cached(q.size()), cached_f32(q.size());
  cpu::attention_forward(prefill.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, B, T, H, Hk, D, scale,
                         DType::bf16);
  cpu::attention_cached_forward(cached.data(), q.data(), k.data(), v.data(), start.data(), B, T, T, H, Hk, D, scale,
                                DType::bf16);
  cpu::attention_cached_forward(cached_f32.data(), q.data(), k.data(), v.data(), start.data(), B, T, T, H, Hk, D, scale,
                                DType::f32);
  double same = 0, other = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    same = std::max(same, std::abs(double(cached[i]) - prefill[i]));
    other = std::max(other, std::abs(double(cached_f32[i]) - prefill[i]));
  }
  std::printf("cached attention vs bf16 prefill: max abs %.2e with bf16 dots, %.2e with f32 dots\n", same, other);
  CHECK(same < 2e-6);
  CHECK(other > 100 * same);
}

TEST_CASE("attention_cached_forward over the whole sequence is the causal attention", "[generate][attention_cached]") {
  const int64_t B = 2, T = 19, H = 4, Hk = 1, D = 8;
  const double scale = 0.3;
  const auto qf = uniform(size_t(B * T * H * D), 4), kf = uniform(size_t(B * T * Hk * D), 5),
             vf = uniform(size_t(B * T * Hk * D), 6);
  std::vector<double> q(qf.begin(), qf.end()), k(kf.begin(), kf.end()), v(vf.begin(), vf.end());
  std::vector<double> cached(q.size()), causal(q.size()), lse(size_t(B * T * H));
  const std::vector<int32_t> start = {0, 0};
  ref::attention_cached_forward(cached.data(), q.data(), k.data(), v.data(), start.data(), B, T, T, H, Hk, D, scale);
  ref::attention_forward(causal.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, B, T, H, Hk, D, scale);
  double worst = 0;
  for (size_t i = 0; i < q.size(); ++i) worst = std::max(worst, std::abs(cached[i] - causal[i]));
  CHECK(worst < 1e-12);
}

// The full-sequence forward of one row: layer_forward over every layer (weights copied to the
// device whole), the final norm on the device, then logits in fp64 on the host from the store's
// f32 lm_head. Returns the argmax at each position and the gap between its top two logits.
struct Argmax {
  std::vector<int32_t> id;
  std::vector<double> gap;
};

Argmax full_forward_argmax(Device& dev, HostStore& store, const std::vector<int32_t>& ids) {
  const ModelSpec& spec = store.spec();
  const ModelConfig& c = spec.config;
  LayerDims d;
  d.B = 1, d.T = int64_t(ids.size()), d.C = c.hidden_size, d.H = c.num_attention_heads, d.Hk = c.num_key_value_heads;
  d.D = c.head_dim, d.F = c.intermediate_size, d.eps = float(c.rms_norm_eps), d.wt = spec.matrix_dtype;
  const int64_t N = d.N(), C = d.C, V = c.vocab_size;
  const Stream s = Stream::compute;
  std::vector<void*> owned;
  auto alloc = [&](size_t bytes) {
    owned.push_back(dev.alloc(bytes, "test"));
    return owned.back();
  };
  auto* ws_base = alloc(layer_forward_workspace_bytes(d));
  LayerWorkspace ws = layer_forward_workspace_carve(d, ws_base);
  auto* x = static_cast<float*>(alloc(size_t(N * C) * 4));
  auto* y = static_cast<float*>(alloc(size_t(N * C) * 4));
  auto* pos = static_cast<int32_t*>(alloc(size_t(N) * 4));
  auto* inv = static_cast<float*>(alloc(size_t(d.D / 2) * 4));
  std::vector<int32_t> pos_host(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) pos_host[i] = int32_t(i);
  const std::vector<float> inv_host = model_rope_inv_freq(c);
  dev.copy_h2d(pos, pos_host.data(), pos_host.size() * 4, s);
  dev.copy_h2d(inv, inv_host.data(), inv_host.size() * 4, s);
  std::vector<float> emb(size_t(V * C)), x_host(size_t(N * C));
  store.get_param(size_t(spec.embed), emb.data());
  for (int64_t n = 0; n < N; ++n) std::copy_n(emb.begin() + ids[size_t(n)] * C, C, x_host.begin() + n * C);
  dev.copy_h2d(x, x_host.data(), x_host.size() * 4, s);
  const TensorTable& wt = store.working_table();
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const ParamGroup& g = store.layer_group(l);
    char* slot = static_cast<char*>(alloc(g.working_bytes));
    dev.copy_h2d(slot, store.working_of(g.first_row), g.working_bytes, s);
    const LayerParamRows r = dense_layer_rows(spec.layers[l]);
    auto at = [&](int64_t row) -> const void* { return row == kAbsent ? nullptr : slot + (wt[size_t(row)].offset - g.working_offset); };
    auto atf = [&](int64_t row) { return static_cast<const float*>(at(row)); };
    LayerWeights w;
    w.q = at(r.q), w.k = at(r.k), w.v = at(r.v), w.o = at(r.o), w.gate = at(r.gate), w.up = at(r.up), w.down = at(r.down);
    w.input_norm = atf(r.input_norm), w.post_norm = atf(r.post_norm), w.q_norm = atf(r.q_norm), w.k_norm = atf(r.k_norm);
    w.q_bias = atf(r.q_bias), w.k_bias = atf(r.k_bias), w.v_bias = atf(r.v_bias), w.o_bias = atf(r.o_bias);
    layer_forward(dev, y, x, w, TokenContext{pos, nullptr, inv}, ws, d, s);
    std::swap(x, y);
  }
  auto* norm = static_cast<float*>(alloc(size_t(C) * 4));
  auto* rstd = static_cast<float*>(alloc(size_t(N) * 4));
  dev.copy_h2d(norm, store.working_of(size_t(spec.final_norm)), size_t(C) * 4, s);
  dev.rmsnorm_forward(y, rstd, x, norm, N, C, d.eps, s);
  std::vector<float> hn(size_t(N * C));
  dev.copy_d2h(hn.data(), y, hn.size() * 4, s);
  dev.synchronize();
  for (auto it = owned.rbegin(); it != owned.rend(); ++it) dev.free(*it);
  std::vector<float> lm(size_t(V * C));
  store.get_param(size_t(spec.lm_head_row()), lm.data());
  Argmax a;
  for (int64_t n = 0; n < N; ++n) {
    double best = -1e300, second = -1e300;
    int32_t arg = 0;
    for (int64_t v = 0; v < V; ++v) {
      double z = 0;
      for (int64_t e = 0; e < C; ++e) z += double(hn[size_t(n * C + e)]) * double(lm[size_t(v * C + e)]);
      if (z > best) second = best, best = z, arg = int32_t(v);
      else if (z > second) second = z;
    }
    a.id.push_back(arg);
    a.gap.push_back(best - second);
  }
  return a;
}

// Two prompts of different lengths from the golden batch's first row.
std::vector<std::vector<int32_t>> golden_prompts(const testing::Golden& g) {
  const std::vector<int32_t> row(g.batch.ids.begin(), g.batch.ids.begin() + g.batch.T);
  return {std::vector<int32_t>(row.begin(), row.begin() + std::min<int64_t>(5, g.batch.T)),
          std::vector<int32_t>(row.begin() + 1, row.begin() + std::min<int64_t>(3, g.batch.T))};
}

// A golden model's weights in an f32 store on a CPU device with the default budget, and two
// prompts from its batch.
struct GoldenModel {
  explicit GoldenModel(const char* family)
      : g(testing::Golden::load(family)), dev(device_create(DeviceOptions{})),
        store(*dev, model_spec_build(hf_config_load(g.dir), DType::f32)), prompts(golden_prompts(g)) {
    model_load_weights(store, g.dir);
  }
  testing::Golden g;
  std::unique_ptr<Device> dev;
  HostStore store;
  std::vector<std::vector<int32_t>> prompts;
};

// Generates greedily for `prompts` and checks each token against the full-sequence argmax.
void check_greedy(Device& dev, HostStore& store, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
                  bool expect_resident) {
  SamplingOptions so;
  so.max_new_tokens = max_new;
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
  std::vector<GenerateResult> results;
  {
    Generator gen(dev, store, GeneratorShape{int64_t(prompts.size()), longest, longest + max_new});
    REQUIRE(gen.weights_resident() == expect_resident);
    results = gen.generate(prompts, so, 0);
  }
  double min_gap = 1e300;
  auto ref_dev = device_create(DeviceOptions{});  // the reference forward's own budget
  for (size_t r = 0; r < prompts.size(); ++r) {
    REQUIRE(results[r].tokens.size() == size_t(max_new));
    CHECK_FALSE(results[r].stopped);
    std::vector<int32_t> seq = prompts[r];
    seq.insert(seq.end(), results[r].tokens.begin(), results[r].tokens.end());
    const Argmax full = full_forward_argmax(*ref_dev, store, seq);
    for (size_t i = 0; i < results[r].tokens.size(); ++i) {
      const size_t p = prompts[r].size() - 1 + i;  // the position whose logits chose token i
      INFO("row " << r << ", generated token " << i << ", top-2 gap " << full.gap[p]);
      CHECK(results[r].tokens[i] == full.id[p]);
      min_gap = std::min(min_gap, full.gap[p]);
    }
  }
  WARN("smallest top-2 logit gap among the generated positions " << min_gap);
}

TEST_CASE("greedy generation is the argmax of the full-sequence forward", "[generate]") {
  const char* family = GENERATE("llama", "mistral", "qwen2", "qwen3");
  const bool streamed = GENERATE(false, true);
  INFO(family << (streamed ? ", a budget for two weight slots" : ", a budget for every layer"));
  const testing::Golden g = testing::Golden::load(family);
  const ModelSpec spec = model_spec_build(hf_config_load(g.dir), DType::f32);
  const auto prompts = golden_prompts(g);
  const int64_t max_new = 12;
  const GeneratorShape shape{2, 5, 5 + max_new};
  DeviceOptions dopt;
  if (streamed) dopt.memory_bytes = generator_device_bytes(spec, shape, GeneratorPlacement{false, spec.layers.size()}) + (64 << 10);
  auto dev = device_create(dopt);
  HostStore store(*dev, spec);
  model_load_weights(store, g.dir);
  // with two layers, two slots hold every layer: streamed only from three layers up (mistral)
  const bool resident = !streamed || generator_device_bytes(spec, shape, GeneratorPlacement{true, spec.layers.size()}) <= dopt.memory_bytes;
  CHECK((resident || spec.layers.size() > 2));
  check_greedy(*dev, store, prompts, max_new, resident);
}

TEST_CASE("greedy generation streaming five layers through two slots", "[generate]") {
  const ModelConfig cfg = testing::tiny_llama_config({48, 72, 5, 113, 64, false});
  const ModelSpec spec = model_spec_build(cfg, DType::f32);
  const std::vector<std::vector<int32_t>> prompts = {{3, 17, 99, 4, 56, 7, 81}, {12}, {44, 45, 46}};
  const int64_t max_new = 9;
  DeviceOptions dopt;
  dopt.memory_bytes = generator_device_bytes(spec, GeneratorShape{3, 7, 16}, GeneratorPlacement{false, spec.layers.size()}) + (64 << 10);
  auto dev = device_create(dopt);
  HostStore store(*dev, spec);
  model_init_weights(store, 11, 0.3);  // large weights: logits far from ties
  check_greedy(*dev, store, prompts, max_new, false);
}

// The KV cache spilled to pinned host memory (every layer's, or the last three's) against every
// cache on the device: the same tokens, greedy and sampled, and the link carries exactly each
// spilled layer's cached positions in and the new ones out.
TEST_CASE("a KV cache spilled to host memory gives the same tokens", "[generate][kv_spill]") {
  const ModelConfig cfg = testing::tiny_llama_config({48, 72, 5, 113, 64, false});
  const ModelSpec spec = model_spec_build(cfg, DType::f32);
  const std::vector<std::vector<int32_t>> prompts = {{3, 17, 99, 4, 56, 7, 81}, {12}, {44, 45, 46}};
  const GeneratorShape shape{3, 7, 16};
  const size_t L = spec.layers.size();
  const int64_t KD = cfg.num_key_value_heads * cfg.head_dim;
  SamplingOptions greedy, sampled;
  greedy.max_new_tokens = sampled.max_new_tokens = 9;
  sampled.temperature = 1.3, sampled.seed = 5;
  struct Run {
    std::vector<GenerateResult> greedy, sampled;
    GeneratorPlacement placement;
    GenerateStats stats;
  };
  auto run = [&](size_t budget) {
    DeviceOptions dopt;
    dopt.memory_bytes = budget;
    auto dev = device_create(dopt);
    HostStoreOptions ho;
    ho.weights_only = true;
    HostStore store(*dev, spec, ho);
    model_init_weights(store, 11, 0.3);
    Generator gen(*dev, store, shape);
    Run r;
    r.greedy = gen.generate(prompts, greedy, 0);
    r.sampled = gen.generate(prompts, sampled, 0);
    r.placement = gen.placement();
    r.stats = gen.stats();
    CHECK(dev->peak_bytes() <= budget);
    return r;
  };
  const Run all = run(size_t(1) << 30);
  REQUIRE(all.placement.weights_resident);
  REQUIRE(all.placement.kv_device_layers == L);
  CHECK(all.stats.kv_h2d_bytes == 0);
  const size_t slack = 1 << 10;  // less than one more layer's cache (3 rows x 16 positions x 24 x 4 bytes, k and v)
  const GeneratorPlacement spill_all{false, 0}, spill_three{true, 2};
  for (const GeneratorPlacement& want : {spill_all, spill_three}) {
    INFO("weights " << (want.weights_resident ? "resident" : "streamed") << ", " << want.kv_device_layers
                    << " layers' cache on the device");
    const Run spilled = run(generator_device_bytes(spec, shape, want) + slack);
    REQUIRE(spilled.placement.weights_resident == want.weights_resident);
    REQUIRE(spilled.placement.kv_device_layers == want.kv_device_layers);
    for (size_t r = 0; r < prompts.size(); ++r) {
      CHECK(spilled.greedy[r].tokens == all.greedy[r].tokens);
      CHECK(spilled.sampled[r].tokens == all.sampled[r].tokens);
    }
    // two generate calls of 9 tokens: after the prefill, passes p = 0..7 with row r at position
    // len_r + p, uploading [0, len_r + p) and writing one position back; the prefill writes the
    // padded rows' 7 positions each
    uint64_t in = 0;
    for (const auto& p : prompts)
      for (int64_t pass = 0; pass < 8; ++pass) in += uint64_t(int64_t(p.size()) + pass);
    const uint64_t out = 3 * 7 + 8 * 3;
    const uint64_t per_position = uint64_t(KD) * 4 * 2 * (L - want.kv_device_layers) * 2;  // k and v, two calls
    CHECK(spilled.stats.kv_h2d_bytes == in * per_position);
    CHECK(spilled.stats.kv_d2h_bytes == out * per_position);
  }
  WARN("the cache of one layer for this shape: " << 3 * 16 * KD * 4 << " bytes each of k and v");
}

// The placement plan prices a generation run from the generator's rows of the buffer table: the
// plan's device tier is what the generator it builds allocates, its placement the one the
// generator picks on the same device by itself, and rows per pass are halved until they fit.
TEST_CASE("the generation plan prices what the generator allocates", "[generate][plan]") {
  const ModelConfig cfg = testing::tiny_llama_config({48, 72, 5, 113, 64, false});
  const ModelSpec spec = model_spec_build(cfg, DType::f32);
  const GeneratorShape shape{3, 7, 16};
  const size_t budget = generator_device_bytes(spec, shape, GeneratorPlacement{true, 2}) + (1 << 10);
  DeviceOptions dopt;
  dopt.memory_bytes = budget;
  auto dev = device_create(dopt);
  GenerationInputs in;
  in.shape = shape;
  in.device_reserved_bytes = dev->used_bytes() + dev->pending_workspace_bytes(Stream::compute);
  PlanBudgets budgets;
  budgets.device_bytes = dev->budget_bytes();
  const RunPlan plan = placement_generation_plan(spec, in, budgets);
  REQUIRE(plan.fits());
  REQUIRE(plan.generation.active);
  CHECK(plan.generation.shape.max_batch == shape.max_batch);
  const GeneratorPlacement own = Generator::placement_for(*dev, spec, shape);
  CHECK(plan.generation.placement.weights_resident == own.weights_resident);
  CHECK(plan.generation.placement.kv_device_layers == own.kv_device_layers);
  CHECK(plan.generation.placement.kv_device_layers == 2);
  std::unique_ptr<HostStore> store = run_plan_host_store(*dev, spec, plan);
  CHECK(store->options().weights_only);
  model_init_weights(*store, 11, 0.3);
  const size_t before = dev->used_bytes();
  std::unique_ptr<Generator> gen = run_plan_generator(*dev, *store, plan);
  CHECK(dev->used_bytes() - before == plan.tier(Tier::device));
  CHECK(gen->kv_host_bytes() <= plan.tier(Tier::host_pinned));
  // 64 rows asked for where three fit with every layer resident: halved until the least
  // placement fits, and no further
  in.shape.max_batch = 64;
  const RunPlan lowered = placement_generation_plan(spec, in, budgets);
  REQUIRE(lowered.fits());
  const int64_t rows = lowered.generation.shape.max_batch;
  CHECK(rows < 64);
  CHECK(generator_min_device_bytes(spec, GeneratorShape{2 * rows, 7, 16}) > budget);
  CHECK(generator_device_bytes(spec, lowered.generation.shape, lowered.generation.placement) <= budget);
  // nothing fits: a problem, not a placement
  budgets.device_bytes = generator_min_device_bytes(spec, GeneratorShape{1, 7, 16}) / 2;
  CHECK_FALSE(placement_generation_plan(spec, in, budgets).fits());
}

TEST_CASE("generation stops at an EOS id", "[generate]") {
  GoldenModel m("qwen3");
  const auto& prompts = m.prompts;
  SamplingOptions so;
  so.max_new_tokens = 10;
  Generator gen(*m.dev, m.store, GeneratorShape{2, 5, 15});
  const auto free_run = gen.generate(prompts, so, 0);
  // the EOS: row 0's fourth token; each row stops before its first occurrence
  so.eos_ids = {free_run[0].tokens[3]};
  const auto stopped = gen.generate(prompts, so, 0);
  for (size_t r = 0; r < prompts.size(); ++r) {
    const auto& t = free_run[r].tokens;
    const auto hit = std::find(t.begin(), t.end(), so.eos_ids[0]);
    CHECK(stopped[r].stopped == (hit != t.end()));
    CHECK(stopped[r].tokens == std::vector<int32_t>(t.begin(), hit));
  }
  CHECK(stopped[0].tokens.size() <= 3);
}

TEST_CASE("seeded sampling is reproducible", "[generate]") {
  GoldenModel m("llama");
  const auto& prompts = m.prompts;
  SamplingOptions so;
  so.max_new_tokens = 16;
  so.temperature = 1.5, so.top_k = 40, so.top_p = 0.95, so.seed = 7;
  auto run = [&](uint64_t seed) {
    Generator gen(*m.dev, m.store, GeneratorShape{2, 5, 21});
    so.seed = seed;
    return gen.generate(prompts, so, 0);
  };
  const auto a = run(7), b = run(7), c = run(8);
  for (size_t r = 0; r < prompts.size(); ++r) CHECK(a[r].tokens == b[r].tokens);
  CHECK((a[0].tokens != c[0].tokens || a[1].tokens != c[1].tokens));  // the seed matters
}

TEST_CASE("the token choice draws from the distribution it states", "[generate]") {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -3.0f, 0.0f};
  const int64_t V = int64_t(logits.size());
  SamplingOptions o;
  CHECK(generator_pick_token(logits.data(), V, o, 0.99) == 1);  // greedy: the lower id of the tie
  o.temperature = 0.7, o.top_k = 4, o.top_p = 0.9;
  // reference: softmax(logits / T) over the 4 largest (ids 1, 3, 4, 0), then the smallest prefix
  // reaching 0.9, renormalised
  std::vector<int32_t> order = {1, 3, 4, 0};
  std::vector<double> p;
  double sum = 0;
  for (int32_t i : order) sum += p.emplace_back(std::exp((double(logits[size_t(i)]) - 2.0) / o.temperature));
  double acc = 0;
  size_t keep = 0;
  while (keep < order.size() && acc < o.top_p) acc += p[keep++] / sum;
  const double kept = std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(keep), 0.0);
  std::vector<double> count(size_t(V), 0);
  const int draws = 100000;
  for (int i = 0; i < draws; ++i) count[size_t(generator_pick_token(logits.data(), V, o, (i + 0.5) / draws))] += 1;
  for (int64_t v = 0; v < V; ++v) {
    const auto it = std::find(order.begin(), order.begin() + std::ptrdiff_t(keep), int32_t(v));
    const double want = it == order.begin() + std::ptrdiff_t(keep) ? 0 : p[size_t(it - order.begin())] / kept;
    INFO("id " << v);
    CHECK(std::abs(count[size_t(v)] / draws - want) < 1e-4);
  }
}

}  // namespace
}  // namespace strata
