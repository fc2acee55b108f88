#!/usr/bin/python3
"""The peer benchmark (`strata-bench peer` runs this): the same Llama-family model trained on the
same token rows by PyTorch (Debian's python3-torch, configured fast) and by strata, interleaved
over several rounds, tokens/s of each and their ratio.

Both sides start from the same weights (written here as a Hugging Face model directory) and
train with AdamW (the same hyperparameters, global-norm clipping at 1.0) on micro-batches of the
same random token rows (strata shuffles them in its own order; the shapes and the work per step
are the same). Before timing, the two implementations' losses on one batch are compared (torch
against `strata grad`, f32) so the comparison is between two programs doing the same math.

torch is configured as fast as Debian's package allows: OMP_WAIT_POLICY=PASSIVE, the requested
number of threads, autocast to bf16 for the bf16 configuration, and the BLAS the system's
libblas.so.3 alternative points to -- install libopenblas0-pthread (scripts/setup.sh --bench)
so that it is OpenBLAS; with the reference netlib BLAS torch is 14-28x slower and the ratio
says nothing about strata. The script says which BLAS it found.

usage: tools/bench/peer.py --strata build/strata [--config quickstart|mid|mid-bf16|all]
                           [--rounds R] [--steps S] [--threads N] [--keep DIR]
Each strata run also reports its MFU: the model FLOPs per second of its timed steps over the GEMM
peak (GEMMs of the CPU backend's own matmul in the config's dtype: bf16 for mid-bf16) that the same `strata train` process
measured at its start, so the ceiling is taken in the same run, under the same load.
Ends with one JSON line: {"peer": {"configs": [{"name", "dtype", "torch_tokens_per_s",
"strata_tokens_per_s", "ratio", "strata_mfu", "peak_flops_per_s", "peak_dtype"}...]}}.
"""

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "golden"))
from safetensors_file import safetensors_write_blobs  # noqa: E402  (tools/golden: the one writer)

CONFIGS = {
    # the bundled quickstart model (recipes/quickstart/config.json): 0.8M parameters, tied
    "quickstart": dict(dtype="f32", T=256, mb=8, hidden=128, inter=352, layers=4, heads=4, kv=2, head_dim=32,
                       vocab=256, tied=True),
    # hidden 512, 8 layers, GQA 8/4, intermediate 1408, vocab 8192, T=512, micro-batch 4
    "mid": dict(dtype="f32", T=512, mb=4, hidden=512, inter=1408, layers=8, heads=8, kv=4, head_dim=64,
                vocab=8192, tied=False),
    "mid-bf16": dict(dtype="bf16", T=512, mb=4, hidden=512, inter=1408, layers=8, heads=8, kv=4, head_dim=64,
                     vocab=8192, tied=False),
}
LR, WD, CLIP, SEED = 1e-4, 0.01, 1.0, 1234


def blas_in_use():
    """Where the system's libblas.so.3 alternative points (torch from Debian links it)."""
    path = "/usr/lib/x86_64-linux-gnu/libblas.so.3"
    try:
        real = os.path.realpath(path)
    except OSError:
        return "unknown"
    return "openblas" if "openblas" in real else ("netlib (reference BLAS)" if "/blas/" in real else real)


def cpu_info():
    """The CPU's model name and the bf16 matrix features that decide strata's bf16 kernels (an AMX
    tile unit makes oneDNN's bf16 GEMM peak about four times AVX512-BF16's)."""
    info = {"model": "unknown", "amx_bf16": False, "avx512_bf16": False}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and info["model"] == "unknown":
                    info["model"] = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    info["amx_bf16"] = "amx_bf16" in flags
                    info["avx512_bf16"] = "avx512_bf16" in flags
                    break
    except OSError:
        pass
    return info


def hf_config(c):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c["hidden"],
        "intermediate_size": c["inter"], "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv"], "head_dim": c["head_dim"], "vocab_size": c["vocab"],
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
        "tie_word_embeddings": c["tied"], "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
    }


