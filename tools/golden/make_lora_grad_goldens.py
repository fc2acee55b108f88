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

Each case also runs with LoRA dropout (PEFT's lora_dropout, p = DROPOUT[case]) on the adapter
path's input only: x' = mask * x / (1 - p), where the mask is strata's counter-based one
(kernels/common/dropout_mask.h) rebuilt here in python: Philox4x32-10 (Random123, checked against
its known-answer vector) of block element // 4 under counter (block lo, block hi, tensor, 0) and
key (seed lo, seed hi); element kept when its word >= floor(p * 2^32); seed = SplitMix64 chain of
(run seed ^ salt, step 1, micro-batch 0); tensor = layer * 7 + module (q_proj 0 .. down_proj 6);
elements numbered row-major over (B * T, in). `strata grad --lora-dropout p --lora-seed S` draws
the same masks.

Output per case: adapter/adapter_config.json, adapter/adapter_model.safetensors (F32, PEFT
names: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight, ...), grads.safetensors
(F32 of the float64 gradients, the same names), grads_dropout.safetensors (the same with
dropout), expected.json (loss, r, alpha, targets; dropout, dropout_seed, dropout_loss).

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
DROPOUT = {"llama": 0.1, "mistral": 0.3, "qwen2": 0.05, "qwen3": 0.5}  # case -> lora_dropout
DROPOUT_SEED = 1234  # the run seed of the masks (strata grad --lora-seed)
LORA = {  # case -> (r, alpha, target_modules)
    "llama": (4, 8.0, ALL),
    "mistral": (3, 7.0, ["q_proj", "v_proj", "down_proj"]),
    "qwen2": (5, 16.0, ALL),
    "qwen3": (2, 5.0, ["k_proj", "o_proj", "gate_proj", "up_proj"]),
}


M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF


def philox4x32_10(c, k):
    """Random123's Philox4x32-10: four 32-bit counter words c under two key words k."""
    c0, c1, c2, c3 = c
    k0, k1 = k
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def mix64(x):
    """SplitMix64's finaliser (kernels/common/zo_rng.h: zo_mix64)."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def dropout_seed(run_seed, step, micro_batch):
    """kernels/common/dropout_mask.h: dropout_seed."""
    return mix64(mix64(mix64(run_seed ^ 0x4C6F526144726F70) ^ step) ^ micro_batch)


def dropout_mask(seed, tensor, rows, cols, p):
    """(rows, cols) float64: 1 / (1 - p) rounded to f32 where kept, 0 where dropped."""
    threshold = int(p * 2.0 ** 32)
    scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32).item()
    n = rows * cols
    keep = []
    for block in range((n + 3) // 4):
        words = philox4x32_10((block & M32, block >> 32, tensor, 0), (seed & M32, seed >> 32))
        keep.extend(w >= threshold for w in words)
    return torch.tensor(keep[:n], dtype=torch.float64).view(rows, cols) * scale


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


def make_masks(case, params, targets, p, input_ids):
    """{module name: (B, T, in) mask} for every adapted linear: step 1, micro-batch 0 of a run
    seeded DROPOUT_SEED."""
    seed = dropout_seed(DROPOUT_SEED, 1, 0)
    B, T = input_ids.shape
    masks = {}
    for i in range(case["config"]["num_hidden_layers"]):
        for t in targets:
            name = "model.layers.%d.%s" % (i, module_of(t))
            n = params[name + ".weight"].shape[1]
            masks[name] = dropout_mask(seed, i * len(ALL) + ALL.index(t), B * T, n, p).view(B, T, n)
    return masks


def loss_of(case, params, adapters, scale, input_ids, labels, masks=None):
    lora = {k: (a, b, scale) + ((masks[k],) if masks else ()) for k, (a, b) in adapters.items()}
    return mg.forward_loss(case, params, input_ids, labels, lora=lora)


def fd_check(case, params, adapters, grads, scale, input_ids, labels, masks=None, per_tensor=2):
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
                        return loss_of(case, params, ad, scale, input_ids, labels, masks)[0].item()

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

    def gradients(masks):
        leaves = {k: (a.clone().requires_grad_(True), b.clone().requires_grad_(True)) for k, (a, b) in adapters.items()}
        loss, tokens = loss_of(case, params, leaves, scale, input_ids, labels, masks)
        loss.backward()
        grads = {k: (a.grad.detach().clone(), b.grad.detach().clone()) for k, (a, b) in leaves.items()}
        worst = fd_check(case, params, adapters, grads, scale, input_ids, labels, masks)
        if worst > FD_MAX_REL_ERR:
            sys.exit("finite-difference check failed for %s: %.3e" % (name, worst))
        return loss, tokens, grads, worst

    loss, tokens, grads, worst = gradients(None)
    with torch.no_grad():
        base_loss, _ = mg.forward_loss(case, params, input_ids, labels)
    print("case %s: r %d alpha %g targets %s: loss %.12g (base %.12g), tokens %d, finite-difference max rel err %.2e"
          % (name, r, alpha, ",".join(targets), loss.item(), base_loss.item(), tokens, worst))
    p = DROPOUT[name]
    masks = make_masks(case, params, targets, p, input_ids)
    kept = sum(float((m != 0).sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())
    d_loss, _, d_grads, d_worst = gradients(masks)
    print("  with dropout %g (kept %.3f): loss %.12g, finite-difference max rel err %.2e" % (p, kept, d_loss.item(), d_worst))

    tensors, grad_tensors, d_grad_tensors = [], [], []
    for k in sorted(adapters):
        na, nb = peft_names(k)
        tensors += [(na, adapters[k][0]), (nb, adapters[k][1])]
        grad_tensors += [(na, grads[k][0]), (nb, grads[k][1])]
        d_grad_tensors += [(na, d_grads[k][0]), (nb, d_grads[k][1])]
    mg.safetensors_write(os.path.join(out_dir, "adapter", "adapter_model.safetensors"), tensors, "F32")
    mg.safetensors_write(os.path.join(out_dir, "grads.safetensors"), grad_tensors, "F32")
    mg.safetensors_write(os.path.join(out_dir, "grads_dropout.safetensors"), d_grad_tensors, "F32")
    config = {"base_model_name_or_path": "tests/golden/" + name, "bias": "none", "lora_alpha": alpha,
              "lora_dropout": 0.0, "peft_type": "LORA", "r": r, "target_modules": targets, "task_type": "CAUSAL_LM"}
    with open(os.path.join(out_dir, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    expected = {"loss": loss.item(), "tokens": tokens, "r": r, "alpha": alpha, "targets": targets,
                "dropout": p, "dropout_seed": DROPOUT_SEED, "dropout_loss": d_loss.item()}
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    # Random123's known-answer vector for Philox4x32-10 (counter 0, key 0)
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    for case in mg.CASES:
        write_case(case)


if __name__ == "__main__":
    main()
