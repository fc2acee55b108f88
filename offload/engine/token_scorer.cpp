// The forward-only token scorer (token_scorer.h): its buffer table, one pass (embedding, layers,
// final norm, lm_head statistics), and the frozen copy of a store's weights.
#include "offload/engine/token_scorer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "offload/state/nf4_layout.h"
#include "offload/stream/buffer_binding.h"
#include "src/core/error.h"

namespace strata {

// ---- set-up -----------------------------------------------------------------------------------

std::vector<EngineBuffer> token_scorer_buffer_table(const ModelSpec& spec, int64_t B, int64_t T,
                                                    TokenScorerBuffers* into) {
  const LayerDims d = generator_layer_dims(spec, B, T);
  const int64_t N = d.N(), C = d.C, R = generator_head_rows(spec);
  const size_t L = spec.layers.size(), K = size_t((spec.config.vocab_size + R - 1) / R);
  std::vector<EngineBuffer> t;
  auto dev = [&](std::string name, size_t bytes, std::function<void(void*)> to) {
    t.push_back({std::move(name), bytes, Memory::device, std::move(to)});
  };
  dev("layer forward workspace", spec.layer_bytes(LayerBuffer::forward_workspace, d), bind_at(into ? &into->workspace : nullptr));
  dev("hidden states a", bytes_of<float>(N * C), bind_at(into ? &into->x_a : nullptr));
  dev("hidden states b", bytes_of<float>(N * C), bind_at(into ? &into->x_b : nullptr));
  dev("final norm output", bytes_of<float>(N * C), bind_at(into ? &into->hn : nullptr));
  dev("final norm rstd", bytes_of<float>(N), bind_at(into ? &into->rstd : nullptr));
  dev("positions", bytes_of<int32_t>(N), bind_at(into ? &into->pos : nullptr));
  dev("targets", bytes_of<int32_t>(N), bind_at(into ? &into->targets : nullptr));
  dev("rope inv_freq", bytes_of<float>(int64_t(model_rope_inv_freq(spec.config).size())), bind_at(into ? &into->inv_freq : nullptr));
  dev("final norm weight", bytes_of<float>(C), bind_at(into ? &into->final_norm : nullptr));
  dev("lm_head statistics", size_t(3 * N) * sizeof(double), bind_at(into ? &into->stats : nullptr));
  const size_t slots = std::min<size_t>(2, L), head_slots = std::min<size_t>(2, K);
  const size_t slot_bytes = layer_slot_bytes(HostStore::layout(spec), L).total();
  if (into) into->weight_slots.assign(slots, nullptr), into->head_slots.assign(head_slots, nullptr);
  for (size_t s = 0; s < slots; ++s)
    dev(str_cat("layer weight slot ", s), slot_bytes, bind_at(into ? &into->weight_slots[s] : nullptr));
  for (size_t s = 0; s < head_slots; ++s)
    dev(str_cat("lm_head chunk slot ", s, " (", R, " vocab rows)"), size_t(R * C) * dtype_size(spec.matrix_dtype),
        bind_at(into ? &into->head_slots[s] : nullptr));
  t.push_back({"embedding gathered (host)", bytes_of<float>(N * C), Memory::pinned, bind_at(into ? &into->x_host : nullptr)});
  return t;
}

size_t token_scorer_device_bytes(const ModelSpec& spec, int64_t B, int64_t T) {
  return engine_device_bytes(token_scorer_buffer_table(spec, B, T, nullptr));
}

TokenScorer::TokenScorer(Device& dev, HostStore& store, int64_t B, int64_t T)
    : dev_(dev), store_(store), capacity_(generator_layer_dims(store.spec(), B, T)) {
  STRATA_ASSERT(B >= 1 && T >= 1, "a token scorer for no tokens");
  table_ = token_scorer_buffer_table(store.spec(), B, T, &buf_);
  engine_buffers_allocate(dev_, table_, "reference: ");
  LayerPassSlots slots;
  slots.layers = buf_.weight_slots;
  slots.head = buf_.head_slots;
  slots.final_norm = buf_.final_norm;
  slots.head_rows = generator_head_rows(store.spec());
  layer_pass_ = std::make_unique<LayerPass>(dev_, store_, slots, /*updates=*/false);
  layer_pass_->rope_upload(buf_.inv_freq);
  dev_.stream_synchronize(Stream::compute);
}

TokenScorer::~TokenScorer() {
  try {
    if (layer_pass_) layer_pass_->synchronize();
  } catch (...) {  // already reported on the caller's path; still free everything
  }
  engine_buffers_free(dev_, table_);
}

// ---- one pass ---------------------------------------------------------------------------------

std::vector<double> TokenScorer::token_logps(const MicroBatch& mb) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelSpec& spec = store_.spec();
  const int64_t N = mb.B * mb.T, C = spec.config.hidden_size, V = spec.config.vocab_size;
  STRATA_ASSERT(N >= 1 && mb.B <= capacity_.B && mb.T <= capacity_.T && int64_t(mb.ids.size()) == N &&
                    int64_t(mb.targets.size()) == N && int64_t(mb.pos.size()) == N && mb.doc_start.empty(),
                "reference pass: a micro-batch of ", mb.B, " x ", mb.T, " tokens on a scorer for ", capacity_.B, " x ",
                capacity_.T);
  const Stream s = Stream::compute;
  LayerDims d = generator_layer_dims(spec, mb.B, mb.T);  // the engine's dims for B x T
  d.max_pos = layer_dims_max_pos(mb.pos);
  const LayerScratch ws{static_cast<char*>(buf_.workspace), nullptr, capacity_, false};
  dev_.copy_h2d(buf_.pos, mb.pos.data(), bytes_of<int32_t>(N), s);
  dev_.copy_h2d(buf_.targets, mb.targets.data(), bytes_of<int32_t>(N), s);
  layer_pass_->embed_gather(buf_.x_host, mb.ids.data(), N);
  dev_.copy_h2d(buf_.x_a, buf_.x_host, bytes_of<float>(N * C), s);