def write_safetensors(path, named):
    tensors = [(name, "F32", t.shape, t.detach().float().contiguous().numpy().astype("<f4").tobytes())
               for name, t in named]
    safetensors_write_blobs(path, tensors, {"format": "pt"})


def build_model(c):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    C, D, H, KV = c["hidden"], c["head_dim"], c["heads"], c["kv"]

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight.to(x.dtype)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(C), RMSNorm(C)
            self.q_proj = nn.Linear(C, H * D, bias=False)
            self.k_proj = nn.Linear(C, KV * D, bias=False)
            self.v_proj = nn.Linear(C, KV * D, bias=False)
            self.o_proj = nn.Linear(H * D, C, bias=False)
            self.gate_proj = nn.Linear(C, c["inter"], bias=False)
            self.up_proj = nn.Linear(C, c["inter"], bias=False)
            self.down_proj = nn.Linear(c["inter"], C, bias=False)

        def forward(self, x, cos, sin, mask):
            B, T, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(B, T, H, D).transpose(1, 2)
            k = self.k_proj(h).view(B, T, KV, D).transpose(1, 2)
            v = self.v_proj(h).view(B, T, KV, D).transpose(1, 2)

            def rope(t):
                t1, t2 = t[..., : D // 2], t[..., D // 2:]
                return t * cos + torch.cat((-t2, t1), dim=-1) * sin

            q, k = rope(q), rope(k)
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D)) + mask
            y = torch.softmax(att.float(), dim=-1).to(q.dtype) @ v
            x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, H * D))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab"], C)
            self.layers = nn.ModuleList([Layer() for _ in range(c["layers"])])
            self.norm = RMSNorm(C)
            self.lm_head = None if c["tied"] else nn.Linear(C, c["vocab"], bias=False)

        def forward(self, ids):
            B, T = ids.shape
            inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
            f = torch.outer(torch.arange(T, dtype=torch.float32), inv)
            emb = torch.cat((f, f), dim=-1)
            x = self.embed_tokens(ids)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            mask = torch.full((T, T), float("-inf")).triu(1).to(x.dtype)
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            x = self.norm(x)
            w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            logits = x @ w.t().to(x.dtype)
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    torch.manual_seed(SEED)
    m = Model()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return m


def hf_names(model):
    out = []
    for name, p in model.named_parameters():
        if name.startswith("lm_head"):
            out.append((name, p))
            continue
        n = "model." + name
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            n = n.replace("." + proj + ".", ".self_attn." + proj + ".")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            n = n.replace("." + proj + ".", ".mlp." + proj + ".")
        out.append((n, p))
    return out


