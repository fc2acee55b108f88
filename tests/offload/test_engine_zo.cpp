// The zeroth-order engine (offload/engine/engine_zo.h): its device footprint (flat in depth, below a
// first-order forward-only pass), its link traffic (the weights once per dual forward, nothing
// back but two losses), its update (ZO-SGD on the host master against the plain-loop twin), its
// perturbation of the device copy (the same losses as a host store holding θ ± εz), the
// trainer's ZO step (src/train/zo_step.h: q perturbations, accumulated micro-batches), and the
// layer-major run of a step's q x k dual forwards (the same bits as one at a time, the weights once).
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "kernels/cpu/ref/zo.h"
#include "offload/engine/engine.h"
#include "offload/engine/engine_zo.h"
#include "offload/state/model_io.h"
#include "src/core/align.h"
#include "src/device/arena.h"
#include "src/train/zo_step.h"
#include "tests/offload/zo_schedule_testing.h"
#include "tests/testing.h"

namespace strata {
namespace {

ModelConfig tiny_config(int64_t layers, bool tied) {
  return testing::tiny_llama_config({64, 96, layers, 97, 256, tied});
}

MicroBatch tiny_batch(int64_t B, int64_t T) {
  MicroBatch mb;
  mb.B = B;
  mb.T = T;
  for (int64_t i = 0; i < B * T; ++i) {
    mb.ids.push_back(int32_t((i * 7) % 97));
    mb.targets.push_back(i % T == T - 1 ? -100 : int32_t((i * 7 + 3) % 97));
    mb.pos.push_back(int32_t(i % T));
  }
  return mb;
}

EngineOptions capacity(int64_t B, int64_t T) {
  EngineOptions eo;
  eo.max_batch = B;
  eo.max_tokens = T;
  eo.checkpoints = CheckpointMode::host;
  return eo;
}

// The device high-water mark of two ZO steps (dual forward, update, dual forward).
size_t zo_peak(int64_t layers, DType dtype) {
  auto dev = device_create(DeviceOptions{});
  HostStore store(*dev, model_spec_build(tiny_config(layers, false), dtype));
  model_init_weights(store, 3);
  ZoEngine engine(*dev, store, capacity(2, 33));
  const MicroBatch mb = tiny_batch(2, 33);
  const ZoLosses l = engine.dual_forward(mb, 11, 1e-3f);
  engine.queue_update({{11}, {float((l.plus - l.minus) / 2e-3 / double(mb.counted()))}}, 1e-4, 0.0);
  engine.dual_forward(mb, 12, 1e-3f);
  engine.synchronize();
  return dev->peak_bytes();
}

// The first-order engine's high-water mark over forward-only passes (eval) of B rows.
size_t forward_only_peak(int64_t layers, DType dtype, int64_t B) {
  auto dev = device_create(DeviceOptions{});
  HostStore store(*dev, model_spec_build(tiny_config(layers, false), dtype));
  model_init_weights(store, 3);
  Engine engine(*dev, store, capacity(B, 33));
  engine.forward_loss(tiny_batch(B, 33));
  engine.synchronize();
  return dev->peak_bytes();
}

}  // namespace

TEST_CASE("ZO: the device high-water mark is flat in depth and below a forward-only pass", "[zo][engine]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    const size_t shallow = zo_peak(4, dtype), deep = zo_peak(32, dtype);
    const size_t fwd = forward_only_peak(32, dtype, 2), fwd2 = forward_only_peak(32, dtype, 4);
    std::printf("zo device peak %s: 4 layers %zu B, 32 layers %zu B; first-order engine forward-only %zu B "
                "(2x batch: %zu B)\n", dtype_name(dtype), shallow, deep, fwd, fwd2);
    CHECK(shallow == deep);
    CHECK(deep <= fwd);
    CHECK(deep <= fwd2);
    // and it is what the buffer table says, nothing else
    CHECK(deep == ZoEngine::device_bytes(model_spec_build(tiny_config(32, false), dtype), capacity(2, 33)));
  }
}

