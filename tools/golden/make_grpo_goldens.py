#!/usr/bin/env python3
"""Writes the golden fixtures for `strata grad --objective grpo` (tests/golden/grpo/<family>/).

For each tiny model of tests/golden/<family> (llama, mistral, qwen2, qwen3; weights read back
from the committed safetensors) it writes one GRPO batch (batch.json: 4 rows = one prompt group
of G = 4 completions of different lengths, right-padded, with advantages, old log-probs that
differ from the model's own so that clipping is active (as at iteration 2 of num_iterations > 1),
and reference log-probs) and, per case, the loss and the float64 gradient of every parameter.

The loss is TRL's own: GRPOTrainer._compute_loss of the installed trl (1.16) runs on a stand-in
trainer object whose _get_per_token_logps_and_entropies returns the float64 model math of
make_model_goldens.py (transformers' modeling code, written out) with logits / temperature, as
TRL's does. Cases: every loss_type (grpo, bnpo, dr_grpo, dapo), each with beta = 0 and with
beta > 0, with old log-probs given (clipping active) except dr_grpo without beta, which uses the
policy's own (TRL's default when num_iterations = 1). A central finite-difference check of one
entry in each of 4 random tensors per case runs every time (not for the case without old log-probs, whose loss value
does not move with the weights: exp(logp - logp.detach()) = 1).

Run from the repository root (a venv with torch and trl):
  python tools/golden/make_grpo_goldens.py
"""

import collections
import json
import os
import sys
import types

import torch
from trl.trainer.grpo_trainer import GRPOTrainer
import trl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_goldens as mg  # noqa: E402

OUT_ROOT = os.path.join(mg.REPO_ROOT, "tests", "golden", "grpo")
ROWS = 4            # one group of G = 4 completions
PROMPT = 4          # prompt tokens, completion_mask 0
COMPLETION = [7, 5, 8, 3]  # completion tokens per row (padding after, mask 0)
MAX_COMPLETION = 10  # dr_grpo's denominator
FD_MAX_REL_ERR = 1e-6
FD_TENSORS = 4       # tensors (one entry each) checked by differences per case
# name: (loss_type, beta, epsilon, epsilon_high, temperature, old log-probs given)
CASES = {
    "grpo": ("grpo", 0.0, 0.2, 0.2, 0.7, True),
    "grpo_kl": ("grpo", 0.04, 0.2, 0.28, 1.0, True),
    "bnpo": ("bnpo", 0.0, 0.2, 0.28, 0.9, True),
    "bnpo_kl": ("bnpo", 0.1, 0.15, 0.15, 0.7, True),
    "dr_grpo": ("dr_grpo", 0.0, 0.2, 0.2, 1.0, False),
    "dr_grpo_kl": ("dr_grpo", 0.05, 0.2, 0.3, 0.8, True),
    "dapo": ("dapo", 0.0, 0.2, 0.28, 1.0, True),
    "dapo_kl": ("dapo", 0.2, 0.1, 0.2, 0.6, True),
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
    g = torch.Generator().manual_seed(case["seed"] + 41)
    T = PROMPT + max(COMPLETION)
    prompt = torch.randint(0, V, (PROMPT,), generator=g)
    ids = torch.zeros(ROWS, T, dtype=torch.long)
    mask = torch.zeros(ROWS, T, dtype=torch.long)
    for b, n in enumerate(COMPLETION):
        ids[b, :PROMPT] = prompt
        ids[b, PROMPT:PROMPT + n] = torch.randint(0, V, (n,), generator=g)
        mask[b, PROMPT:PROMPT + n] = 1
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0], dtype=torch.float64)
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-4)  # TRL's scale_rewards="group"
    return ids, mask, adv


def per_token_logps(case, p, ids, temperature):
    """(B, T) log p(token t | tokens < t) of logits / temperature; entry 0 is 0."""
    logits = mg.forward_logits(case, p, ids) / temperature          # (B, T, V)
    logp = torch.log_softmax(logits[:, :-1], dim=-1)                # (B, T-1, V)
    picked = torch.gather(logp, 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros(ids.shape[0], 1, dtype=logits.dtype), picked], dim=1)


