#!/usr/bin/python3
"""Writes the LoRA merge fixtures (tests/golden/lora/) for `strata generate --adapter`.

The base is the golden llama model (tests/golden/llama: BF16 on disk, tied embeddings). The
script makes a PEFT LoRA adapter for it by hand (no peft package; the tensor names and
adapter_config.json fields PEFT's save_pretrained writes):
  adapter/adapter_config.json        r = 3, lora_alpha = 7.5 (scale 2.5), six of the seven
                                     module kinds (up_proj is left out), fan_in_fan_out false
  adapter/adapter_model.safetensors  base_model.model.<module>.lora_A.weight (r, in) and
                                     .lora_B.weight (out, r); F32, except layer 1's lora_B in BF16
and the merged model PEFT's math gives, in torch:
  merged/config.json, merged/model.safetensors
      W' = bf16( float32(W) + (B @ A) * (lora_alpha / r) )   (f32 product and sum, one rounding)
B is random (not PEFT's zero init), so the merge changes the model.

Run from the repository root:  /usr/bin/python3 tools/golden/make_lora_goldens.py
"""

import json
import os
import shutil

import torch

from make_model_goldens import safetensors_read, tensor_to_bytes
from safetensors_file import safetensors_write_blobs

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE_DIR = os.path.join(REPO_ROOT, "tests", "golden", "llama")
OUT_DIR = os.path.join(REPO_ROOT, "tests", "golden", "lora")

R = 3
ALPHA = 7.5
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]
MODULE_PATH = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
               "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def main():
    torch.manual_seed(1717)
    with open(os.path.join(BASE_DIR, "config.json")) as f:
        config = json.load(f)
    base = safetensors_read(os.path.join(BASE_DIR, "model.safetensors"))  # float64 of the BF16 values
    scale = ALPHA / R

    adapter, merged = [], {}
    for name, w in base.items():
        merged[name] = w
    for layer in range(config["num_hidden_layers"]):
        for kind in TARGETS:
            module = "model.layers.%d.%s.%s" % (layer, MODULE_PATH[kind], kind)
            w = base[module + ".weight"]  # (out, in), exact in f32
            out_f, in_f = w.shape
            a = (torch.randn(R, in_f, dtype=torch.float64) * 0.1).to(torch.float32)   # (r, in)
            b = (torch.randn(out_f, R, dtype=torch.float64) * 0.1).to(torch.float32)  # (out, r)
            b_dtype = "BF16" if layer == 1 else "F32"
            if b_dtype == "BF16":
                b = b.to(torch.bfloat16).to(torch.float32)
            adapter.append(("base_model.model.%s.lora_A.weight" % module, "F32", a.shape,
                            tensor_to_bytes(a.to(torch.float64), "F32")))
            adapter.append(("base_model.model.%s.lora_B.weight" % module, b_dtype, b.shape,
                            tensor_to_bytes(b.to(torch.float64), b_dtype)))
            w_new = (w.to(torch.float32) + torch.matmul(b, a) * scale).to(torch.bfloat16)
            merged[module + ".weight"] = w_new.to(torch.float64)

    if os.path.isdir(OUT_DIR):
        shutil.rmtree(OUT_DIR)
    os.makedirs(os.path.join(OUT_DIR, "adapter"))
    os.makedirs(os.path.join(OUT_DIR, "merged"))
    adapter_config = {
        "alpha_pattern": {},
        "base_model_name_or_path": "tests/golden/llama",
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_to_transform": None,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": R,
        "rank_pattern": {},
        "target_modules": TARGETS,
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    with open(os.path.join(OUT_DIR, "adapter", "adapter_config.json"), "w") as f:
        json.dump(adapter_config, f, indent=2, sort_keys=True)
        f.write("\n")
    safetensors_write_blobs(os.path.join(OUT_DIR, "adapter", "adapter_model.safetensors"), adapter,
                            metadata={"format": "pt"})
    shutil.copyfile(os.path.join(BASE_DIR, "config.json"), os.path.join(OUT_DIR, "merged", "config.json"))
    safetensors_write_blobs(os.path.join(OUT_DIR, "merged", "model.safetensors"),
                            [(n, "BF16", t.shape, tensor_to_bytes(t, "BF16")) for n, t in merged.items()],
                            metadata={"format": "pt"})
    changed = sum(int((merged[n] != base[n]).sum()) for n in base)
    print("wrote %s: %d adapter tensors, %d of %d weights changed by the merge (scale %g)" % (
        OUT_DIR, len(adapter), changed, sum(t.numel() for t in base.values()), scale))


if __name__ == "__main__":
    main()