TEST_CASE("ZO: a dual forward moves the weights across once and only two losses back", "[zo][engine]") {
  for (bool tied : {false, true}) {
    INFO("tied " << tied);
    auto dev = device_create(DeviceOptions{});
    HostStore store(*dev, model_spec_build(tiny_config(5, tied), DType::bf16));
    model_init_weights(store, 5);
    ZoEngine engine(*dev, store, capacity(2, 33));
    const MicroBatch mb = tiny_batch(2, 33);
    // W from the tables: every layer, the final norm, the lm_head (the tied embedding when tied);
    // an untied embedding is gathered on the host and never crosses
    const ModelSpec& spec = store.spec();
    size_t W = 0;
    for (size_t g = 1; g + 1 < store.groups().size(); ++g) W += store.groups()[g].working_bytes;
    W += store.working_table()[size_t(spec.final_norm)].bytes() + store.working_table()[size_t(spec.lm_head_row())].bytes();
    CHECK(engine.weight_link_bytes() == W);
    const size_t N = size_t(mb.B * mb.T), C = size_t(spec.config.hidden_size);
    const size_t extra_h2d = 3 * N * 4 /* ids, targets, positions */ + 2 * N * C * 4 /* x0 of each pass */;
    for (int step = 0; step < 3; ++step) {
      const DeviceCounters c0 = dev->counters();
      const ZoLosses l = engine.dual_forward(mb, 100 + uint64_t(step), 1e-3f);
      const DeviceCounters c1 = dev->counters();
      CHECK(c1.h2d_bytes - c0.h2d_bytes == W + extra_h2d);
      CHECK(c1.d2h_bytes - c0.d2h_bytes == 2 * sizeof(double));
      engine.queue_update({{100 + uint64_t(step)}, {float((l.plus - l.minus) / 2e-3 / double(mb.counted()))}}, 1e-4,
                          0.01);
    }
    std::printf("zo link bytes per step (%s): W = %zu, activations and tokens %zu, back 16\n", tied ? "tied" : "untied",
                W, extra_h2d);
  }
}

TEST_CASE("ZO: the update is ZO-SGD on the master weights, z regenerated on the host", "[zo][engine]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    auto dev = device_create(DeviceOptions{});
    HostStore store(*dev, model_spec_build(tiny_config(3, true), dtype));
    model_init_weights(store, 9);
    const std::vector<float> before(store.master(), store.master() + store.f32_floats());
    ZoEngine engine(*dev, store, capacity(1, 17));
    const ZoSgdEstimate est{{0x1234, 0x9876}, {0.75f, -1.25f}};
    const double lr = 3e-3, wd = 0.1;
    engine.queue_update(est, lr, wd);
    engine.synchronize();
    const TensorTable& ft = store.f32_table();
    for (size_t r = 0; r < ft.size(); ++r) {
      INFO(ft[r].name);
      std::vector<float> want(before.begin() + std::ptrdiff_t(ft[r].offset / 4),
                              before.begin() + std::ptrdiff_t(ft[r].offset / 4 + size_t(ft[r].numel())));
      const float wd_r = ft[r].shape.size() == 2 ? float(wd) : 0.f;  // matrices only
      ref::zo_sgd_update(want.data(), nullptr, false, est.seeds.data(), est.coefs.data(), 2, uint32_t(r), 0, float(lr),
                         wd_r, int64_t(want.size()));
      CHECK(std::memcmp(want.data(), store.master() + ft[r].offset / 4, want.size() * 4) == 0);
      // the working copy the next upload reads is the new master, in its dtype
      std::vector<float> working(want.size());
      dtype_convert(working.data(), DType::f32, store.working_of(r), store.working_table()[r].dtype, want.size());
      const std::vector<float> expect = store.working_table()[r].dtype == DType::bf16 ? testing::round_bf16(want) : want;
      CHECK(working == expect);
    }
  }
}

TEST_CASE("ZO: the dual forward's losses are the losses of host stores holding θ ± εz", "[zo][engine]") {
  // Perturbation on the device (layers, final norm, lm_head chunks) and on the host (embedding
  // rows) against the whole model perturbed on the host by the plain-loop twin, then a clean
  // pass; f32 and bf16, tied and untied, a vocabulary split into several head chunks.
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool tied : {false, true}) {
      INFO(dtype_name(dtype) << " tied " << tied);
      auto dev = device_create(DeviceOptions{});
      const ModelSpec spec = model_spec_build(tiny_config(3, tied), dtype);
      EngineOptions eo = capacity(2, 19);
      eo.head_chunk_rows = 40;  // 97 = 40 + 40 + 17
      const MicroBatch mb = tiny_batch(2, 19);
      const uint64_t seed = 4242;
      const float eps = 1e-2f;
      HostStore store(*dev, spec);
      model_init_weights(store, 21);
      ZoLosses l;
      {
        ZoEngine engine(*dev, store, eo);
        l = engine.dual_forward(mb, seed, eps);
      }
      double ref[2];
      for (int p = 0; p < 2; ++p) {
        HostStore moved(*dev, spec);
        model_init_weights(moved, 21);
        for (size_t r = 0; r < spec.params.size(); ++r) {
          const int64_t n = spec.params[r].numel();
          char* w = static_cast<char*>(moved.working_of(r));
          const float scale = p == 0 ? eps : -eps;
          if (moved.working_table()[r].dtype == DType::bf16)
            ref::zo_perturb_bf16(reinterpret_cast<bf16*>(w), seed, uint32_t(r), 0, scale, n);
          else
            ref::zo_perturb_f32(reinterpret_cast<float*>(w), seed, uint32_t(r), 0, scale, n);
        }
        ZoEngine clean(*dev, moved, eo);
        ref[p] = clean.forward_loss(mb);
      }
      std::printf("zo dual forward %s tied %d: L+ %.9f (host-perturbed %.9f), L- %.9f (%.9f)\n", dtype_name(dtype),
                  int(tied), l.plus, ref[0], l.minus, ref[1]);
      CHECK(l.plus == ref[0]);  // the same weights bit for bit, the same arithmetic
      CHECK(l.minus == ref[1]);
      CHECK(l.plus != l.minus);
    }
  }
}

}  // namespace strata