class StandIn:
    """The attributes GRPOTrainer._compute_loss reads, for one process, one micro-batch, train mode."""

    def __init__(self, case, params, loss_type, beta, eps, eps_high, temperature):
        self.case, self.params, self.temperature = case, params, temperature
        self.loss_type, self.beta = loss_type, beta
        self.epsilon_low, self.epsilon_high = eps, eps_high
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.importance_sampling_level = "token"
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self.aux_loss_enabled = False
        self._entropy_bonus_enabled = False
        self.current_gradient_accumulation_steps = 1
        self.max_completion_length = MAX_COMPLETION
        self.model = types.SimpleNamespace(training=True)
        self.args = types.SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1)
        self.accelerator = types.SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                                 reduce=lambda x, reduction="sum": x)
        self._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        logits = mg.forward_logits(self.case, self.params, input_ids) / self.temperature
        logits = logits[:, -logits_to_keep - 1:-1]
        logp = torch.log_softmax(logits, dim=-1)
        picked = torch.gather(logp, 2, input_ids[:, -logits_to_keep:].unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return picked, entropy, None


def trl_loss(case, params, batch, name, old, ref):
    loss_type, beta, eps, eps_high, temperature, with_old = CASES[name]
    ids, mask, adv = batch
    s = StandIn(case, params, loss_type, beta, eps, eps_high, temperature)
    inputs = {"prompt_ids": ids[:, :PROMPT], "prompt_mask": torch.ones_like(ids[:, :PROMPT]),
              "completion_ids": ids[:, PROMPT:], "completion_mask": mask[:, PROMPT:], "advantages": adv,
              "num_items_in_batch": mask.sum().to(torch.float64)}
    if with_old:
        inputs["old_per_token_logps"] = old[:, PROMPT:]
    if beta != 0:
        inputs["ref_per_token_logps"] = ref[:, PROMPT:]
    loss = GRPOTrainer._compute_loss(s, None, inputs)
    return loss, s._metrics["train"]


def fd_check(case, params, grads, batch, name, old, ref, n_entries=1):
    g = torch.Generator().manual_seed(case["seed"] + 4141)
    worst = 0.0
    names = sorted(params)
    picked = [names[i] for i in torch.randperm(len(names), generator=g)[:FD_TENSORS].tolist()]
    for pname in picked:
        flat = grads[pname].view(-1)
        order = torch.argsort(flat.abs(), descending=True)
        top = order[: max(4, flat.numel() // 8)]
        for idx in top[torch.randperm(top.numel(), generator=g)[:n_entries]].tolist():
            x0 = params[pname].view(-1)[idx].item()

            def at(v):
                q = dict(params)
                t = params[pname].clone()
                t.view(-1)[idx] = v
                q[pname] = t
                with torch.no_grad():
                    return trl_loss(case, q, batch, name, old, ref)[0].item()

            def central(h):
                return (at(x0 + h) - at(x0 - h)) / (2 * h)

            fd = (4.0 * central(5e-5) - central(1e-4)) / 3.0
            ad = flat[idx].item()
            worst = max(worst, abs(fd - ad) / max(abs(ad), 1e-12))
    return worst


def write_family(case):
    family = case["name"]
    out_dir = os.path.join(OUT_ROOT, family)
    os.makedirs(out_dir, exist_ok=True)
    params = load_params(family)
    batch = make_batch(case)
    ids, mask, adv = batch
    g = torch.Generator().manual_seed(case["seed"] + 4242)
    # old and reference log-probs per temperature: the model's own plus noise (old: ratios
    # exp(logp - old) spread well beyond [1 - eps, 1 + eps_high], so clipping is active)
    noise_old = torch.randn(ids.shape, generator=g, dtype=torch.float64) * 0.35
    noise_ref = torch.randn(ids.shape, generator=g, dtype=torch.float64) * 0.5
    batch_json = {"input_ids": ids.tolist(), "completion_mask": mask.tolist(), "advantages": adv.tolist(),
                  "cases": {}}
    print("family %s" % family)
    for name, (loss_type, beta, eps, eps_high, temperature, with_old) in CASES.items():
        with torch.no_grad():
            own = per_token_logps(case, params, ids, temperature)
        old = (own + noise_old) * mask
        ref = (own + noise_ref) * mask
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        loss, metrics = trl_loss(case, leaves, batch, name, old, ref)
        loss.backward()
        grads = {k: v.grad.detach().clone() for k, v in leaves.items()}
        # without old log-probs the ratio is exp(logp - logp.detach()) = 1 whatever the weights:
        # the loss's value is flat, only its gradient is not, so differences cannot check it
        worst = fd_check(case, params, grads, batch, name, old, ref) if with_old else 0.0
        clip = metrics["clip_ratio/region_mean"][0]
        print("  %-10s loss %.12g clip_ratio %.3f  finite-difference max rel err %.2e" % (name, loss.item(), clip, worst))
        if worst > FD_MAX_REL_ERR:
            sys.exit("finite-difference check failed for %s %s: %.3e" % (family, name, worst))
        if with_old and clip == 0:
            sys.exit("case %s %s: no token clipped; the case is meant to clip" % (family, name))
        mg.safetensors_write(os.path.join(out_dir, name + "_grads.safetensors"), list(grads.items()), "F32")
        c = {"loss_type": loss_type, "beta": beta, "epsilon": eps, "epsilon_high": eps_high,
             "temperature": temperature, "max_completion_length": MAX_COMPLETION, "loss": loss.item(),
             "tokens": int(mask.sum()), "clip_ratio": clip}
        if "kl" in metrics:
            c["kl"] = metrics["kl"][0]
        if with_old:
            c["old_per_token_logps"] = old.tolist()
        if beta != 0:
            c["ref_per_token_logps"] = ref.tolist()
        batch_json["cases"][name] = c
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump({"trl": trl.__version__, "torch": torch.__version__, **batch_json}, f)
        f.write("\n")


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for case in mg.CASES:
        write_family(case)


if __name__ == "__main__":
    main()
