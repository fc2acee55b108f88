#!/usr/bin/python3
"""Writes the LoRA golden fixtures for `strata grad --lora` (tests/golden/lora_grad/<case>/).

For the four tiny models of make_model_goldens.py (their committed model dirs and batches under
tests/golden/<case>/) it draws LoRA adapters with nonzero A and B (so dA is not trivially zero),
writes them as a PEFT adapter dir, and computes in float64 the loss and the gradients of A and B
with PEFT's LoRA math written by hand (peft.tuners.lora.Linear with lora_dropout = 0):

    y = x W^T (+ b) + (lora_alpha / r) * (x A^T) B^T

on every targeted linear of every layer; the base weights are constants. Rank, alpha and the
targeted modules differ per case (odd ranks, subsets of the seven modules). A central
finite-difference check of a few adapter entries runs every time and fails the script when it
does not agree.

Output per case: adapter/adapter_config.json, adapter/adapter_model.safetensors (F32, PEFT
names: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight, ...), grads.safetensors
(F32 of the float64 gradients, the same names), expected.json (loss, r, alpha, targets).

Run from the repository root:  /usr/bin/python3 tools/golden/make_lora_grad_goldens.py
"""

import json
import os
import sys

import torch

import make_model_goldens as mg

OUT_ROOT = os.path.join(mg.REPO_ROOT, "tests", "golden", "lora_grad")
FD_MAX_REL_ERR = 1e-6

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {  # case -> (r, alpha, target_modules)
    "llama": (4, 8.0, ALL),
    "mistral": (3, 7.0, ["q_proj", "v_proj", "down_proj"]),
    "qwen2": (5, 16.0, ALL),
    "qwen3": (2, 5.0, ["k_proj", "o_proj", "gate_proj", "up_proj"]),
}


def module_of(target):
    return ("self_attn." if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp.") + target


def make_adapters(case, params, r, targets):
    """{module name: (A (r, in), B (out, r))}, float64 values exactly representable in f32."""
    g = torch.Generator().manual_seed(case["seed"] + 17)
    out = {}
    for i in range(case["config"]["num_hidden_layers"]):
        for t in targets:
            name = "model.layers.%d.%s" % (i, module_of(t))
            o, n = params[name + ".weight"].shape
            a = torch.randn(r, n, generator=g, dtype=torch.float64) * (1.0 / n ** 0.5)
            b = torch.randn(o, r, generator=g, dtype=torch.float64) * 0.2
            out[name] = (a.to(torch.float32).to(torch.float64), b.to(torch.float32).to(torch.float64))
    return out


def peft_names(name):
    return ("base_model.model.%s.lora_A.weight" % name, "base_model.model.%s.lora_B.weight" % name)


def loss_of(case, params, adapters, scale, input_ids, labels):
    lora = {k: (a, b, scale) for k, (a, b) in adapters.items()}
    return mg.forward_loss(case, params, input_ids, labels, lora=lora)


def fd_check(case, params, adapters, grads, scale, input_ids, labels, per_tensor=2):
    g = torch.Generator().manual_seed(case["seed"] + 23)
    worst = 0.0
    for name, (a, b) in adapters.items():
        for which, t in (("A", a), ("B", b)):
            grad = grads[name][0 if which == "A" else 1].view(-1)
            order = torch.argsort(grad.abs(), descending=True)[: max(4, grad.numel() // 4)]
            for idx in order[torch.randperm(order.numel(), generator=g)[:per_tensor]].tolist():
                x0 = t.view(-1)[idx].item()

                def at(v):
                    tt = t.clone()
                    tt.view(-1)[idx] = v
                    ad = dict(adapters)
                    ad[name] = (tt, b) if which == "A" else (a, tt)
                    with torch.no_grad():
                        return loss_of(case, params, ad, scale, input_ids, labels)[0].item()

                def central(h):
                    return (at(x0 + h) - at(x0 - h)) / (2 * h)

                fd = (4.0 * central(5e-4) - central(1e-3)) / 3.0
                rel = abs(fd - grad[idx].item()) / max(abs(grad[idx].item()), 1e-12)
                worst = max(worst, rel)
    return worst


def write_case(case):
    name = case["name"]
    r, alpha, targets = LORA[name]
    scale = alpha / r
    out_dir = os.path.join(OUT_ROOT, name)
    os.makedirs(os.path.join(out_dir, "adapter"), exist_ok=True)
    params = mg.make_params(case)
    input_ids, labels = mg.make_batch(case)
    adapters = make_adapters(case, params, r, targets)

    leaves = {k: (a.clone().requires_grad_(True), b.clone().requires_grad_(True)) for k, (a, b) in adapters.items()}
    loss, tokens = loss_of(case, params, leaves, scale, input_ids, labels)
    loss.backward()
    grads = {k: (a.grad.detach().clone(), b.grad.detach().clone()) for k, (a, b) in leaves.items()}
    with torch.no_grad():
        base_loss, _ = mg.forward_loss(case, params, input_ids, labels)
    worst = fd_check(case, params, adapters, grads, scale, input_ids, labels)
    print("case %s: r %d alpha %g targets %s: loss %.12g (base %.12g), tokens %d, finite-difference max rel err %.2e"
          % (name, r, alpha, ",".join(targets), loss.item(), base_loss.item(), tokens, worst))
    if worst > FD_MAX_REL_ERR:
        sys.exit("finite-difference check failed for %s: %.3e" % (name, worst))

    tensors, grad_tensors = [], []
    for k in sorted(adapters):
        na, nb = peft_names(k)
        tensors += [(na, adapters[k][0]), (nb, adapters[k][1])]
        grad_tensors += [(na, grads[k][0]), (nb, grads[k][1])]
    mg.safetensors_write(os.path.join(out_dir, "adapter", "adapter_model.safetensors"), tensors, "F32")
    mg.safetensors_write(os.path.join(out_dir, "grads.safetensors"), grad_tensors, "F32")
    config = {"base_model_name_or_path": "tests/golden/" + name, "bias": "none", "lora_alpha": alpha,
              "lora_dropout": 0.0, "peft_type": "LORA", "r": r, "target_modules": targets, "task_type": "CAUSAL_LM"}
    with open(os.path.join(out_dir, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    expected = {"loss": loss.item(), "tokens": tokens, "r": r, "alpha": alpha, "targets": targets}
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for case in mg.CASES:
        write_case(case)


if __name__ == "__main__":
    main()
