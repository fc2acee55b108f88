#!/usr/bin/env python3
"""The Python side of the GPU scale check (scripts/gpu_check.sh OUT_DIR --scale).

  gpu_scale.py tokens --config config.json --rows R --seq T --out tokens.json
      random token ids, one T-token document per row, in strata's pre-tokenized format
      ({"input_ids": [[...], ...]}); needs no torch.
  gpu_scale.py sdpa --tokens 4096,8192 --heads 32 --kv-heads 8 --head-dim 128
      torch.nn.functional.scaled_dot_product_attention, causal, bf16, forward + backward,
      TFLOP/s counted as strata-bench attention counts them (FlashAttention's convention).
  gpu_scale.py train --config config.json --data tokens.json --seq T --global-batch 16
      the same model trained in device memory by Hugging Face transformers as a careful user
      would: random init from config.json (nothing downloaded), fp32 master weights, bf16
      autocast, attn_implementation="sdpa", torch.optim.AdamW(fused=True), gradient clipping at
      1.0 as strata's recipe does; the largest micro-batch that fits (tried, without gradient
      checkpointing first; with it only when one row does not fit), accumulated to the global
      batch; a few optimizer steps timed after a warm-up one.

  gpu_scale.py summary OUT_DIR --config config.json --seq T --global-batch 16
      every figure of the check's logs in OUT_DIR as one JSON line; needs no torch.

Each prints a short table on stderr and one JSON line on stdout. --device cpu runs the same code
at small sizes (a dry run: bf16 autocast on the CPU, no out-of-memory to find).
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def cmd_tokens(a):
    cfg = json.load(open(a.config))
    rng = random.Random(a.seed)
    vocab = int(cfg["vocab_size"])
    rows = [[rng.randrange(3, vocab) for _ in range(a.seq)] for _ in range(a.rows)]
    with open(a.out, "w") as f:
        json.dump({"input_ids": rows}, f, separators=(",", ":"))
    print(json.dumps({"tokens": {"rows": a.rows, "seq": a.seq, "vocab": vocab, "path": a.out}}))


def sync(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def sdpa_flops(b, h, t, d):
    """Useful FLOPs of causal attention, forward and backward (strata-bench attention's count)."""
    fwd = 4.0 * b * h * d * t * t / 2
    return fwd, 2.5 * fwd


def cmd_sdpa(a):
    import torch
    import torch.nn.functional as F
    dev = a.device
    rows = []
    for t in [int(x) for x in a.tokens.split(",")]:
        g = torch.Generator(device=dev).manual_seed(t)
        def rand(*shape):
            return (torch.rand(*shape, generator=g, device=dev) * 2 - 1).to(torch.bfloat16)
        q = rand(a.batch, a.heads, t, a.head_dim).requires_grad_()         # (B,H,T,D)
        k = rand(a.batch, a.kv_heads, t, a.head_dim).requires_grad_()      # (B,Hk,T,D)
        v = rand(a.batch, a.kv_heads, t, a.head_dim).requires_grad_()      # (B,Hk,T,D)
        dout = rand(a.batch, a.heads, t, a.head_dim)                       # (B,H,T,D)
        rep = a.heads // a.kv_heads

        # Two ways a user calls it with grouped KV heads; the faster is SDPA's figure.
        def gqa():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def expanded():  # transformers' repeat_kv, then plain multi-head SDPA
            return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1),
                                                  v.repeat_interleave(rep, dim=1), is_causal=True)
        fwd_flops, bwd_flops = sdpa_flops(a.batch, a.heads, t, a.head_dim)
        best = None
        for name, fn in (("enable_gqa", gqa), ("repeat_kv", expanded)):
            try:
                f_s, b_s = [], []
                for r in range(a.reps + 2):  # two warm-ups
                    q.grad = k.grad = v.grad = None
                    sync(dev)
                    t0 = time.perf_counter()
                    out = fn()
                    sync(dev)
                    t1 = time.perf_counter()
                    out.backward(dout)
                    sync(dev)
                    t2 = time.perf_counter()
                    if r >= 2:
                        f_s.append(t1 - t0)
                        b_s.append(t2 - t1)
            except RuntimeError as e:  # a backend that refuses the call (e.g. enable_gqa)
                log(f"sdpa {name} T {t}: {str(e).splitlines()[0]}")
                continue
            fs, bs = statistics.median(f_s), statistics.median(b_s)
            row = {"t": t, "variant": name, "forward_s": fs, "backward_s": bs, "fwd_bwd_s": fs + bs,
                   "forward_tflops": fwd_flops / fs / 1e12, "backward_tflops": bwd_flops / bs / 1e12,
                   "fwd_bwd_tflops": (fwd_flops + bwd_flops) / (fs + bs) / 1e12}
            log(f"sdpa {name:10s} T {t:6d}: forward {fs:.5f} s, backward {bs:.5f} s, "
                f"fwd+bwd {row['fwd_bwd_tflops']:.1f} TFLOP/s")
            if best is None or row["fwd_bwd_s"] < best["fwd_bwd_s"]:
                best = row
        if best is not None:
            rows.append(best)
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(json.dumps({"sdpa": {"device": name, "torch": torch.__version__, "batch": a.batch, "heads": a.heads,
                               "kv_heads": a.kv_heads, "head_dim": a.head_dim, "dtype": "bf16", "causal": True,
                               "sizes": rows}}))