def torch_train(model, rows, c, steps, threads):
    """tokens/s of steps 2..S (the first warms up), and the losses."""
    import torch
    torch.set_num_threads(threads)
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": other, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8, foreach=True)
    mb, T = c["mb"], c["T"]
    times, losses = [], []
    for s in range(steps):
        batch = torch.tensor(rows[(s * mb) % len(rows):][:mb], dtype=torch.long)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if c["dtype"] == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(batch)
        else:
            loss = model(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    return mb * (T - 1) * (steps - 1) / sum(times[1:]), losses


def strata_train(strata, workdir, c, steps, threads, weights):
    out = os.path.join(workdir, "out")
    shutil.rmtree(out, ignore_errors=True)
    recipe = os.path.join(workdir, "recipe.toml")
    with open(recipe, "w") as f:
        f.write(f"""[model]\npath = "model"\ndtype = "{c['dtype']}"\n
[data]\npath = "tokens.json"\nformat = "tokens"\nsequence_len = {c['T']}\npacking = false\n
[train]\nmax_steps = {steps}\nmicro_batch_size = {c['mb']}\nseed = 1\nlog_steps = 1000\n
[optim]\nlearning_rate = {LR}\nweight_decay = {WD}\nmax_grad_norm = {CLIP}\nlr_scheduler_type = "constant"\n
[device]\nbackend = "cpu"\nmemory = "4GiB"\ncpu_threads = {threads}\n
[offload]\nweights = "{weights}"\n
[checkpoint]\noutput_dir = "out"\nsave_dtype = "f32"\n""")
    r = subprocess.run([strata, "train", recipe], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"peer: strata train failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    timed = [x for x in recs if x["step"] > 1]
    # tokens_per_s counts every row token (T per row); compare trained tokens (T - 1 per row) as torch's
    tokens = sum(c["mb"] * (c["T"] - 1) for _ in timed)
    seconds = [x["tokens"] / x["tokens_per_s"] for x in timed]
    # MFU: the model FLOPs per second of the timed steps over the GEMM peak strata train measured at
    # its start, in this run (the backend's GEMMs of the model's dtype; the log line names it)
    peak = re.search(r"MFU is relative to ([0-9.e+-]+) TFLOP/s \(([^)]*)\)", r.stderr)
    if not peak:
        sys.exit("peer: strata train did not say its MFU peak:\n" + r.stderr[-3000:])
    mfu = sum(x["mfu"] * t for x, t in zip(timed, seconds)) / sum(seconds)
    mode = re.search(r"weights (resident|stream),", r.stderr)  # offload.weights as the run resolved it
    attention = re.search(r"CPU attention kernel (\S+)", r.stderr)
    return (tokens / sum(seconds), [x["loss"] for x in recs], mfu, float(peak.group(1)) * 1e12,
            mode.group(1) if mode else "?", attention.group(1) if attention else "?")


def check_losses(strata, workdir, model, rows, c):
    """torch's loss on one batch against `strata grad` on the same weights (f32 only)."""
    import torch
    batch = rows[: c["mb"]]
    with open(os.path.join(workdir, "batch.json"), "w") as f:
        json.dump({"input_ids": batch}, f)
    r = subprocess.run([strata, "grad", "--model", os.path.join(workdir, "model"), "--batch",
                        os.path.join(workdir, "batch.json"), "--out", os.path.join(workdir, "grad.safetensors")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"peer: strata grad failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    strata_loss = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
    with torch.no_grad():
        torch_loss = float(model(torch.tensor(batch, dtype=torch.long)))
    return torch_loss, strata_loss


def run_config(name, args):
    import torch
    c = CONFIGS[name]
    workdir = tempfile.mkdtemp(prefix=f"strata-peer-{name}-", dir=args.keep or None)
    try:
        model = build_model(c)
        os.makedirs(os.path.join(workdir, "model"))
        with open(os.path.join(workdir, "model", "config.json"), "w") as f:
            json.dump(hf_config(c), f, indent=1)
        write_safetensors(os.path.join(workdir, "model", "model.safetensors"), hf_names(model))
        g = torch.Generator().manual_seed(SEED + 1)
        n_rows = c["mb"] * args.steps
        rows = torch.randint(3, c["vocab"], (n_rows, c["T"]), generator=g).tolist()
        with open(os.path.join(workdir, "tokens.json"), "w") as f:
            json.dump({"input_ids": rows}, f)
        torch_loss, strata_loss = check_losses(args.strata, workdir, model, rows, c)
        rel = abs(torch_loss - strata_loss) / abs(torch_loss)
        print(f"{name}: loss on one batch at the initial weights: torch {torch_loss:.7f}, strata {strata_loss:.7f} "
              f"(relative difference {rel:.1e}, f32)", flush=True)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        t_rates, s_rates, mfus, peaks, modes, kernels = [], [], [], [], set(), set()
        for r in range(args.rounds):
            order = ("torch", "strata") if r % 2 == 0 else ("strata", "torch")
            for who in order:
                if who == "torch":
                    model.load_state_dict(state)
                    rate, _ = torch_train(model, rows, c, args.steps, args.threads)
                    t_rates.append(rate)
                else:
                    rate, _, mfu, peak, mode, kernel = strata_train(args.strata, workdir, c, args.steps,
                                                                    args.threads, args.weights)
                    s_rates.append(rate)
                    modes.add(mode)
                    kernels.add(kernel)
                    mfus.append(mfu)
                    peaks.append(peak)
            print(f"{name} round {r + 1}: torch {t_rates[-1]:,.0f} tokens/s, strata {s_rates[-1]:,.0f} tokens/s "
                  f"(weights {mode}), "
                  f"strata MFU {100 * mfus[-1]:.1f}% of a {peaks[-1] / 1e9:,.1f} GFLOP/s {c['dtype']} GEMM peak "
                  f"measured by that run", flush=True)
        t, s = statistics.median(t_rates), statistics.median(s_rates)
        return {"name": name, "dtype": c["dtype"], "torch_tokens_per_s": round(t, 1), "strata_tokens_per_s": round(s, 1),
                "ratio": round(s / t, 4), "strata_mfu": round(statistics.median(mfus), 4),
                "peak_flops_per_s": round(statistics.median(peaks)), "peak_dtype": c["dtype"], "rounds": args.rounds, "steps": args.steps, "threads": args.threads,
                "loss_rel_diff_f32": rel, "strata_weights": "/".join(sorted(modes)),
                "strata_attention_kernel": "/".join(sorted(kernels)),
                "round_ratios": [round(s_r / t_r, 4) for s_r, t_r in zip(s_rates, t_rates)]}
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", required=True, help="the strata binary")
    ap.add_argument("--config", default="all", choices=["all"] + list(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per run (the first is not timed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", default="", help="keep the work folders under this directory")
    ap.add_argument("--weights", default="auto", choices=["auto", "stream", "device"],
                    help="strata's offload.weights (auto: its default, resident when the model fits)")
    args = ap.parse_args()
    if args.steps < 2 or args.rounds < 1:
        sys.exit("peer: --steps must be at least 2 and --rounds at least 1")
    if args.keep:
        if os.path.exists(args.keep) and not os.path.isdir(args.keep):
            sys.exit(f"peer: --keep {args.keep} is not a directory: name a folder to keep the runs in")
        os.makedirs(args.keep, exist_ok=True)
    try:
        import torch
    except ImportError:
        sys.exit("peer: python3-torch is not installed: bash scripts/setup.sh --bench")
    blas = blas_in_use()
    cpu = cpu_info()
    print(f"peer: torch {torch.__version__}, {args.threads} threads, BLAS {blas}, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}", flush=True)
    print(f"peer: CPU {cpu['model']}, AMX-BF16 {'yes' if cpu['amx_bf16'] else 'no'}, "
          f"AVX512-BF16 {'yes' if cpu['avx512_bf16'] else 'no'}", flush=True)
    if blas != "openblas":
        print("peer: warning: torch is not using OpenBLAS; install libopenblas0-pthread (scripts/setup.sh "
              "--bench) or the torch figures are not the fast configuration", flush=True)
    names = list(CONFIGS) if args.config == "all" else [args.config]
    results = [run_config(n, args) for n in names]
    print(f"{'config':<12}{'dtype':<7}{'torch tok/s':>14}{'strata tok/s':>14}{'strata/torch':>14}{'strata MFU':>12}"
          f"{'GEMM peak':>16}  weights")
    for r in results:
        print(f"{r['name']:<12}{r['dtype']:<7}{r['torch_tokens_per_s']:>14,.0f}{r['strata_tokens_per_s']:>14,.0f}"
              f"{r['ratio']:>14.2f}{100 * r['strata_mfu']:>11.1f}%{r['peak_flops_per_s'] / 1e9:>10,.1f} GFLOP/s"
              f"  {r['strata_weights']}")
    for r in results:  # how much the machine moved the figures: each round's own ratio
        print(f"{r['name']}: per-round strata/torch " + ", ".join(f"{x:.2f}" for x in r["round_ratios"]))
    print(json.dumps({"peer": {"blas": blas, "cpu": cpu, "configs": results}}))


if __name__ == "__main__":
    main()
