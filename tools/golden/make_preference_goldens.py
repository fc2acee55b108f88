#!/usr/bin/python3
"""Torch goldens for strata's preference losses (offload/objective/preference_loss.*).

Written independently of the C++ code, following TRL's DPOTrainer ("sigmoid" and "ipo" loss
types) and CPOTrainer ("simpo", ORPO's odds ratio) as issue 14 defines them, in float64 with
autograd for d loss / d (per-sequence log-prob sum). Cases include a step split into
micro-batches (gradient accumulation): each micro-batch is normalised by the step's totals.
Run: /usr/bin/python3 tools/golden/make_preference_goldens.py  (writes
tests/golden/preference/preference_losses.json)
"""
import json
import os

import torch
import torch.nn.functional as F

torch.manual_seed(14)
here = os.path.dirname(os.path.abspath(__file__))
out_path = os.path.join(here, "..", "..", "tests", "golden", "preference", "preference_losses.json")


def step_loss(objective, beta, gamma, sc, sr, nc, nr, rc, rr):
    """The loss of a whole step (all its pairs), as TRL computes it."""
    if objective == "dpo":
        logits = (sc - sr) - (rc - rr)
        return (-F.logsigmoid(beta * logits)).mean()
    if objective == "ipo":
        logits = (sc / nc - sr / nr) - (rc / nc - rr / nr)
        return ((logits - 1 / (2 * beta)) ** 2).mean()
    if objective == "simpo":
        logits = sc / nc - sr / nr
        return (-F.logsigmoid(beta * logits - gamma)).mean()
    if objective == "orpo":
        mc, mr = sc / nc, sr / nr
        log_odds = (mc - mr) - (torch.log1p(-torch.exp(mc)) - torch.log1p(-torch.exp(mr)))
        nll = -sc.sum() / nc.sum()
        return nll - beta * F.logsigmoid(log_odds).mean()
    raise ValueError(objective)


cases = []
for objective, beta, gamma in [("dpo", 0.1, 0.5), ("dpo", 2.0, 0.5), ("ipo", 0.1, 0.5), ("ipo", 0.5, 0.5),
                               ("simpo", 2.0, 0.5), ("simpo", 0.7, 1.3), ("orpo", 0.1, 0.5), ("orpo", 1.0, 0.5)]:
    for pairs, split in [(1, [1]), (5, [5]), (7, [3, 4]), (16, [5, 1, 10])]:
        nc = torch.randint(1, 60, (pairs,), dtype=torch.float64)
        nr = torch.randint(1, 60, (pairs,), dtype=torch.float64)
        # mean log-probs between about -4 and -0.01 per token (orpo needs them below 0)
        sc = (-torch.rand(pairs, dtype=torch.float64) * 4 - 0.01) * nc
        sr = (-torch.rand(pairs, dtype=torch.float64) * 4 - 0.01) * nr
        rc = sc + torch.randn(pairs, dtype=torch.float64) * 3
        rr = sr + torch.randn(pairs, dtype=torch.float64) * 3
        sc.requires_grad_(True)
        sr.requires_grad_(True)
        loss = step_loss(objective, beta, gamma, sc, sr, nc, nr, rc, rr)
        dc, dr = torch.autograd.grad(loss, (sc, sr))
        cases.append({
            "objective": objective, "beta": beta, "gamma": gamma, "split": split,
            "chosen_logp": sc.detach().tolist(), "rejected_logp": sr.detach().tolist(),
            "chosen_tokens": [int(x) for x in nc.tolist()], "rejected_tokens": [int(x) for x in nr.tolist()],
            "ref_chosen_logp": rc.tolist(), "ref_rejected_logp": rr.tolist(),
            "loss": loss.item(), "d_chosen_logp": dc.tolist(), "d_rejected_logp": dr.tolist(),
        })

os.makedirs(os.path.dirname(out_path), exist_ok=True)
with open(out_path, "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases}, f, indent=0)
print(f"wrote {len(cases)} cases to {out_path}")