def param_count(cfg):
    """N of config.json's Llama: embedding, layers (attention, MLP, two norms), final norm, lm_head."""
    c, f, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    h, hk, v = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    d = cfg.get("head_dim") or c // h
    layer = c * h * d * 2 + c * hk * d * 2 + 3 * c * f + 2 * c
    return L * layer + c + v * c * (1 if cfg.get("tie_word_embeddings") else 2)


def build_model(config_path, device):
    import torch
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(config_path)))
    cfg.use_cache = False
    with torch.device(device):  # initialised where it trains: fp32 master weights
        try:
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                                  dtype=torch.float32)
        except TypeError:  # transformers 4.x names it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                                  torch_dtype=torch.float32)
    model.train()
    return model


def is_oom(e):
    import torch
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def cmd_train(a):
    import torch
    dev = a.device
    torch.manual_seed(0)
    cfg = json.load(open(a.config))
    ids = json.load(open(a.data))["input_ids"]
    rows = torch.tensor([r[:a.seq] for r in ids if len(r) >= a.seq], dtype=torch.long)  # (R,T)
    need = a.global_batch * (a.steps + 1)
    if rows.shape[0] < need:
        rows = rows.repeat(math.ceil(need / rows.shape[0]), 1)
    rows = rows.to(dev)
    t_build = time.perf_counter()
    model = build_model(a.config, dev)
    params = [p for p in model.parameters()]
    n = sum(p.numel() for p in params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-5, betas=(0.9, 0.999), eps=1e-8, fused=True)
    build_s = time.perf_counter() - t_build
    log(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}: {n / 1e9:.3f}B "
        f"parameters on {dev} in {build_s:.1f} s")
    cursor = [0]

    def next_rows(b):
        i = cursor[0] % (rows.shape[0] - b + 1)
        cursor[0] = i + b
        return rows[i:i + b]

    def forward_backward(b, scale):
        x = next_rows(b)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        (loss * scale).backward()
        return loss.detach()

    def step(micro, accum):  # one host sync a step, for the loss at its end
        losses = [forward_backward(micro, 1.0 / accum) for _ in range(accum)]
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(torch.stack(losses).mean())

    def release():
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.empty_cache()

    # One row with an optimizer step first, so that the moments are allocated while the larger
    # micro-batches are tried; then doubling while it fits (each micro-batch divides the global
    # batch). Gradient checkpointing only when one row does not fit without it.
    t_search = time.perf_counter()
    checkpointing = False
    tried = []

    def fits(fn):  # the exception (and the tensors its frames hold) is gone before release()
        try:
            fn()
            sync(dev)
            return True
        except RuntimeError as e:
            if not is_oom(e):
                raise
        release()
        return False

    if not fits(lambda: step(1, 1)):
        tried.append({"micro_batch": 1, "fits": False})
        model.gradient_checkpointing_enable()
        checkpointing = True
        step(1, 1)
    tried.append({"micro_batch": 1, "checkpointing": checkpointing, "fits": True})
    micro = 1
    b = 2
    while b <= min(a.global_batch, a.max_micro_batch):
        if a.global_batch % b == 0:
            ok = fits(lambda: forward_backward(b, 1.0))
            release()
            tried.append({"micro_batch": b, "fits": ok})
            if not ok:
                break
            micro = b
        b *= 2
    search_s = time.perf_counter() - t_search
    accum = a.global_batch // micro
    log(f"micro-batch {micro} x {accum} accumulation steps (gradient checkpointing "
        f"{'on' if checkpointing else 'off'}); search {search_s:.1f} s: {tried}")

    while True:  # warm-up at the chosen split; a micro-batch that fit alone but not in a step: halve it
        t0 = time.perf_counter()
        if fits(lambda: step(micro, accum)):
            break
        if micro == 1:
            raise RuntimeError("one row per micro-batch ran out of memory in a whole step")
        tried.append({"micro_batch": micro, "fits_in_a_step": False})
        micro //= 2
        accum = a.global_batch // micro
        log(f"micro-batch {micro * 2} ran out of memory in a whole step: {micro} x {accum} instead")
    warm_s = time.perf_counter() - t0
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    deadline = time.perf_counter() + a.time_budget
    for i in range(a.steps):
        if i > 0 and time.perf_counter() + statistics.median(times) > deadline:
            log(f"stopping after {i} timed steps: --time-budget {a.time_budget} s")
            break
        sync(dev)
        t0 = time.perf_counter()
        losses.append(step(micro, accum))
        sync(dev)
        times.append(time.perf_counter() - t0)
        log(f"step {i + 1}: {times[-1]:.3f} s, loss {losses[-1]:.4f}")
    step_s = statistics.median(times)
    tokens = a.global_batch * a.seq
    peak = torch.cuda.max_memory_allocated() if dev == "cuda" else 0
    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "torch": torch.__version__, "transformers": __import__("transformers").__version__,
           "params": n, "params_from_config": param_count(cfg), "seq": a.seq, "global_batch": a.global_batch,
           "tokens_per_step": tokens, "micro_batch": micro, "accumulation": accum,
           "gradient_checkpointing": checkpointing, "tried": tried, "build_s": build_s, "search_s": search_s,
           "warmup_step_s": warm_s, "step_s": step_s, "steps_s": times, "losses": losses,
           "tokens_per_s": tokens / step_s, "six_n_flops_per_s": 6.0 * n * tokens / step_s,
           "device_peak_bytes": peak}
    log(f"transformers: {tokens / step_s:,.0f} tokens/s, step {step_s:.3f} s, "
        f"6N {6.0 * n * tokens / step_s / 1e12:.1f} TFLOP/s")
    print(json.dumps({"transformers": res}))


