// `strata quantize --model DIR --out DIR2 [--base-dtype nf4] [--no-double-quant]`: a Hugging Face
// model dir written as transformers saves a bitsandbytes load_in_4bit model (offload/state/nf4_hf.h):
// every decoder layer's linear weights quantized to NF4 exactly as lora.base_dtype = "nf4" does at
// load (bitsandbytes' codes and absmax, kernels/cpu/nf4.h), embeddings, norms and lm_head in bf16,
// config.json with its quantization_config; the other files of DIR (tokenizer, generation config)
// copied. Such a dir trains with lora.base_dtype = "nf4" as it is.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "offload/state/model_io.h"
#include "offload/state/nf4_hf.h"
#include "offload/state/nf4_layout.h"
#include "src/cli/commands.h"
#include "src/core/error.h"

namespace strata {

int cmd_quantize(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  std::string model, out, base_dtype = "nf4";
  bool double_quant = true;
  const char* usage = "usage: strata quantize --model DIR --out DIR2 [--base-dtype nf4] [--no-double-quant]";
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const char* flag) {
      STRATA_CHECK(i + 1 < args.size(), flag, " needs a value; ", usage);
      return args[++i];
    };
    if (args[i] == "--help" || args[i] == "-h") {
      std::cout << usage << "\n\nWrites DIR's model as transformers saves a bitsandbytes load_in_4bit model: each decoder\n"
                << "layer's linear weights as NF4 codes + absmax (blocks of 64; double-quantized unless\n"
                << "--no-double-quant), the rest in bf16, config.json with quantization_config.\n";
      return 0;
    } else if (args[i] == "--model") {
      model = value("--model");
    } else if (args[i] == "--out") {
      out = value("--out");
    } else if (args[i] == "--base-dtype") {
      base_dtype = value("--base-dtype");
    } else if (args[i] == "--no-double-quant") {
      double_quant = false;
    } else {
      STRATA_CHECK(false, "unknown argument \"", args[i], "\"; ", usage);
    }
  }
  STRATA_CHECK(!model.empty() && !out.empty(), "--model and --out are required; ", usage);
  STRATA_CHECK(base_dtype == "nf4", "--base-dtype ", base_dtype, ": strata quantizes to \"nf4\" only (fp4 and int8 "
               "are not built)");
  STRATA_CHECK(fs::weakly_canonical(model) != fs::weakly_canonical(out), "--out must be another dir than --model");
  const ModelConfig cfg = hf_config_load(model);
  STRATA_CHECK(!hf_quantization_of(cfg, model).nf4, model, " is already NF4-quantized");
  ModelSpec spec = model_spec_build(cfg, DType::bf16);
  nf4_base_enable(spec, double_quant);
  auto dev = device_create(DeviceOptions{});
  HostStoreOptions so;
  so.weights_only = true;
  HostStore store(*dev, spec, so);
  model_load_weights(store, model);
  nf4_hf_save(store, out);
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(model)) {  // tokenizer and the like
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name.find(".safetensors") != std::string::npos) continue;
    fs::copy_file(e.path(), fs::path(out) / name, fs::copy_options::overwrite_existing, ec);
    STRATA_CHECK_IO(!ec, "cannot copy ", e.path().string(), " to ", out, ": ", ec.message());
  }
  size_t layers = 0;
  for (size_t l = 0; l < spec.layers.size(); ++l) layers += store.layer_group(l).working_bytes;
  std::printf("strata quantize: %s -> %s: %zu decoder layers as NF4%s, %.3f bytes per decoder-layer parameter\n",
              model.c_str(), out.c_str(), spec.layers.size(), double_quant ? " (double-quantized)" : "",
              double(layers) / double(spec.parameter_count() - spec.params[size_t(spec.embed)].numel() -
                                      (spec.lm_head == kAbsent ? 0 : spec.params[size_t(spec.lm_head)].numel()) -
                                      spec.params[size_t(spec.final_norm)].numel()));
  return 0;
}

}  // namespace strata