  float *x = buf_.x_a, *y = buf_.x_b;
  const TokenContext ctx{buf_.pos, nullptr, buf_.inv_freq};
  layer_pass_->for_each_layer(false, [&](size_t i, const char* slot) {
    layer_kind(store_, i).forward(dev_, y, x, layer_weights_in(store_, slot, i), ctx, ws, d, s);
    std::swap(x, y);
  });
  dev_.rmsnorm_forward(buf_.hn, buf_.rstd, x, layer_pass_->acquire_final_norm(), N, C, d.eps, s);
  const DType lm_type = store_.working_table()[size_t(spec.lm_head_row())].dtype;
  layer_pass_->for_each_head_chunk(false, [&](size_t k, int64_t v0, int64_t vc, const char* w) {
    dev_.lm_head_ce_chunk_stats(buf_.stats, buf_.hn, w, lm_type, buf_.targets, N, C, V, v0, vc, k == 0, nullptr, s);
  });
  stats_host_.resize(size_t(3 * N));
  dev_.copy_d2h(stats_host_.data(), buf_.stats, size_t(3 * N) * sizeof(double), s);
  dev_.stream_synchronize(s);

  std::vector<double> logp(size_t(N), std::numeric_limits<double>::quiet_NaN());
  for (int64_t i = 0; i < N; ++i) {
    if (mb.targets[size_t(i)] == -100) continue;
    const double* st = &stats_host_[size_t(3 * i)];  // {max, Σ exp(z - max), z_target}
    logp[size_t(i)] = st[2] - st[0] - std::log(st[1]);
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return logp;
}

// ---- the frozen copy --------------------------------------------------------------------------

std::unique_ptr<HostStore> frozen_weights_copy(Device& dev, const HostStore& store) {
  STRATA_CHECK(!store.packed(), "a frozen copy of an NF4 base is not needed (LoRA's reference is the base itself)");
  HostStoreOptions so;
  so.weights_only = true;
  auto copy = std::make_unique<HostStore>(dev, store.spec(), so);
  for (size_t g = 0; g < store.groups().size(); ++g) {
    const ParamGroup& grp = store.groups()[g];
    char* dst = copy->working() + grp.working_offset;
    if (g >= 1 && g <= store.spec().layers.size() && store.layer_derived(g - 1))
      store.derive_working(g - 1, dst);  // no working copy kept: made from the master, as for an upload
    else
      std::memcpy(dst, store.working() + grp.working_offset, grp.working_bytes);
  }
  return copy;
}

}  // namespace strata
