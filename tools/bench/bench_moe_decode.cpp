// strata-bench moe-decode: the generator's decode on a mixture-of-experts model with streamed
// weights (offload/engine/routed_decode.h), routed uploads against whole-layer ones: decoder-layer
// weight bytes over the link per decoded token (the generator's stats, and the device's own h2d
// counter for the whole generate call), and decode tokens/s, on a random qwen3_moe (default E = 64,
// k = 8). The CPU backend's link can be throttled (--link-gbs) to stand for PCIe.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "offload/engine/generator.h"
#include "offload/state/model_io.h"
#include "src/core/error.h"

namespace strata::bench {
namespace {

struct MoeDecodeArgs {
  int64_t hidden = 512, experts = 64, top_k = 8, moe_intermediate = 256, layers = 4, rows = 1, prompt = 16,
          new_tokens = 32;
  DType dtype = DType::bf16;
  double link_gbs = 0;  // 0: unthrottled
};

struct DecodeFigures {
  double weight_bytes_per_token = 0, h2d_bytes_per_token = 0, tokens_per_s = 0;
  int64_t experts_routed = 0, decode_tokens = 0;
  std::vector<int32_t> tokens;  // row 0's
};

DecodeFigures run_decode(Device& dev, HostStore& store, const MoeDecodeArgs& a, bool routed) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, int32_t(store.spec().config.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts(size_t(a.rows), std::vector<int32_t>(size_t(a.prompt)));
  for (auto& p : prompts)
    for (int32_t& t : p) t = id(rng);
  GeneratorPlacement placement;
  placement.weights_resident = false;  // streamed: what routed decode is for
  placement.kv_device_layers = size_t(a.layers);
  Generator gen(dev, store, GeneratorShape{a.rows, a.prompt, a.prompt + a.new_tokens}, placement);
  gen.set_routed_decode(routed);
  STRATA_CHECK(gen.routed_decode() == routed, "routed decode does not apply to this model");
  SamplingOptions so;
  so.max_new_tokens = a.new_tokens;
  const size_t h2d0 = dev.counters().h2d_bytes;
  const std::vector<GenerateResult> out = gen.generate(prompts, so, 0);
  const GenerateStats& st = gen.stats();
  DecodeFigures f;
  f.decode_tokens = st.decode_tokens;
  f.weight_bytes_per_token = double(st.decode_weight_bytes) / double(st.decode_tokens);
  // the whole call's link bytes less the prefill's (its weights: every layer once), per decoded token
  size_t prefill_weights = 0;
  for (size_t l = 0; l < store.spec().layers.size(); ++l) prefill_weights += store.layer_group(l).working_bytes;
  f.h2d_bytes_per_token = double(dev.counters().h2d_bytes - h2d0 - prefill_weights) / double(st.decode_tokens);
  f.tokens_per_s = double(st.decode_tokens) / st.decode_s;
  f.experts_routed = st.decode_experts_routed;
  f.tokens = out[0].tokens;
  return f;
}

}  // namespace

int bench_moe_decode(const std::vector<std::string>& args) {
  MoeDecodeArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& o = args[i];
    const bool v = i + 1 < args.size();
    if (o == "--help" || o == "-h") {
      std::printf("strata-bench moe-decode [--hidden C (512)] [--experts E (64)] [--top-k k (8)]\n"
                  "  [--moe-intermediate I (256)] [--layers L (4)] [--rows B (1)] [--prompt T (16)]\n"
                  "  [--new N (32)] [--dtype bf16|f32] [--link-gbs G (0: unthrottled)]\n");
      return 0;
    } else if (o == "--hidden" && v) a.hidden = std::stoll(args[++i]);
    else if (o == "--experts" && v) a.experts = std::stoll(args[++i]);
    else if (o == "--top-k" && v) a.top_k = std::stoll(args[++i]);
    else if (o == "--moe-intermediate" && v) a.moe_intermediate = std::stoll(args[++i]);
    else if (o == "--layers" && v) a.layers = std::stoll(args[++i]);
    else if (o == "--rows" && v) a.rows = std::stoll(args[++i]);
    else if (o == "--prompt" && v) a.prompt = std::stoll(args[++i]);
    else if (o == "--new" && v) a.new_tokens = std::stoll(args[++i]);
    else if (o == "--dtype" && v) a.dtype = dtype_parse(args[++i]);
    else if (o == "--link-gbs" && v) a.link_gbs = std::stod(args[++i]);
    else STRATA_CHECK(false, "unknown or incomplete option '", o, "' (see strata-bench moe-decode --help)");
  }
  STRATA_CHECK(a.layers >= 3 && a.rows >= 1 && a.prompt >= 1 && a.new_tokens >= 2,
               "--layers must be at least 3 (two slots: every layer streamed each pass), --rows and --prompt "
               "positive, --new at least 2");
  const int64_t heads = std::max<int64_t>(1, a.hidden / 64);
  const nlohmann::json cfg = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
                              {"hidden_size", a.hidden}, {"intermediate_size", 4 * a.hidden},
                              {"moe_intermediate_size", a.moe_intermediate}, {"num_hidden_layers", a.layers},
                              {"num_attention_heads", heads}, {"num_key_value_heads", std::max<int64_t>(1, heads / 4)},
                              {"head_dim", a.hidden / heads}, {"num_experts", a.experts},
                              {"num_experts_per_tok", a.top_k}, {"norm_topk_prob", true}, {"vocab_size", 1024}};
  DeviceOptions dopt;
  dopt.link_bytes_per_s = a.link_gbs * 1e9;
  auto dev = device_create(dopt);
  HostStoreOptions so;
  so.weights_only = true;
  HostStore store(*dev, model_spec_build(hf_config_parse(cfg.dump(), "moe-decode config"), a.dtype), so);
  model_init_weights(store, 11, 0.5);  // a wide spread: tokens route to different experts
  const size_t expert_bytes = size_t(3 * a.moe_intermediate * a.hidden) * dtype_size(a.dtype);
  std::printf("qwen3_moe: C %lld, %lld layers, E %lld, k %lld, I %lld, %s; %lld rows, %lld new tokens; expert %.2f MB, "
              "layer %.2f MB; link %s\n",
              (long long)a.hidden, (long long)a.layers, (long long)a.experts, (long long)a.top_k,
              (long long)a.moe_intermediate, dtype_name(a.dtype), (long long)a.rows, (long long)a.new_tokens,
              double(expert_bytes) / 1e6, double(store.layer_group(0).working_bytes) / 1e6,
              a.link_gbs > 0 ? (std::to_string(a.link_gbs) + " GB/s").c_str() : "unthrottled");

  const DecodeFigures whole = run_decode(*dev, store, a, false), routed = run_decode(*dev, store, a, true);
  STRATA_CHECK(whole.tokens == routed.tokens, "routed decode changed the tokens");
  std::printf("%-12s %22s %22s %16s %14s\n", "decode", "weight MB / token", "h2d MB / token", "tokens / s",
              "experts / pass");
  for (const auto& [name, f] : {std::pair<const char*, const DecodeFigures*>{"whole-layer", &whole}, {"routed", &routed}})
    std::printf("%-12s %22.3f %22.3f %16.1f %14.1f\n", name, f->weight_bytes_per_token / 1e6,
                f->h2d_bytes_per_token / 1e6, f->tokens_per_s,
                f == &routed ? double(f->experts_routed) * double(a.rows) / double(f->decode_tokens) /
                                   double(a.layers)
                             : double(a.experts));
  const double ratio = routed.weight_bytes_per_token / whole.weight_bytes_per_token;
  std::printf("routed / whole-layer bytes per token %.4f; decode speed x%.2f; tokens equal\n", ratio,
              routed.tokens_per_s / whole.tokens_per_s);
  std::printf("{\"bench\": \"moe-decode\", \"experts\": %lld, \"top_k\": %lld, \"rows\": %lld, "
              "\"whole_bytes_per_token\": %.0f, \"routed_bytes_per_token\": %.0f, \"bytes_ratio\": %.4f, "
              "\"whole_tokens_per_s\": %.2f, \"routed_tokens_per_s\": %.2f}\n",
              (long long)a.experts, (long long)a.top_k, (long long)a.rows, whole.weight_bytes_per_token,
              routed.weight_bytes_per_token, ratio, whole.tokens_per_s, routed.tokens_per_s);
  return 0;
}

}  // namespace strata::bench