def last_json(path, key=None):
    """The last line of a log that is a JSON object (holding `key`, when given); None if none."""
    found = None
    try:
        for line in open(path, errors="replace"):
            line = line.strip()
            if line.startswith("{"):
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if key is None or key in j:
                    found = j
    except OSError:
        pass
    return found


def median_of(records, field):
    vals = [r[field] for r in records if isinstance(r.get(field), (int, float))]
    return statistics.median(vals) if vals else None


def cmd_summary(a):
    """Every figure of the scale check from the logs in OUT_DIR, as one JSON line."""
    out = a.out_dir
    cfg = json.load(open(a.config))
    n = param_count(cfg)
    tokens = a.global_batch * a.seq
    res = {"backend": a.backend, "budget_s": a.budget, "elapsed_s": a.elapsed,
           "failed": a.failed.split() if a.failed else [],
           "model": {"params": n, "hidden": cfg["hidden_size"], "layers": cfg["num_hidden_layers"],
                     "heads": cfg["num_attention_heads"], "kv_heads": cfg["num_key_value_heads"],
                     "intermediate": cfg["intermediate_size"], "vocab": cfg["vocab_size"], "seq": a.seq,
                     "global_batch": a.global_batch, "tokens_per_step": tokens}}
    phases = {}
    try:
        for line in open(os.path.join(out, "phases.tsv")):
            name, status, wall, limit = line.rstrip("\n").split("\t")
            phases[name] = {"status": status, "wall_s": int(wall), "limit_s": int(limit)}
    except OSError:
        pass
    res["phases"] = phases

    # (a) attention: strata's against SDPA's at each T
    att = (last_json(os.path.join(out, "attention.log"), "attention") or {}).get("attention", {})
    sdpa = (last_json(os.path.join(out, "sdpa.log"), "sdpa") or {}).get("sdpa", {})
    gemm = att.get("gemm_flops_per_s") or None
    by_t = {r["t"]: r for r in sdpa.get("sizes", [])}
    rows = []
    for r in att.get("sizes", []):
        s_ = by_t.get(r["t"], {})
        rows.append({"t": r["t"], "strata_tflops": r["fwd_bwd_tflops"], "strata_fwd_tflops": r["forward_tflops"],
                     "strata_bwd_tflops": r["backward_tflops"], "sdpa_tflops": s_.get("fwd_bwd_tflops"),
                     "sdpa_variant": s_.get("variant"),
                     "strata_over_sdpa": r["fwd_bwd_tflops"] / s_["fwd_bwd_tflops"] if s_ else None})
    res["attention"] = {"heads": att.get("heads"), "kv_heads": att.get("kv_heads"), "head_dim": att.get("head_dim"),
                        "device": att.get("device"), "sizes": rows, "gemm_tflops": gemm / 1e12 if gemm else None}

    # (b) the streamed run: the steps after the first (its warm-up)
    recs = []
    try:
        recs = [json.loads(l) for l in open(os.path.join(out, "train_metrics.jsonl")) if '"loss"' in l][:a.steps]
    except OSError:
        pass
    timed = [r for r in recs if r["step"] > 1] or recs
    peak, peak_source, split, placement = None, None, None, None
    try:
        for line in open(os.path.join(out, "train.log"), errors="replace"):
            if "train.global_batch_size =" in line:  # the planner's split of the step's rows
                split = line.split("train.global_batch_size =", 1)[1].split(":", 1)[-1].strip()
            if "parameters (" in line and "weights" in line and line.startswith("strata train: "):
                placement = line[len("strata train: "):].strip()  # weights, checkpoints, kept activations
            if "MFU is relative to" in line:  # strata train: MFU is relative to 989 TFLOP/s (datasheet: ...)
                rest = line.split("MFU is relative to", 1)[1].strip()
                peak = float(rest.split()[0]) * 1e12
                peak_source = rest.split("(", 1)[1].rstrip(")\n") if "(" in rest else None
    except OSError:
        pass
    if peak is None and a.backend == "cuda":  # the run never said: the H200's, as the trainer's table has it
        peak, peak_source = 989e12, "datasheet: H200 dense bf16 (the trainer's table; not from the run's log)"
    train = None
    if timed:
        step_s = median_of(timed, "step_s")
        tps = tokens / step_s
        six_n = 6.0 * n * tps
        phase_s = {k: median_of(timed, k) for k in ("compute_s", "h2d_wait_s", "d2h_wait_s", "optimizer_exposed_s",
                                                     "optimizer_s", "link_busy_s", "save_s")}
        ops = {}
        for k in timed[0].get("op_s", {}):
            ops[k] = statistics.median(r["op_s"][k] for r in timed)
        model_ref = next((r["step_model"] for r in recs if "step_model" in r), None)
        train = {"steps_recorded": len(recs), "steps_timed": [r["step"] for r in timed], "step_s": step_s,
                 "steps_s": [r["step_s"] for r in recs], "losses": [r["loss"] for r in recs],
                 "tokens_per_s": tps, "six_n_tflops": six_n / 1e12,
                 "mfu_datasheet": six_n / peak if peak else None, "peak_tflops": peak / 1e12 if peak else None,
                 "peak_source": peak_source, "mfu_measured_gemm": six_n / gemm if gemm else None,
                 "trainer_mfu": median_of(timed, "mfu"), "phases_s": phase_s, "op_s": ops,
                 "link_bytes": median_of(timed, "link_bytes"), "device_peak_bytes": timed[-1].get("device_peak_bytes"),
                 "host_rss_peak_bytes": timed[-1].get("host_rss_peak_bytes"), "step_model": model_ref}
    if train is not None:
        train["split"], train["placement"] = split, placement
        train["startup_s"] = (phases["train"]["wall_s"] - sum(train["steps_s"])) if "train" in phases else None
    res["strata"] = train

    # strata estimate's step for the same recipe: the datasheet's rates and the measured GEMM rate
    for name, key in (("estimate.log", "estimate"), ("estimate-measured.log", "estimate_measured_gemm")):
        e = last_json(os.path.join(out, name), "step")
        if not e or not e.get("step"):
            res[key] = None
            continue
        st = e["step"]
        res[key] = {"step_s": st["seconds"], "tokens_per_s": st.get("tokens_per_s"), "mfu": st.get("mfu"),
                    "bottleneck": st.get("bottleneck"), "components": st.get("components"),
                    "micro_batch_size": e.get("micro_batch_size"),
                    "gradient_accumulation_steps": e.get("gradient_accumulation_steps"),
                    "accumulation": e.get("accumulation"),
                    "measured_over_estimate": train["step_s"] / st["seconds"] if train and st["seconds"] else None}

    # (c) transformers + PyTorch in GPU memory
    tf = (last_json(os.path.join(out, "transformers.log"), "transformers") or {}).get("transformers")
    if tf:
        tf = {k: tf.get(k) for k in ("tokens_per_s", "step_s", "steps_s", "micro_batch", "accumulation",
                                     "gradient_checkpointing", "tried", "params", "six_n_flops_per_s",
                                     "device_peak_bytes", "torch", "transformers", "losses")}
        tf["six_n_tflops"] = 6.0 * n * tf["tokens_per_s"] / 1e12
        tf["mfu_datasheet"] = tf["six_n_tflops"] * 1e12 / peak if peak else None
    res["transformers"] = tf
    res["strata_over_transformers"] = (train["tokens_per_s"] / tf["tokens_per_s"]
                                       if train and tf and tf.get("tokens_per_s") else None)

    # the targets, as measured here (report only)
    def at_least(x, bound):
        return None if x is None else bool(x >= bound)
    est = res.get("estimate") or {}
    ratio = est.get("measured_over_estimate")
    res["targets"] = {
        "attention_200_tflops": {str(r["t"]): at_least(r["strata_tflops"], 200) for r in rows},
        "mfu_datasheet_0.40": at_least(train and train["mfu_datasheet"], 0.40),
        "over_transformers_0.8": at_least(res["strata_over_transformers"], 0.8),
        "estimate_within_20pct": None if ratio is None else bool(abs(ratio - 1) <= 0.2),
    }
    print(json.dumps({"scale": res}, separators=(",", ":")))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokens", help="random token ids in strata's pre-tokenized format")
    t.add_argument("--config", required=True)
    t.add_argument("--rows", type=int, required=True)
    t.add_argument("--seq", type=int, required=True)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--out", required=True)
    s = sub.add_parser("sdpa", help="torch SDPA forward + backward TFLOP/s")
    s.add_argument("--tokens", default="4096,8192")
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--heads", type=int, default=32)
    s.add_argument("--kv-heads", type=int, default=8)
    s.add_argument("--head-dim", type=int, default=128)
    s.add_argument("--reps", type=int, default=5)
    s.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r = sub.add_parser("train", help="the model trained in device memory by transformers + torch")
    r.add_argument("--config", required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--seq", type=int, required=True)
    r.add_argument("--global-batch", type=int, required=True)
    r.add_argument("--steps", type=int, default=3, help="timed optimizer steps after the warm-up one")
    r.add_argument("--max-micro-batch", type=int, default=1 << 30)
    r.add_argument("--time-budget", type=float, default=1e9, help="seconds for the timed steps")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    m = sub.add_parser("summary", help="every figure of the scale check's logs as one JSON line")
    m.add_argument("out_dir")
    m.add_argument("--config", required=True)
    m.add_argument("--seq", type=int, required=True)
    m.add_argument("--global-batch", type=int, required=True)
    m.add_argument("--steps", type=int, default=4, help="the streamed run's recorded steps (the first is not timed)")
    m.add_argument("--backend", default="cuda")
    m.add_argument("--budget", type=int, default=0)
    m.add_argument("--elapsed", type=int, default=0)
    m.add_argument("--failed", default="")
    a = p.parse_args()
    {"tokens": cmd_tokens, "sdpa": cmd_sdpa, "train": cmd_train, "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    main()