namespace strata {

TEST_CASE("ZO: device and host bytes against first order for Llama-3.1-8B shapes", "[zo][engine]") {
  // Nothing is allocated: both engines' buffer tables, and the host store's tiers. The README's
  // memory comparison prints from here.
  const ModelSpec spec = model_spec_build(hf_config_load(testing::source_path("recipes/configs/llama-3.1-8b")), DType::bf16);
  for (int64_t tokens : {1024, 4096}) {
    EngineOptions eo;
    eo.max_batch = 1;
    eo.max_tokens = tokens;
    eo.checkpoints = CheckpointMode::host;
    const EngineShape shape = EngineShape::of(spec, HostStore::layout(spec), eo);
    const size_t first_order = engine_device_bytes(engine_buffer_table(shape, nullptr));
    const size_t ckpt_on_device = shape.layers * Arena::footprint(shape.activation_bytes());
    const size_t zo = ZoEngine::device_bytes(spec, eo);
    std::printf("llama-3.1-8b bf16, 1 x %ld tokens: device bytes first order %.2f GiB (+ %.2f GiB with every layer "
                "checkpoint on the device), zeroth order %.2f GiB; pinned staging first order %.2f GiB, zo %.3f GiB\n",
                long(tokens), double(first_order) / double(1ull << 30), double(ckpt_on_device) / double(1ull << 30),
                double(zo) / double(1ull << 30),
                double(engine_pinned_bytes(engine_buffer_table(shape, nullptr))) / double(1ull << 30),
                double(ZoEngine::pinned_bytes(spec, eo)) / double(1ull << 30));
    CHECK(zo < first_order);
  }
  const HostMemoryEstimate host = HostStore::estimate(spec, HostStoreOptions{});
  HostStoreOptions zo_options;
  zo_options.needs = HostZoSgd::kState;
  const HostMemoryEstimate zo_host = HostStore::estimate(spec, zo_options);
  std::printf("llama-3.1-8b host store: AdamW working %.1f GB, master %.1f GB, moments %.1f GB, grads %.1f GB; ZO-SGD "
              "working + master = %.1f GB (%.3f B/param)\n", double(host.working) / 1e9, double(host.master) / 1e9,
              double(host.moments) / 1e9, double(host.grads) / 1e9, double(zo_host.total()) / 1e9,
              double(zo_host.total()) / double(spec.parameter_count()));
  CHECK(zo_host.total() == host.working + host.master);  // no moments, no gradients
  CHECK(zo_host.moments == 0);
  CHECK(zo_host.grads == 0);
}

}  // namespace strata

