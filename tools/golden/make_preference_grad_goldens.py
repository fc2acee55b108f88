#!/usr/bin/python3
"""Writes the golden fixtures for `strata grad --objective dpo|ipo|simpo|orpo`
(tests/golden/preference/<family>/).

For each tiny model of tests/golden/<family> (llama, mistral, qwen2, qwen3; the weights are
read back from the committed safetensors) it writes a preference batch (batch.json: three pairs
sharing a prompt, chosen rows of 9 tokens and rejected rows of 12, labels -100 on the prompt,
reference sums for dpo/ipo) and, per objective, the float64 torch autograd reference:
<objective>.json ({"loss", "pairs", "chosen_logps", "rejected_logps", "beta", "gamma"}) and
<objective>_grads.safetensors (F32 of the float64 gradient, HF names).

The model math is make_model_goldens.py's (transformers' modeling code, written out); the
preference losses follow TRL (DPOTrainer sigmoid and ipo losses, CPOTrainer simpo, ORPOTrainer)
with the sums and definitions of issue 14:
  s = sum over positions t with label[t+1] != -100 of log_softmax(logits[t])[label[t+1]]
  dpo   -log sigmoid(beta * ((s_c - s_r) - (rho_c - rho_r)))
  ipo   ((s_c/n_c - s_r/n_r) - (rho_c/n_c - rho_r/n_r) - 1/(2 beta))^2
  simpo -log sigmoid(beta * (s_c/n_c - s_r/n_r) - gamma)
  orpo  -sum s_c / sum n_c - beta * mean log sigmoid(log_odds),
        log_odds = (m_c - m_r) - (log(1 - e^m_c) - log(1 - e^m_r)), m = s/n
  dpo, ipo, simpo: mean over pairs.
A central finite-difference check of a few entries per objective runs every time.

Run from the repository root:  /usr/bin/python3 tools/golden/make_preference_grad_goldens.py
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_goldens as mg  # noqa: E402

OUT_ROOT = os.path.join(mg.REPO_ROOT, "tests", "golden", "preference")
PAIRS = 3
PROMPT = 4          # prompt tokens shared by both sides, labels -100
CHOSEN_LEN = 9
REJECTED_LEN = 12
FD_MAX_REL_ERR = 1e-6
OBJECTIVES = {      # objective: (beta, gamma); non-default betas so a default is not mistaken
    "dpo": (0.3, 0.5),
    "ipo": (0.2, 0.5),
    "simpo": (2.0, 0.5),
    "orpo": (0.25, 0.5),
}


def load_params(family):
    d = os.path.join(mg.REPO_ROOT, "tests", "golden", family)
    p = {}
    for f in sorted(os.listdir(d)):
        if f.startswith("model") and f.endswith(".safetensors"):
            p.update(mg.safetensors_read(os.path.join(d, f)))
    return p


def make_batch(case):
    V = case["config"]["vocab_size"]
    g = torch.Generator().manual_seed(case["seed"] + 11)
    chosen, rejected = [], []
    for _ in range(PAIRS):
        prompt = torch.randint(0, V, (PROMPT,), generator=g)
        c = torch.cat([prompt, torch.randint(0, V, (CHOSEN_LEN - PROMPT,), generator=g)])
        r = torch.cat([prompt, torch.randint(0, V, (REJECTED_LEN - PROMPT,), generator=g)])
        chosen.append(c)
        rejected.append(r)
    chosen, rejected = torch.stack(chosen), torch.stack(rejected)
    cl, rl = chosen.clone(), rejected.clone()
    cl[:, :PROMPT] = mg.IGNORE_INDEX
    rl[:, :PROMPT] = mg.IGNORE_INDEX
    rl[1, REJECTED_LEN - 3] = mg.IGNORE_INDEX  # a hole inside a response
    return chosen, cl, rejected, rl


def seq_logps(case, p, ids, labels):
    """(sums, counts) per row: HF shift, -100 ignored, log-softmax over the full vocabulary."""
    logits = mg.forward_logits(case, p, ids)                      # (B, T, V)
    logp = torch.log_softmax(logits[:, :-1], dim=-1)              # (B, T-1, V)
    lab = labels[:, 1:]
    mask = lab != mg.IGNORE_INDEX
    picked = torch.gather(logp, 2, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1), mask.sum(-1).to(logits.dtype)


def preference_loss(objective, beta, gamma, sc, nc, sr, nr, rc, rr):
    ls = torch.nn.functional.logsigmoid
    if objective == "dpo":
        return (-ls(beta * ((sc - sr) - (rc - rr)))).mean()
    if objective == "ipo":
        h = (sc / nc - sr / nr) - (rc / nc - rr / nr)
        return ((h - 1 / (2 * beta)) ** 2).mean()
    if objective == "simpo":
        return (-ls(beta * (sc / nc - sr / nr) - gamma)).mean()
    if objective == "orpo":
        mc, mr = sc / nc, sr / nr
        log_odds = (mc - mr) - (torch.log1p(-torch.exp(mc)) - torch.log1p(-torch.exp(mr)))
        return -sc.sum() / nc.sum() - beta * ls(log_odds).mean()
    raise ValueError(objective)


def total_loss(case, p, batch, objective, ref):
    chosen, cl, rejected, rl = batch
    beta, gamma = OBJECTIVES[objective]
    sc, nc = seq_logps(case, p, chosen, cl)
    sr, nr = seq_logps(case, p, rejected, rl)
    rc, rr = ref
    return preference_loss(objective, beta, gamma, sc, nc, sr, nr, rc, rr), sc, sr


def fd_check(case, params, grads, batch, objective, ref, n_entries=2):
    g = torch.Generator().manual_seed(case["seed"] + 123)
    worst = 0.0
    for name in sorted(params):
        flat = grads[name].view(-1)
        order = torch.argsort(flat.abs(), descending=True)
        top = order[: max(4, flat.numel() // 8)]
        for idx in top[torch.randperm(top.numel(), generator=g)[:n_entries]].tolist():
            x0 = params[name].view(-1)[idx].item()

            def at(v):
                q = dict(params)
                t = params[name].clone()
                t.view(-1)[idx] = v
                q[name] = t
                with torch.no_grad():
                    return total_loss(case, q, batch, objective, ref)[0].item()

            def central(h):
                return (at(x0 + h) - at(x0 - h)) / (2 * h)

            fd = (4.0 * central(5e-4) - central(1e-3)) / 3.0
            ad = flat[idx].item()
            worst = max(worst, abs(fd - ad) / max(abs(ad), 1e-12))
    return worst


def write_family(case):
    family = case["name"]
    out_dir = os.path.join(OUT_ROOT, family)
    os.makedirs(out_dir, exist_ok=True)
    params = load_params(family)
    batch = make_batch(case)
    chosen, cl, rejected, rl = batch
    with torch.no_grad():
        sc0, _ = seq_logps(case, params, chosen, cl)
        sr0, _ = seq_logps(case, params, rejected, rl)
    # reference sums near the model's own, so dpo/ipo see a non-trivial margin
    ref = (sc0 + torch.tensor([0.7, -1.1, 0.25], dtype=torch.float64),
           sr0 + torch.tensor([-0.4, 0.9, -1.6], dtype=torch.float64))
    with open(os.path.join(out_dir, "batch.json"), "w") as f:
        json.dump({"chosen_input_ids": chosen.tolist(), "chosen_labels": cl.tolist(),
                   "rejected_input_ids": rejected.tolist(), "rejected_labels": rl.tolist(),
                   "ref_chosen_logps": ref[0].tolist(), "ref_rejected_logps": ref[1].tolist()}, f)
        f.write("\n")
    print("family %s" % family)
    for objective, (beta, gamma) in OBJECTIVES.items():
        # simpo and orpo take no reference; dpo and ipo use the batch's
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        loss, sc, sr = total_loss(case, leaves, batch, objective, ref)
        loss.backward()
        grads = {k: v.grad.detach().clone() for k, v in leaves.items()}
        worst = fd_check(case, params, grads, batch, objective, ref)
        print("  %-5s loss %.12g  finite-difference max rel err %.2e" % (objective, loss.item(), worst))
        if worst > FD_MAX_REL_ERR:
            sys.exit("finite-difference check failed for %s %s: %.3e" % (family, objective, worst))
        mg.safetensors_write(os.path.join(out_dir, objective + "_grads.safetensors"), list(grads.items()), "F32")
        with open(os.path.join(out_dir, objective + ".json"), "w") as f:
            json.dump({"loss": loss.item(), "pairs": PAIRS, "beta": beta, "gamma": gamma,
                       "chosen_logps": sc.detach().tolist(), "rejected_logps": sr.detach().tolist()}, f, indent=2)
            f.write("\n")


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for case in mg.CASES:
        write_family(case)


if __name__ == "__main__":
    main()
