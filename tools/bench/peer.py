"""The peer benchmark (`strata-bench peer` runs this with the python it chose): the same
Llama-family model trained on the same token rows by strata and by today's PyTorch in three forms
(tools/bench/peer_torch.py: eager with scaled_dot_product_attention, torch.compile'd, and
transformers' LlamaForCausalLM), interleaved over several rounds; tokens/s of each and strata's
ratio to the fastest torch form.

Every side starts from the same weights (written here as a Hugging Face model directory) and
trains with AdamW (the same hyperparameters, weight decay on matrices, global-norm clipping at 1.0)
on the same micro-batch of random token rows: the data file holds exactly one micro-batch, so
every step of every side sees the same rows and the step-1 losses of all four must agree (f32:
relative 1e-4; bf16: 3e-2, autocast and strata's bf16 round in different places); a mismatch stops
the benchmark. Before timing, torch's f32 loss is also compared with `strata grad` (f32).

Each strata run reports its MFU: the model FLOPs per second of its timed steps over the GEMM peak
(the CPU backend's own matmul in the config's dtype) that the same `strata train` process
measured at its start, so the ceiling is taken in the same run, under the same load. `--profile`
adds each side's time per op for one step: strata's from metrics.jsonl's op_s, torch's from
torch.profiler (self CPU time).

usage: python tools/bench/peer.py --strata build/strata [--config all|quickstart|mid|mid-bf16|large|large-bf16]
         [--rounds R] [--steps S] [--threads N] [--keep DIR] [--weights auto|stream|device]
         [--forms eager,compile,transformers] [--profile] [--torch-origin TEXT]
Ends with one JSON line: {"peer": {"cpu", "versions", "configs": [{"name", "dtype", "torch_tokens_per_s"
(the fastest form's), "torch_fastest", "torch_eager_tokens_per_s", "torch_compile_tokens_per_s",
"transformers_tokens_per_s", "strata_tokens_per_s", "ratio", "strata_mfu", "peak_flops_per_s", ...}]}}.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "golden"))
from safetensors_file import safetensors_write_blobs  # noqa: E402  (tools/golden: the one writer)
import peer_torch  # noqa: E402

LLAMA = dict(tied=False)
CONFIGS = {
    # the bundled quickstart model (recipes/quickstart/config.json): 0.8M parameters, tied
    "quickstart": dict(dtype="f32", T=256, mb=8, hidden=128, inter=352, layers=4, heads=4, kv=2, head_dim=32,
                       vocab=256, tied=True),
    # hidden 512, 8 layers, GQA 8/4, intermediate 1408, vocab 8192, T=512, micro-batch 4 (~32M parameters)
    "mid": dict(LLAMA, dtype="f32", T=512, mb=4, hidden=512, inter=1408, layers=8, heads=8, kv=4, head_dim=64,
                vocab=8192),
    "mid-bf16": dict(LLAMA, dtype="bf16", T=512, mb=4, hidden=512, inter=1408, layers=8, heads=8, kv=4,
                     head_dim=64, vocab=8192),
    # hidden 1024, 16 layers, GQA 16/8, intermediate 2816, vocab 32000, T=1024, micro-batch 2 (~254M parameters)
    "large": dict(LLAMA, dtype="f32", T=1024, mb=2, hidden=1024, inter=2816, layers=16, heads=16, kv=8,
                  head_dim=64, vocab=32000),
    "large-bf16": dict(LLAMA, dtype="bf16", T=1024, mb=2, hidden=1024, inter=2816, layers=16, heads=16, kv=8,
                       head_dim=64, vocab=32000),
}
TOLERANCE = {"f32": 1e-4, "bf16": 3e-2}  # relative, on the step-1 loss


def cpu_info():
    """The CPU's model name and the ISA that decides both sides' bf16 GEMMs (an AMX tile unit makes
    oneDNN's bf16 peak about four times AVX512-BF16's)."""
    info = {"model": "unknown", "amx_bf16": False, "avx512_bf16": False, "avx512f": False, "isa": "AVX2-only"}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and info["model"] == "unknown":
                    info["model"] = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    info.update(amx_bf16="amx_bf16" in flags, avx512_bf16="avx512_bf16" in flags,
                                avx512f="avx512f" in flags)
                    break
    except OSError:
        pass
    info["isa"] = ("AMX" if info["amx_bf16"] else "AVX-512-BF16" if info["avx512_bf16"]
                   else "AVX-512" if info["avx512f"] else "AVX2-only")
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


def strata_train(strata, workdir, c, steps, threads, weights):
    """One `strata train` run of `steps` steps (the first warms up). Returns its tokens/s over the
    timed steps, its losses, MFU, the peak it measured, the weights mode, the attention kernel, and the
    median per-op seconds of its timed steps."""
    out = os.path.join(workdir, "out")
    shutil.rmtree(out, ignore_errors=True)
    recipe = os.path.join(workdir, "recipe.toml")
    memory = "4GiB" if c["hidden"] <= 512 else "8GiB"
    with open(recipe, "w") as f:
        f.write(f"""[model]\npath = "model"\ndtype = "{c['dtype']}"\n
