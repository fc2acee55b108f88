#include "models/causal_lm.h"

#include <cstring>

#include "src/core/error.h"

namespace strata {

CausalLM::CausalLM(Device& dev, ModelSpec spec, int64_t max_batch, int64_t max_tokens)
    : dev_(dev), spec_(std::move(spec)), max_batch_(max_batch), max_tokens_(max_tokens) {
  const ModelConfig& cfg = spec_.config;
  dims_.B = max_batch;
  dims_.T = max_tokens;
  dims_.C = cfg.hidden_size;
  dims_.H = cfg.num_attention_heads;
  dims_.Hk = cfg.num_key_value_heads;
  dims_.D = cfg.head_dim;
  dims_.F = cfg.intermediate_size;
  dims_.eps = float(cfg.rms_norm_eps);
  dims_.wt = spec_.matrix_dtype;

  for (auto& r : spec_.params.rows())
    grad_table_.add(TensorSpec{r.name, r.shape, DType::f32, Tier::device});
  const size_t weight_bytes = spec_.params.layout(Tier::device);
  const size_t grad_bytes = grad_table_.layout(Tier::device);

  const int64_t N = max_batch * max_tokens, C = dims_.C, L = cfg.num_hidden_layers;
  weights_ = static_cast<char*>(dev_.alloc(weight_bytes, "model weights"));
  grads_ = static_cast<char*>(dev_.alloc(grad_bytes, "model gradients"));
  weights_host_ = static_cast<char*>(dev_.alloc_pinned(weight_bytes));
  std::memset(weights_host_, 0, weight_bytes);
  checkpoints_ = static_cast<float*>(dev_.alloc(size_t((L + 1) * N * C) * 4, "layer checkpoints"));
  hn_ = static_cast<float*>(dev_.alloc(size_t(N * C) * 4, "final norm output"));
  rstd_final_ = static_cast<float*>(dev_.alloc(size_t(N) * 4, "final norm rstd"));
  dhn_ = static_cast<float*>(dev_.alloc(size_t(N * C) * 4, "d final norm output"));
  dx_a_ = static_cast<float*>(dev_.alloc(size_t(N * C) * 4, "d hidden (a)"));
  dx_b_ = static_cast<float*>(dev_.alloc(size_t(N * C) * 4, "d hidden (b)"));
  ids_ = static_cast<int32_t*>(dev_.alloc(size_t(N) * 4, "input ids"));
  targets_ = static_cast<int32_t*>(dev_.alloc(size_t(N) * 4, "targets"));
  pos_ = static_cast<int32_t*>(dev_.alloc(size_t(N) * 4, "positions"));
  doc_start_ = static_cast<int32_t*>(dev_.alloc(size_t(N) * 4, "document starts"));
  loss_ = static_cast<double*>(dev_.alloc(sizeof(double), "loss"));
  std::vector<float> inv = model_rope_inv_freq(cfg);
  inv_freq_ = static_cast<float*>(dev_.alloc(inv.size() * 4, "rope inv_freq"));
  dev_.copy_h2d(inv_freq_, inv.data(), inv.size() * 4, Stream::compute);
  workspace_ = dev_.alloc(layer_workspace_bytes(dims_), "layer workspace");
  ws_ = layer_workspace_carve(dims_, workspace_);
  dev_.stream_synchronize(Stream::compute);
}

CausalLM::~CausalLM() {
  dev_.synchronize();
  for (void* p : {(void*)weights_, (void*)grads_, (void*)checkpoints_, (void*)hn_, (void*)rstd_final_,
                  (void*)dhn_, (void*)dx_a_, (void*)dx_b_, (void*)ids_, (void*)targets_, (void*)pos_,
                  (void*)doc_start_, (void*)loss_, (void*)inv_freq_, workspace_})
    dev_.free(p);
  dev_.free_pinned(weights_host_);
}

void CausalLM::set_param(size_t row, const float* values) {
  const TensorSpec& r = spec_.params[row];
  dtype_convert(weights_host_ + r.offset, r.dtype, values, DType::f32, size_t(r.numel()));
}

void CausalLM::get_param(size_t row, float* values) const {
  const TensorSpec& r = spec_.params[row];
  dtype_convert(values, DType::f32, weights_host_ + r.offset, r.dtype, size_t(r.numel()));
}

void CausalLM::upload_weights() {
  dev_.copy_h2d(weights_, weights_host_, spec_.params.tier_bytes(Tier::device), Stream::compute);
  dev_.stream_synchronize(Stream::compute);
}

void CausalLM::zero_grads() {
  dev_.memset_zero(grads_, grad_table_.tier_bytes(Tier::device), Stream::compute);
}

void CausalLM::download_grads(std::vector<float>& out) {
  out.resize(grad_table_.tier_bytes(Tier::device) / 4);
  dev_.copy_d2h(out.data(), grads_, out.size() * 4, Stream::compute);
  dev_.stream_synchronize(Stream::compute);
}

const void* CausalLM::weight(int64_t row) const {
  return row == kAbsent ? nullptr : weights_ + spec_.params[size_t(row)].offset;
}
float* CausalLM::grad(int64_t row) {
  return row == kAbsent ? nullptr : reinterpret_cast<float*>(grads_ + grad_table_[size_t(row)].offset);
}

LayerWeights CausalLM::layer_weights(size_t i) const {
  const LayerParamRows& r = spec_.layers[i];
  auto f = [&](int64_t row) { return static_cast<const float*>(weight(row)); };
  LayerWeights w;
  w.q = weight(r.q); w.k = weight(r.k); w.v = weight(r.v); w.o = weight(r.o);
  w.gate = weight(r.gate); w.up = weight(r.up); w.down = weight(r.down);
  w.input_norm = f(r.input_norm); w.post_norm = f(r.post_norm);
  w.q_norm = f(r.q_norm); w.k_norm = f(r.k_norm);
  w.q_bias = f(r.q_bias); w.k_bias = f(r.k_bias); w.v_bias = f(r.v_bias); w.o_bias = f(r.o_bias);
  return w;
}

LayerGrads CausalLM::layer_grads(size_t i) {
  const LayerParamRows& r = spec_.layers[i];
  LayerGrads g;
  g.q = grad(r.q); g.k = grad(r.k); g.v = grad(r.v); g.o = grad(r.o);
  g.gate = grad(r.gate); g.up = grad(r.up); g.down = grad(r.down);
  g.input_norm = grad(r.input_norm); g.post_norm = grad(r.post_norm);
  g.q_norm = grad(r.q_norm); g.k_norm = grad(r.k_norm);
  g.q_bias = grad(r.q_bias); g.k_bias = grad(r.k_bias); g.v_bias = grad(r.v_bias); g.o_bias = grad(r.o_bias);
  return g;
}

void CausalLM::upload_tokens(const MicroBatch& mb) {
  STRATA_CHECK(mb.B >= 1 && mb.T >= 1 && mb.B <= max_batch_ && mb.T <= max_tokens_,
               "micro-batch of ", mb.B, "x", mb.T, " tokens exceeds the model's buffers (",
               max_batch_, "x", max_tokens_, ")");
  const size_t n = size_t(mb.B * mb.T);
  STRATA_ASSERT(mb.ids.size() == n && mb.targets.size() == n && mb.pos.size() == n);
  const int64_t V = spec_.config.vocab_size;
  for (size_t i = 0; i < n; ++i) {
    STRATA_CHECK(mb.ids[i] >= 0 && mb.ids[i] < V, "token id ", mb.ids[i], " at position ", i,
                 " is outside the vocabulary [0, ", V, ")");
    STRATA_CHECK(mb.targets[i] == -100 || (mb.targets[i] >= 0 && mb.targets[i] < V), "label ",
                 mb.targets[i], " at position ", i, " is neither -100 nor in [0, ", V, ")");
  }
  dims_.B = mb.B;
  dims_.T = mb.T;
  has_docs_ = !mb.doc_start.empty();
  dev_.copy_h2d(ids_, mb.ids.data(), n * 4, Stream::compute);
  dev_.copy_h2d(targets_, mb.targets.data(), n * 4, Stream::compute);
  dev_.copy_h2d(pos_, mb.pos.data(), n * 4, Stream::compute);
  if (has_docs_) {
    STRATA_ASSERT(mb.doc_start.size() == n);
    dev_.copy_h2d(doc_start_, mb.doc_start.data(), n * 4, Stream::compute);
  }
  // the host vectors must outlive the copies: callers synchronize before returning
}

void CausalLM::forward(const MicroBatch& mb) {
  const Stream s = Stream::compute;
  const int64_t N = mb.B * mb.T, C = dims_.C;
  const auto& emb = spec_.params[size_t(spec_.embed)];
  dev_.embedding_forward(s, checkpoints_, weight(spec_.embed), emb.dtype, ids_, N, C);
  TokenContext ctx{pos_, has_docs_ ? doc_start_ : nullptr, inv_freq_};
  for (size_t i = 0; i < spec_.layers.size(); ++i)
    layer_forward(dev_, s, dims_, layer_weights(i), ctx, ws_, checkpoints_ + (i + 1) * N * C,
                  checkpoints_ + i * N * C);
  dev_.rmsnorm_forward(s, hn_, rstd_final_, checkpoints_ + spec_.layers.size() * N * C,
                       static_cast<const float*>(weight(spec_.final_norm)), N, C, dims_.eps);
}

double CausalLM::forward_loss(const MicroBatch& mb) {
  upload_tokens(mb);
  forward(mb);
  const int64_t N = mb.B * mb.T;
  const int64_t head = spec_.lm_head_row();
  dev_.memset_zero(loss_, sizeof(double), Stream::compute);
  dev_.lm_head_ce(Stream::compute, loss_, nullptr, nullptr, hn_, weight(head),
                  spec_.params[size_t(head)].dtype, targets_, N, dims_.C, spec_.config.vocab_size, 1.f);
  double loss = 0;
  dev_.copy_d2h(&loss, loss_, sizeof(double), Stream::compute);
  dev_.stream_synchronize(Stream::compute);
  return loss;
}

double CausalLM::forward_backward(const MicroBatch& mb, float grad_scale) {
  const Stream s = Stream::compute;
  upload_tokens(mb);
  forward(mb);
  const int64_t N = mb.B * mb.T, C = dims_.C, L = int64_t(spec_.layers.size());
  const int64_t head = spec_.lm_head_row();
  dev_.memset_zero(loss_, sizeof(double), s);
  dev_.lm_head_ce(s, loss_, dhn_, grad(head), hn_, weight(head), spec_.params[size_t(head)].dtype,
                  targets_, N, C, spec_.config.vocab_size, grad_scale);
  dev_.rmsnorm_backward(s, dx_a_, grad(spec_.final_norm), dhn_, checkpoints_ + L * N * C,
                        static_cast<const float*>(weight(spec_.final_norm)), rstd_final_, N, C);
  TokenContext ctx{pos_, has_docs_ ? doc_start_ : nullptr, inv_freq_};
  float* dout = dx_a_;
  float* dx = dx_b_;
  for (int64_t i = L - 1; i >= 0; --i) {
    LayerGrads g = layer_grads(size_t(i));
    layer_backward(dev_, s, dims_, layer_weights(size_t(i)), g, ctx, ws_, dx, dout,
                   checkpoints_ + i * N * C);
    std::swap(dx, dout);
  }
  dev_.embedding_backward(s, grad(spec_.embed), dout, ids_, N, C);
  double loss = 0;
  dev_.copy_d2h(&loss, loss_, sizeof(double), s);
  dev_.stream_synchronize(s);
  return loss;
}

}  // namespace strata
