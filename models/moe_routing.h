// Mixture-of-experts routing on the host: from one layer's router logits to the experts each
// token goes to, the rows the experts run over, and back (the router's gradient). Transformers'
// Qwen3MoeTopKRouter and MixtralTopKRouter: probabilities = softmax(logits) over the experts,
// the k largest chosen (ties: the lower expert index), their probabilities renormalised to sum
// to 1 when norm_topk_prob (Mixtral always). The routed rows are laid out expert by expert,
// each expert's tokens in ascending order: a deterministic order for the grouped matmuls.
//
// Why the host: the grouped matmuls' row counts are host sizes (one GEMM per expert that got
// tokens), so the logits come back anyway; N x E values are small beside the layer's matmuls.
//
// Legend: N tokens, E experts, k experts per token, M = N*k routed rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

struct MoeRouting {
  int64_t n = 0, e = 0, k = 0;
  bool renormalised = false;       // the weights are p / (sum of the chosen p) (norm_topk_prob)
  std::vector<float> probs;        // (N, E) softmax of the logits (computed in f64, stored f32)
  std::vector<int32_t> expert;     // (N, k) chosen experts, largest probability first
  std::vector<float> weight;       // (N, k) their routing weights
  std::vector<int32_t> offsets;    // (E + 1) expert e's rows are [offsets[e], offsets[e+1])
  std::vector<int32_t> row_token;  // (M) the token of each routed row
  std::vector<float> row_weight;   // (M) its routing weight
  std::vector<int32_t> token_row;  // (N, k) the row of token t's j-th choice
  int64_t rows() const { return n * k; }
  int64_t expert_rows(int64_t x) const { return offsets[size_t(x) + 1] - offsets[size_t(x)]; }
};

// logits (N, E) f32. Bad sizes: Error(input).
MoeRouting moe_route(const float* logits, int64_t n, int64_t e, int64_t k, bool norm_topk_prob);

// dlogits (N, E) = d loss / d logits, written, from drow_weight (M) = d loss / d row_weight and,
// when dprob is not null, a gradient dprob (E) on every token's probabilities (the load-balancing
// loss's, models/moe_aux_loss.h).
void moe_route_backward(float* dlogits, const MoeRouting& r, const float* drow_weight, const double* dprob);

}  // namespace strata