[data]\npath = "tokens.json"\nformat = "tokens"\nsequence_len = {c['T']}\npacking = false\n
[train]\nmax_steps = {steps}\nmicro_batch_size = {c['mb']}\nseed = 1\nlog_steps = 1000\n
[optim]\nlearning_rate = {peer_torch.LR}\nweight_decay = {peer_torch.WD}\nmax_grad_norm = {peer_torch.CLIP}
lr_scheduler_type = "constant"\n
[device]\nbackend = "cpu"\nmemory = "{memory}"\ncpu_threads = {threads}\n
[offload]\nweights = "{weights}"\n
[checkpoint]\noutput_dir = "out"\nsave_dtype = "f32"\n""")
    r = subprocess.run([strata, "train", recipe], capture_output=True, text=True, cwd=workdir)
    if r.returncode != 0:
        sys.exit(f"peer: strata train failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l and '"step"' in l]
    timed = [x for x in recs if x["step"] > 1]
    tokens = sum(c["mb"] * (c["T"] - 1) for _ in timed)  # trained tokens (T - 1 per row), as torch counts
    seconds = [x["tokens"] / x["tokens_per_s"] for x in timed]
    peak = re.search(r"MFU is relative to ([0-9.e+-]+) TFLOP/s \(([^)]*)\)", r.stderr)
    if not peak:
        sys.exit("peer: strata train did not say its MFU peak:\n" + r.stderr[-3000:])
    mfu = sum(x["mfu"] * t for x, t in zip(timed, seconds)) / sum(seconds)
    mode = re.search(r"weights (resident|stream),", r.stderr)  # offload.weights as the run resolved it
    attention = re.search(r"CPU attention kernel (\S+)", r.stderr)
    ops = {k: statistics.median(x["op_s"][k] for x in timed) for k in timed[0].get("op_s", {})}
    ops["step"] = statistics.median(seconds)
    return dict(rate=tokens / sum(seconds), losses=[x["loss"] for x in recs], mfu=mfu,
                peak=float(peak.group(1)) * 1e12, mode=mode.group(1) if mode else "?",
                kernel=attention.group(1) if attention else "?", ops=ops)


def strata_grad_loss(strata, workdir, rows):
    with open(os.path.join(workdir, "batch.json"), "w") as f:
        json.dump({"input_ids": rows}, f)
    r = subprocess.run([strata, "grad", "--model", os.path.join(workdir, "model"), "--batch",
                        os.path.join(workdir, "batch.json"), "--out", os.path.join(workdir, "grad.safetensors")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"peer: strata grad failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["loss"]


def available_forms(wanted):
    import torch
    forms = []
    for f in wanted:
        if f == "compile" and not hasattr(torch.nn.Module, "compile"):
            print("peer: this torch has no Module.compile (before 2.2): the compile form is left out", flush=True)
        elif f == "transformers" and peer_torch.versions()["transformers"] is None:
            print("peer: transformers is not installed with this torch: its form is left out", flush=True)
        else:
            forms.append(f)
    return forms


def run_config(name, args, forms):
    import torch
    torch.set_num_threads(args.threads)
    c = CONFIGS[name]
    workdir = tempfile.mkdtemp(prefix=f"strata-peer-{name}-", dir=args.keep or None)
    try:
        eager = peer_torch.build_model(c)
        named = peer_torch.hf_names(eager)
        os.makedirs(os.path.join(workdir, "model"))
        with open(os.path.join(workdir, "model", "config.json"), "w") as f:
            json.dump(hf_config(c), f, indent=1)
        write_safetensors(os.path.join(workdir, "model", "model.safetensors"), named)
        g = torch.Generator().manual_seed(peer_torch.SEED + 1)
        rows = torch.randint(3, c["vocab"], (c["mb"], c["T"]), generator=g).tolist()  # one micro-batch
        with open(os.path.join(workdir, "tokens.json"), "w") as f:
            json.dump({"input_ids": rows}, f)
        f32 = dict(c, dtype="f32")
        torch_f32, strata_f32 = peer_torch.loss_at("eager", eager, rows, f32), strata_grad_loss(args.strata, workdir, rows)
        rel = abs(torch_f32 - strata_f32) / abs(torch_f32)
        print(f"{name}: f32 loss at the initial weights: torch {torch_f32:.7f}, strata grad {strata_f32:.7f} "
              f"(relative difference {rel:.1e})", flush=True)
        if rel > TOLERANCE["f32"]:
            sys.exit(f"peer: {name}: torch and strata disagree on the f32 loss ({rel:.1e}): the comparison is void")
        state = {k: v.clone() for k, v in eager.state_dict().items()}
        models = {"eager": eager}
        if "compile" in forms:
            models["compile"] = peer_torch.compile_regions(peer_torch.build_model(c))
        if "transformers" in forms:
            models["transformers"] = peer_torch.build_hf(hf_config(c), named)
        hf_state = {k: v.clone() for k, v in models["transformers"].state_dict().items()} if "transformers" in models else None
        rates = {k: [] for k in ["strata"] + forms}
        step1, mfus, peaks, modes, kernels, strata_ops, optim = {}, [], [], set(), set(), [], set()
        sides = ["strata"] + forms
        for r in range(args.rounds):
            order = sides[r % len(sides):] + sides[: r % len(sides)]  # each side goes first in turn
            for who in order:
                if who == "strata":
                    s = strata_train(args.strata, workdir, c, args.steps, args.threads, args.weights)
                    rates["strata"].append(s["rate"])
                    step1.setdefault("strata", s["losses"][0])
                    mfus.append(s["mfu"])
                    peaks.append(s["peak"])
                    modes.add(s["mode"])
                    kernels.add(s["kernel"])
                    strata_ops.append(s["ops"])
                else:
                    m = models[who]
                    m.load_state_dict(hf_state if who == "transformers" else state)
                    warmup = 2 if who == "compile" else 1  # compile: the compilation, then one settled step
                    rate, losses, kind = peer_torch.train(who, m, rows, c, args.steps - 1, warmup)
                    rates[who].append(rate)
                    step1.setdefault(who, losses[0])
                    optim.add(kind)
            ref = step1["strata"]
            for who, loss in step1.items():
                if abs(loss - ref) / abs(ref) > TOLERANCE[c["dtype"]]:
                    sys.exit(f"peer: {name}: step-1 loss of {who} {loss:.6f} against strata's {ref:.6f}: beyond "
                             f"{TOLERANCE[c['dtype']]:.0e} relative, the sides do not train the same thing")
            print(f"{name} round {r + 1}: " + ", ".join(f"{w} {rates[w][-1]:,.0f}" for w in sides) +
                  f" tokens/s; strata MFU {100 * mfus[-1]:.1f}% of a {peaks[-1] / 1e9:,.1f} GFLOP/s {c['dtype']}"
                  f" GEMM peak measured by that run", flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        fastest = max(forms, key=lambda f: med[f])
        s = med["strata"]
        res = {"name": name, "dtype": c["dtype"], "torch_tokens_per_s": round(med[fastest], 1),
               "torch_fastest": fastest, "strata_tokens_per_s": round(s, 1), "ratio": round(s / med[fastest], 4),
               "strata_mfu": round(statistics.median(mfus), 4), "peak_flops_per_s": round(statistics.median(peaks)),
               "peak_dtype": c["dtype"], "rounds": args.rounds, "steps": args.steps, "threads": args.threads,
               "loss_rel_diff_f32": rel, "step1_loss": {k: round(v, 6) for k, v in step1.items()},
               "strata_weights": "/".join(sorted(modes)), "strata_attention_kernel": "/".join(sorted(kernels)),
               "torch_optimizer": "/".join(sorted(optim)),
               "round_ratios": [round(x / max(rates[f][i] for f in forms), 4) for i, x in enumerate(rates["strata"])]}
        for f, key in (("eager", "torch_eager_tokens_per_s"), ("compile", "torch_compile_tokens_per_s"),
                       ("transformers", "transformers_tokens_per_s")):
            res[key] = round(med[f], 1) if f in med else None
            res[key.replace("tokens_per_s", "rounds")] = [round(x, 1) for x in rates.get(f, [])]
        res["strata_rounds"] = [round(x, 1) for x in rates["strata"]]
        if args.profile:
            res["profile"] = profile_config(name, c, models, state, hf_state, rows, strata_ops)
        return res
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def profile_config(name, c, models, state, hf_state, rows, strata_ops):
    """Per-op seconds of one step: strata's (median over its timed steps) and each torch form's."""
    out = {"strata": {k: round(statistics.median(o[k] for o in strata_ops), 4) for k in strata_ops[0]}}
    print(f"{name} profile, strata (seconds a step, median): " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(out["strata"].items(), key=lambda kv: -kv[1])), flush=True)
    for who, m in models.items():
        m.load_state_dict(hf_state if who == "transformers" else state)
        ops, total = peer_torch.profile(who, m, rows, c)
        out[who] = {"step": round(total, 4), "ops": [[k, round(v, 4)] for k, v in ops]}
        print(f"{name} profile, torch {who} (self CPU seconds of one profiled step of {total:.3f} s): " +
              ", ".join(f"{k} {v:.3f}" for k, v in ops), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", required=True, help="the strata binary")
    ap.add_argument("--config", default="all", choices=["all"] + list(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="steps per run (the first is not timed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", default="", help="keep the work folders under this directory")
    ap.add_argument("--weights", default="auto", choices=["auto", "stream", "device"],
                    help="strata's offload.weights (auto: its default, resident when the model fits)")
    ap.add_argument("--forms", default=",".join(peer_torch.FORMS), help="the torch forms to run, comma-separated")
    ap.add_argument("--profile", action="store_true", help="per-op time of one step of each side")
    ap.add_argument("--torch-origin", default="given", help="where this python came from (strata-bench says)")
    args = ap.parse_args()
    if args.steps < 2 or args.rounds < 1:
        sys.exit("peer: --steps must be at least 2 and --rounds at least 1")
    wanted = [f for f in args.forms.split(",") if f]
    if not wanted or any(f not in peer_torch.FORMS for f in wanted):
        sys.exit(f"peer: --forms takes some of {','.join(peer_torch.FORMS)}")
    if args.keep:
        if os.path.exists(args.keep) and not os.path.isdir(args.keep):
            sys.exit(f"peer: --keep {args.keep} is not a directory: name a folder to keep the runs in")
        os.makedirs(args.keep, exist_ok=True)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit(f"peer: {sys.executable} has no torch: bash scripts/setup.sh --bench makes a venv with it")
    versions = peer_torch.versions()
    cpu = cpu_info()
    print(f"peer: {sys.executable} ({args.torch_origin}): torch {versions['torch']} (oneDNN "
          f"{versions['torch_onednn']}, BLAS {versions['torch_blas']}, capability {versions['torch_cpu_capability']}), "
          f"transformers {versions['transformers']}; {args.threads} threads, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}", flush=True)
    print(f"peer: CPU {cpu['model']}, ISA {cpu['isa']} (AMX-BF16 {'yes' if cpu['amx_bf16'] else 'no'}, "
          f"AVX512-BF16 {'yes' if cpu['avx512_bf16'] else 'no'}); load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    forms = available_forms(wanted)
    names = ["quickstart", "mid", "mid-bf16", "large", "large-bf16"] if args.config == "all" else [args.config]
    results = [run_config(n, args, forms) for n in names]
    print(f"{'config':<12}{'dtype':<6}" + "".join(f"{f + ' tok/s':>19}" for f in forms) +
          f"{'strata tok/s':>14}{'ratio':>8}{'strata MFU':>12}{'GEMM peak':>17}")
    for r in results:
        cols = {"eager": "torch_eager_tokens_per_s", "compile": "torch_compile_tokens_per_s",
                "transformers": "transformers_tokens_per_s"}
        print(f"{r['name']:<12}{r['dtype']:<6}" + "".join(f"{r[cols[f]]:>19,.0f}" for f in forms) +
              f"{r['strata_tokens_per_s']:>14,.0f}{r['ratio']:>8.2f}{100 * r['strata_mfu']:>11.1f}%"
              f"{r['peak_flops_per_s'] / 1e9:>11,.1f} GFLOP/s")
    for r in results:  # how much the machine moved the figures: each round's own ratio
        print(f"{r['name']}: per-round strata / fastest torch form " + ", ".join(f"{x:.2f}" for x in r["round_ratios"]))
    print(f"peer: load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    print(json.dumps({"peer": {"blas": versions["torch_blas"], "python": sys.executable, "torch_origin": args.torch_origin, "versions": versions,
                               "cpu": cpu, "configs": results}}))


if __name__ == "__main__":
    main()