namespace strata {

TEST_CASE("ZO step: q perturbations over accumulated micro-batches, and the update they give", "[zo][engine][train]") {
  // zo_step_run against its definition, from separate dual forwards on a second copy of the model:
  // g_j = (ΣL+ − ΣL−) / counted / (2ε) with seed_j = zo_seed(train.seed, step, j), and the master
  // weights moved by the plain-loop twin of ZO-SGD with coefficients g_j / q.
  auto dev = device_create(DeviceOptions{});
  const ModelSpec spec = model_spec_build(tiny_config(2, true), DType::f32);
  HostStore store(*dev, spec), twin(*dev, spec);
  model_init_weights(store, 31);
  model_init_weights(twin, 31);
  const std::vector<MicroBatch> micro = {tiny_batch(2, 17), tiny_batch(1, 17)};
  const int64_t counted = micro[0].counted() + micro[1].counted();
  const ZoStepOptions opt{99, 1e-3, 3};
  const int64_t step = 7;
  const double lr = 2e-3, wd = 0.05;
  ZoEngine engine(*dev, store, capacity(2, 17));
  const ZoStepOutcome out = zo_step_run(engine, opt, micro, counted, step, lr, wd);
  engine.synchronize();

  ZoEngine ref_engine(*dev, twin, capacity(2, 17));
  ZoSgdEstimate est;
  REQUIRE(out.projected.size() == 3);
  for (int j = 0; j < 3; ++j) {
    const uint64_t seed = zo::zo_seed(99, uint64_t(step), uint32_t(j));
    double plus = 0, minus = 0;
    for (const MicroBatch& mb : micro) {
      const ZoLosses l = ref_engine.dual_forward(mb, seed, 1e-3f);
      plus += l.plus;
      minus += l.minus;
    }
    const double g = (plus / double(counted) - minus / double(counted)) / (2 * double(1e-3f));
    CHECK(out.projected[size_t(j)] == g);
    est.seeds.push_back(seed);
    est.coefs.push_back(float(g / 3));
  }
  CHECK(out.projected[0] != out.projected[1]);  // independent perturbations
  for (size_t r = 0; r < spec.params.size(); ++r) {
    INFO(spec.params[r].name);
    std::vector<float> want(size_t(spec.params[r].numel()));
    twin.get_param(r, want.data());
    ref::zo_sgd_update(want.data(), nullptr, false, est.seeds.data(), est.coefs.data(), 3, uint32_t(r), 0, float(lr),
                       spec.params[r].shape.size() == 2 ? float(wd) : 0.f, int64_t(want.size()));
    CHECK(std::memcmp(want.data(), store.master() + store.f32_table()[r].offset / 4, want.size() * 4) == 0);
  }
}

}  // namespace strata

namespace strata {

TEST_CASE("ZO: one perturbed side alone gives that side of the dual forward, bit for bit", "[zo][engine]") {
  // ZO perturbation parallel runs θ + εz on one rank and θ − εz on the other: each must be the
  // exact loss the dual forward gives for its side, in bf16 and f32, tied and untied.
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool tied : {false, true}) {
      INFO(dtype_name(dtype) << (tied ? " tied" : " untied"));
      auto dev = device_create(DeviceOptions{});
      HostStoreOptions so;
      so.needs = HostZoSgd::kState;
      HostStore store(*dev, model_spec_build(tiny_config(3, tied), dtype), so);
      model_init_weights(store, 5);
      ZoEngine engine(*dev, store, capacity(2, 33));
      const MicroBatch mb = tiny_batch(2, 33);
      const ZoLosses dual = engine.dual_forward(mb, 21, 1e-3f);
      const double plus = engine.perturbed_forward(mb, 21, 1e-3f, 1);
      const double minus = engine.perturbed_forward(mb, 21, 1e-3f, -1);
      CHECK(plus == dual.plus);
      CHECK(minus == dual.minus);
      CHECK(plus != minus);  // the sides differ: the check can fail
      CHECK(engine.perturbed_forward(mb, 22, 1e-3f, 1) != plus);  // another seed, another z
    }
  }
}

TEST_CASE("ZO parallel layouts: sides x data groups per distributed.zo", "[zo][train]") {
  auto at = [](const char* mode, int rank, int size) {
    const ZoParallel p = zo_parallel_layout(zo_parallel_mode_parse(mode), rank, size);
    return std::vector<int>{p.sides, p.side, p.groups, p.group};
  };
  CHECK(at("data", 0, 1) == std::vector<int>{1, 0, 1, 0});
  CHECK(at("data", 2, 3) == std::vector<int>{1, 0, 3, 2});
  CHECK(at("perturbation", 0, 2) == std::vector<int>{2, 0, 1, 0});
  CHECK(at("perturbation", 1, 2) == std::vector<int>{2, 1, 1, 0});
  CHECK(at("2d", 3, 4) == std::vector<int>{2, 1, 2, 1});
  CHECK(at("2d", 4, 6) == std::vector<int>{2, 0, 3, 2});
  CHECK_THROWS_WITH(zo_parallel_layout(ZoParallelMode::perturbation, 0, 4), Catch::Contains("distributed.zo = \"2d\""));
  CHECK_THROWS_WITH(zo_parallel_layout(ZoParallelMode::pairs_by_data, 0, 3), Catch::Contains("even number of ranks"));
  CHECK_THROWS_WITH(zo_parallel_mode_parse("model"), Catch::Contains("\"data\", \"perturbation\" or \"2d\""));
}

}  // namespace strata

