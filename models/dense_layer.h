// The dense Llama-family layer kind (llama, mistral, qwen2, qwen3): RMSNorm, attention with
// optional q/k/v and o biases and per-head q/k norms, RMSNorm, SwiGLU MLP; its math is
// models/decoder_layer.h. Outside models/ it is reached only as a LayerKind
// (models/layer_kind.h); the named views below are for this kind's own tests.
#pragma once
#include "models/decoder_layer.h"
#include "models/model_spec.h"

namespace strata {

// Row indices into ModelSpec::params for one dense layer; kAbsent where the family has none.
// The fields are in the kind's parameter order (its rows' order in the table).
struct LayerParamRows {
  int64_t input_norm = kAbsent, q = kAbsent, k = kAbsent, v = kAbsent, o = kAbsent;
  int64_t q_bias = kAbsent, k_bias = kAbsent, v_bias = kAbsent, o_bias = kAbsent;
  int64_t q_norm = kAbsent, k_norm = kAbsent;
  int64_t post_norm = kAbsent, gate = kAbsent, up = kAbsent, down = kAbsent;
};

// A dense layer's rows, weights and gradients by name, from the seam's positional views.
LayerParamRows dense_layer_rows(const ModelLayer& layer);
LayerWeights dense_layer_weights(const LayerTensors& t);
LayerGrads dense_layer_grads(const LayerGradTensors& t);

}  // namespace strata
