#!/usr/bin/env python3
"""Writes the LoRA golden of Phi-3's fused projections (tests/golden/lora_grad/phi3/) from PEFT
itself: peft.get_peft_model on transformers' Phi3ForCausalLM, run in float64.

The model and batch are tests/golden/phi3 (make_phi3_goldens.py). PEFT puts one adapter on each
fused linear named in target_modules (qkv_proj: A (r, C), B (H*D + 2*Hk*D, r); gate_up_proj:
B (2F, r)); A and B are drawn nonzero (PEFT initialises B to 0, which would leave dA zero) and
rounded to f32. Written: adapter/adapter_config.json and adapter/adapter_model.safetensors (F32,
PEFT's names), grads.safetensors (d loss / d A and B, F32 of the float64 values, the same names)
and expected.json (loss, tokens, r, alpha, targets), as tests/models/test_lora_grad.cpp reads them.

Needs torch, transformers 5.x and peft (a venv from PyPI); the build and the tests never run it.
From the repository root:
    python tools/golden/make_phi3_lora_goldens.py
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import safetensors_write_blobs  # noqa: E402

import peft  # noqa: E402
from transformers import Phi3ForCausalLM  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO_ROOT, "tests", "golden", "phi3")
OUT = os.path.join(REPO_ROOT, "tests", "golden", "lora_grad", "phi3")
R, ALPHA, TARGETS = 3, 7.0, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
IGNORE = -100


def f32_bytes(t):
    return t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()


def main():
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    model = Phi3ForCausalLM.from_pretrained(MODEL, dtype=torch.float64, attn_implementation="eager")
    model = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS,
                                                       lora_dropout=0.0, bias="none"))
    model.eval()
    g = torch.Generator().manual_seed(4242)
    adapters = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" not in name:
                continue
            assert p.dtype == torch.float64, name
            scale = 1.0 / p.shape[1] ** 0.5
            p.copy_((scale * torch.randn(p.shape, generator=g, dtype=torch.float64)).to(torch.float32).to(torch.float64))
            adapters[name] = p
    with open(os.path.join(MODEL, "batch.json")) as f:
        batch = json.load(f)
    ids, labels = torch.tensor(batch["input_ids"]), torch.tensor(batch["labels"])
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    tokens = int((labels[:, 1:] != IGNORE).sum())
    with torch.no_grad(), model.disable_adapter():
        base = model(input_ids=ids, labels=labels).loss.item()
    print("phi3 lora: r %d alpha %g targets %s: loss %.12f (base %.12f), tokens %d, %d adapter tensors" % (
        R, ALPHA, ",".join(TARGETS), loss.item(), base, tokens, len(adapters)))
    assert abs(loss.item() - base) > 1e-3, "the adapters must change the loss"

    def peft_name(n):  # base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.default.weight -> no ".default"
        return n.replace(".default.", ".")
    os.makedirs(os.path.join(OUT, "adapter"), exist_ok=True)
    names = sorted(adapters)
    for n in names:
        print("  %s %s grad norm %.4g" % (peft_name(n), tuple(adapters[n].shape), float(adapters[n].grad.norm())))
    safetensors_write_blobs(os.path.join(OUT, "adapter", "adapter_model.safetensors"),
                            [(peft_name(n), "F32", adapters[n].shape, f32_bytes(adapters[n])) for n in names],
                            metadata={"format": "pt"})
    safetensors_write_blobs(os.path.join(OUT, "grads.safetensors"),
                            [(peft_name(n), "F32", adapters[n].shape, f32_bytes(adapters[n].grad)) for n in names],
                            metadata={"format": "pt"})
    config = {"base_model_name_or_path": "tests/golden/phi3", "bias": "none", "lora_alpha": ALPHA, "lora_dropout": 0.0,
              "peft_type": "LORA", "r": R, "target_modules": TARGETS, "task_type": "CAUSAL_LM"}
    with open(os.path.join(OUT, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"loss": loss.item(), "tokens": tokens, "r": R, "alpha": ALPHA, "targets": TARGETS}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