namespace strata {

TEST_CASE("ZO layer-major: a step's dual forwards in one run equal one at a time bit for bit, the weights crossing once", "[zo][engine][layer_major]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool tied : {false, true}) {
      // 4 layers and 4 lm_head chunks (25 vocab rows) through 2 slots each: none is still in its
      // slot when the next dual forward comes to it
      const ModelSpec spec = model_spec_build(tiny_config(4, tied), dtype);
      for (size_t k : {2, 3}) {
        for (int q : {1, 2}) {
          INFO(dtype_name(dtype) << (tied ? " tied" : " untied") << ", k " << k << ", q " << q);
          auto dev = device_create(DeviceOptions{});
          const std::vector<MicroBatch> micro = testing::zo_uneven_batches(k, 97);
          const int64_t pairs = int64_t(k) * q;
          const testing::ZoScheduleRun one = testing::zo_schedule_run(*dev, spec, 3, micro, q, 1, 2, 25);
          const testing::ZoScheduleRun major = testing::zo_schedule_run(*dev, spec, 3, micro, q, pairs, 2, 25);
          CHECK(testing::zo_schedule_runs_equal(one, major));
          CHECK(major.steps[0].projected != major.steps[1].projected);  // the steps moved: the check can fail
          REQUIRE(major.W == one.W);
          for (size_t s = 0; s < 2; ++s) {
            CHECK(major.weight_h2d[s] == major.W);  // once per step, whatever k and q
            // one at a time: every layer and chunk per dual forward, the final norm (C f32) once per step
            CHECK(one.weight_h2d[s] == size_t(pairs) * major.W - size_t(pairs - 1) * size_t(spec.config.hidden_size) * 4);
          }
          // the device holds 2 x pairs branches' hidden states and statistics: the table's rows
          EngineOptions eo = capacity(2, 17);
          eo.group = pairs;
          eo.head_chunk_rows = 25;
          CHECK(major.device_bytes == ZoEngine::device_bytes(spec, eo));
          CHECK(major.device_bytes > one.device_bytes);
          std::printf("zo %s %s k %zu q %d: weight bytes per step one at a time %.3f W, layer-major %.3f W; device "
                      "%zu B against %zu B\n", dtype_name(dtype), tied ? "tied" : "untied", k, q,
                      double(one.weight_h2d[1]) / double(one.W), double(major.weight_h2d[1]) / double(major.W),
                      major.device_bytes, one.device_bytes);
        }
      }
    }
  }
}

TEST_CASE("ZO layer-major: runs of fewer pairs than the step, and one side alone, give the same bits", "[zo][engine][layer_major]") {
  const ModelSpec spec = model_spec_build(tiny_config(4, false), DType::bf16);
  auto dev = device_create(DeviceOptions{});
  const std::vector<MicroBatch> micro = testing::zo_uneven_batches(3, 97);
  // 3 x 2 pairs two at a time: runs that split the micro-batches of one perturbation and join two
  const testing::ZoScheduleRun one = testing::zo_schedule_run(*dev, spec, 8, micro, 2, 1, 2, 25);
  const testing::ZoScheduleRun two = testing::zo_schedule_run(*dev, spec, 8, micro, 2, 2, 2, 25);
  CHECK(testing::zo_schedule_runs_equal(one, two));
  CHECK(two.weight_h2d[0] < one.weight_h2d[0]);
  // perturbation parallel runs one side per rank: each side of a layer-major run alone
  HostStoreOptions so;
  so.needs = HostZoSgd::kState;
  HostStore store(*dev, spec, so);
  model_init_weights(store, 8);
  EngineOptions eo = capacity(2, 17);
  eo.group = 4;
  ZoEngine engine(*dev, store, eo);
  const std::vector<ZoPair> pairs = {{&micro[0], 5}, {&micro[1], 5}, {&micro[2], 6}, {&micro[0], 6}};
  const std::vector<double> both = engine.perturbed_forwards(pairs, 1e-3f, {+1, -1});
  const std::vector<double> plus = engine.perturbed_forwards(pairs, 1e-3f, {+1});
  const std::vector<double> minus = engine.perturbed_forwards(pairs, 1e-3f, {-1});
  REQUIRE(both.size() == 8);
  for (size_t i = 0; i < pairs.size(); ++i) {
    INFO("pair " << i);
    CHECK(plus[i] == both[2 * i]);
    CHECK(minus[i] == both[2 * i + 1]);
    const ZoLosses alone = engine.dual_forward(*pairs[i].micro, pairs[i].seed, 1e-3f);
    CHECK(alone.plus == both[2 * i]);
    CHECK(alone.minus == both[2 * i + 1]);
  }
  CHECK(both[0] != both[6]);  // micro-batch 0 under seeds 5 and 6: the check can fail
}

}  // namespace strata
