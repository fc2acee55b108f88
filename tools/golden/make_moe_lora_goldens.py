#!/usr/bin/env python3
"""Writes the LoRA goldens of the mixture-of-experts families' attention projections
(tests/golden/lora_grad/qwen3_moe/, tests/golden/lora_grad/mixtral/) from PEFT itself:
peft.get_peft_model on transformers' Qwen3MoeForCausalLM / MixtralForCausalLM, run in float64.

The models and batches are tests/golden/qwen3_moe and tests/golden/mixtral (make_moe_goldens.py).
target_modules names the attention projections q_proj, k_proj, v_proj, o_proj (a subset per
case): transformers 5 keeps the experts as packed 3-D parameters and the router as a bare
parameter, which PEFT reaches only through target_parameters (strata refuses those by name). A and
B are drawn nonzero (PEFT initialises B to 0, which would leave dA zero) and rounded to f32.
Written: adapter/adapter_config.json and adapter/adapter_model.safetensors (F32, PEFT's names),
grads.safetensors (d loss / d A and B, F32 of the float64 values, the same names) and
expected.json (loss, tokens, r, alpha, targets), as tests/models/test_lora_grad.cpp reads them.

Needs torch, transformers 5.x and peft (a venv from PyPI); the build and the tests never run it.
From the repository root:
    python tools/golden/make_moe_lora_goldens.py
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import safetensors_write_blobs  # noqa: E402

import peft  # noqa: E402
from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IGNORE = -100
CASES = {  # name -> (model class, r, alpha, target_modules, seed)
    "qwen3_moe": (Qwen3MoeForCausalLM, 3, 7.0, ["q_proj", "k_proj", "v_proj", "o_proj"], 4343),
    "mixtral": (MixtralForCausalLM, 2, 5.0, ["q_proj", "v_proj", "o_proj"], 4344),
}


def f32_bytes(t):
    return t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()


def write_case(name):
    cls, r, alpha, targets, seed = CASES[name]
    model_dir = os.path.join(REPO_ROOT, "tests", "golden", name)
    out = os.path.join(REPO_ROOT, "tests", "golden", "lora_grad", name)
    model = cls.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager",
                                experts_implementation="eager")
    model = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                       lora_dropout=0.0, bias="none"))
    model.eval()
    g = torch.Generator().manual_seed(seed)
    adapters = {}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" not in n:
                continue
            assert p.dtype == torch.float64, n
            scale = 1.0 / p.shape[1] ** 0.5
            p.copy_((scale * torch.randn(p.shape, generator=g, dtype=torch.float64)).to(torch.float32).to(torch.float64))
            adapters[n] = p
    with open(os.path.join(model_dir, "batch.json")) as f:
        batch = json.load(f)
    ids = torch.tensor(batch["input_ids"])
    labels = torch.tensor(batch["labels"]) if "labels" in batch else ids.clone()  # labels default to input_ids
    loss = model(input_ids=ids, labels=labels).loss  # output_router_logits is false: no aux loss
    loss.backward()
    tokens = int((labels[:, 1:] != IGNORE).sum())
    with torch.no_grad(), model.disable_adapter():
        base = model(input_ids=ids, labels=labels).loss.item()
    print("%s lora: r %d alpha %g targets %s: loss %.12f (base %.12f), tokens %d, %d adapter tensors" % (
        name, r, alpha, ",".join(targets), loss.item(), base, tokens, len(adapters)))
    assert abs(loss.item() - base) > 1e-3, "the adapters must change the loss"

    def peft_name(n):  # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight -> no ".default"
        return n.replace(".default.", ".")
    os.makedirs(os.path.join(out, "adapter"), exist_ok=True)
    names = sorted(adapters)
    safetensors_write_blobs(os.path.join(out, "adapter", "adapter_model.safetensors"),
                            [(peft_name(n), "F32", adapters[n].shape, f32_bytes(adapters[n])) for n in names],
                            metadata={"format": "pt"})
    safetensors_write_blobs(os.path.join(out, "grads.safetensors"),
                            [(peft_name(n), "F32", adapters[n].shape, f32_bytes(adapters[n].grad)) for n in names],
                            metadata={"format": "pt"})
    config = {"base_model_name_or_path": "tests/golden/" + name, "bias": "none", "lora_alpha": alpha,
              "lora_dropout": 0.0, "peft_type": "LORA", "r": r, "target_modules": targets, "task_type": "CAUSAL_LM"}
    with open(os.path.join(out, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"loss": loss.item(), "tokens": tokens, "r": r, "alpha": alpha, "targets": targets}, f, indent=2)
        f.write("\n")


def main():
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    for name in CASES:
        write_case(name)


if __name__ == "__main__":
    main()
