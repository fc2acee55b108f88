#!/usr/bin/python3
"""AdamW goldens for tests/offload/test_adamw.cpp, from torch.optim.AdamW (Debian python3-torch).

Writes tests/golden/adamw/:
  adamw.json          the cases: name, foreach, lr per step, betas, eps, weight_decay,
                      clip_scale, sizes, steps (the C++ test reads everything from here)
  adamw.safetensors   F32 tensors, for each case c and size n:
                        c.n<n>.param0                    initial parameters
                        c.n<n>.grad<k>                   gradient of step k (1-based), before clipping
                        c.n<n>.step<k>.param / .exp_avg / .exp_avg_sq   state after step k
Clipping is applied the way torch.nn.utils.clip_grad_norm_ does: the gradient is multiplied
in place by the f32 clip factor before optimizer.step(); the C++ side passes the raw gradient
and clip_scale to adamw_update. The learning rate changes every step (as a scheduler would
change it). Deterministic (fixed seed); rerun from the repository root:

    /usr/bin/python3 tools/golden/make_adamw_goldens.py
"""
import json
import os

import torch

from safetensors_file import safetensors_write_blobs

OUT = os.path.join("tests", "golden", "adamw")
SIZES = [1, 15, 17, 1031]
STEPS = 5
CASES = [
    # torch's default loop; decay on, no clipping
    dict(name="single", foreach=False, lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
         weight_decay=0.1, clip_scale=1.0),
    # the foreach kernels; other betas, larger eps, clipping
    dict(name="foreach", foreach=True, lr=3e-3, betas=(0.8, 0.95), eps=1e-6,
         weight_decay=0.01, clip_scale=0.37),
]


def lr_at(case, k):  # k = 1..STEPS
    return case["lr"] * (1.0 - 0.15 * (k - 1))


def run_case(case, n, gen, tensors):
    key = f"{case['name']}.n{n}"
    # parameters and gradients over several magnitudes, some exact zeros in the gradient
    p0 = torch.randn(n, generator=gen, dtype=torch.float32)
    p0 *= torch.exp2(torch.randint(-4, 3, (n,), generator=gen).float())
    param = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([param], lr=lr_at(case, 1), betas=case["betas"], eps=case["eps"],
                            weight_decay=case["weight_decay"], foreach=case["foreach"])
    tensors[f"{key}.param0"] = p0
    for k in range(1, STEPS + 1):
        g = torch.randn(n, generator=gen, dtype=torch.float32)
        g *= torch.exp2(torch.randint(-6, 4, (n,), generator=gen).float())
        g[torch.rand(n, generator=gen) < 0.05] = 0.0
        tensors[f"{key}.grad{k}"] = g.clone()
        for group in opt.param_groups:
            group["lr"] = lr_at(case, k)
        param.grad = g.clone()
        if case["clip_scale"] != 1.0:
            param.grad.mul_(torch.tensor(case["clip_scale"], dtype=torch.float32))
        opt.step()
        st = opt.state[param]
        tensors[f"{key}.step{k}.param"] = param.detach().clone()
        tensors[f"{key}.step{k}.exp_avg"] = st["exp_avg"].clone()
        tensors[f"{key}.step{k}.exp_avg_sq"] = st["exp_avg_sq"].clone()


def write_safetensors(path, tensors):
    safetensors_write_blobs(path, [(name, "F32", t.shape, t.contiguous().numpy().astype("<f4").tobytes())
                                   for name, t in tensors.items()])


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(20240604)
    os.makedirs(OUT, exist_ok=True)
    tensors = {}
    for case in CASES:
        for n in SIZES:
            run_case(case, n, gen, tensors)
    meta = {"torch": torch.__version__, "sizes": SIZES, "steps": STEPS, "cases": [
        dict(name=c["name"], foreach=c["foreach"], lr=[lr_at(c, k) for k in range(1, STEPS + 1)],
             beta1=c["betas"][0], beta2=c["betas"][1], eps=c["eps"],
             weight_decay=c["weight_decay"], clip_scale=c["clip_scale"]) for c in CASES]}
    with open(os.path.join(OUT, "adamw.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    write_safetensors(os.path.join(OUT, "adamw.safetensors"), tensors)
    print(f"wrote {len(tensors)} tensors to {OUT}")


if __name__ == "__main__":
    main()
