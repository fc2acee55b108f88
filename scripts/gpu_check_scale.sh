# shellcheck shell=bash disable=SC2154,SC2317,SC2054  # sourced by gpu_check.sh (its variables); commas are sizes
# The GPU scale check: `bash scripts/gpu_check.sh OUT_DIR --scale [--deps-prefix DIR]
# [--backend cuda|cpu] [--no-build]` sources this after its option parsing and `machine` step
# (it uses their step, out, work, build, backend, deps, build_it, cmake_args and failed). One
# device call of at most 6 minutes including the build (sm_90 only, no tests), each phase under
# a timeout drawn from what is left of STRATA_SCALE_BUDGET_S (345 s on cuda):
#   build        strata and strata-bench
#   attention    (a) strata-bench attention, T 4096 and 8192, 32 query / 8 KV heads, D 128, bf16,
#                and the device's bf16 GEMM rate (8192^3, random operands)
#   sdpa         (a) torch.nn.functional.scaled_dot_product_attention at the same shapes
#   estimate     strata estimate's step for the recipe on an H200: the datasheet's rates, and
#                the GEMM rate measured above with this host's AdamW and memory measured
#   train        (b) strata train recipes/gpu-scale/recipe.toml: 3.02B parameters, bf16, weights
#                streamed, state in RAM, 16 x 4096 tokens a step; stopped (SIGKILL) once 4 steps
#                are recorded, before the end-of-run save (36 GB of state to disk)
#   transformers (c) scripts/gpu_scale.py train: the same model and rows trained in GPU memory
# then one JSON line with every figure (scripts/gpu_scale.py summary; also OUT_DIR/scale.json).
# --backend cpu runs the same flow on the CPU backend at small sizes (a dry run of the script;
# its figures mean nothing): a 4-layer model, T 256 and 512, 8 x 256 tokens a step.
# STRATA_PYTHON: the python with torch and transformers (default python3).

# Python runs with the loader path it had before --deps-prefix's libraries were put first
# (Debian 12's libraries are older than the ones torch's wheels were built against).
py_env=(env LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}")
[ -n "$deps" ] && py_env=(env LD_LIBRARY_PATH="${LD_LIBRARY_PATH#"$deps/usr/lib/x86_64-linux-gnu:"}")
py=("${py_env[@]}" "${STRATA_PYTHON:-python3}")
# work: the parent's temporary folder (tokens, the tiny config, the run dir), removed at the end
steps=4  # optimizer steps of the streamed run that are recorded; the first is its warm-up
if [ "$backend" = cuda ]; then
  budget="${STRATA_SCALE_BUDGET_S:-345}"
  config=recipes/gpu-scale/config.json seq=4096 rows=16 memory=120GiB
  attn=(--tokens 4096,8192 --heads 32 --kv-heads 8 --head-dim 128 --gemm 8192)
  gpu_args=(--gpu H200 --gpu-memory "$memory")  # the run's device.memory: the same plan
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
else
  budget="${STRATA_SCALE_BUDGET_S:-1800}"
  config="$work/tiny/config.json" seq=256 rows=8 memory=1GiB
  mkdir -p "$work/tiny"
  sed -e 's/"hidden_size": 3072/"hidden_size": 256/' -e 's/"intermediate_size": 8192/"intermediate_size": 688/' \
      -e 's/"num_hidden_layers": 28/"num_hidden_layers": 4/' -e 's/"num_attention_heads": 24/"num_attention_heads": 4/' \
      -e 's/"num_key_value_heads": 8/"num_key_value_heads": 2/' -e 's/"head_dim": 128/"head_dim": 64/' \
      -e 's/"vocab_size": 32000/"vocab_size": 2048/' recipes/gpu-scale/config.json > "$config"
  attn=(--tokens 256,512 --heads 4 --kv-heads 2 --head-dim 64 --gemm 512)
  gpu_args=()
fi
deadline=$budget  # SECONDS counts from the start of gpu_check.sh
: > "$out/phases.tsv"

# phase NAME CAP RESERVE COMMAND...: step NAME under a timeout of CAP seconds, or less so that
# RESERVE seconds stay for the phases after it; skipped when under 10 s would be left. The
# phase's wall time and status go to OUT_DIR/phases.tsv.
phase() {
  local name="$1" cap="$2" reserve="$3"; shift 3
  local limit=$((deadline - SECONDS - reserve))
  [ "$limit" -gt "$cap" ] && limit="$cap"
  if [ "$limit" -lt 10 ]; then
    echo "gpu_check: $name skipped: the ${budget} s budget is spent"
    printf '%s\tskipped\t0\t0\n' "$name" >> "$out/phases.tsv"
    failed+=("$name")
    return
  fi
  local t0=$SECONDS n=${#failed[@]}
  step "$name" timeout -k 5 "$limit" "$@"
  local status=ok
  [ ${#failed[@]} -gt "$n" ] && status=failed
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" $((SECONDS - t0)) "$limit" >> "$out/phases.tsv"
}

# The streamed run: stopped with SIGKILL once `steps` steps are in metrics.jsonl, so that the
# run's last step (max_steps = steps + 1) never saves its checkpoint and export; a SIGTERM would
# save too (the trainer saves when stopped by a signal), so the limit is kept here, not by timeout.
scale_train() {
  local limit="$1"; shift
  local t0=$SECONDS metrics="$work/run/metrics.jsonl"
  STRATA_PROGRESS=plain "$build/strata" train recipes/gpu-scale/recipe.toml "$@" </dev/null &
  local pid=$!
  local done_steps=0
  while kill -0 "$pid" 2>/dev/null; do
    done_steps=$(grep -c '"loss"' "$metrics" 2>/dev/null); done_steps=${done_steps:-0}
    if [ "$done_steps" -ge "$steps" ] || [ $((SECONDS - t0)) -ge "$limit" ]; then
      kill -9 "$pid"; wait "$pid" 2>/dev/null
      echo "gpu_check: strata train stopped after $done_steps recorded steps in $((SECONDS - t0)) s" \
           "(SIGKILL, before the end-of-run save)"
      [ "$done_steps" -ge 2 ]  # a warm-up and one timed step at least
      return
    fi
    sleep 0.2
  done
  wait "$pid"
}

if [ "$build_it" = 1 ]; then
  phase build "$budget" 150 bash -c "cmake ${cmake_args[*]@Q} && cmake --build '$build' -j\$(nproc) --target strata strata-bench"
fi
strata="$build/strata"
train_args=(data.path="$work/tokens.json" model.config="$(realpath "$config")" data.sequence_len="$seq"
            train.global_batch_size="$rows" train.max_steps=$((steps + 1)) device.backend="$backend"
            device.memory="$memory" checkpoint.output_dir="$work/run")
step tokens "${py[@]}" scripts/gpu_scale.py tokens --config "$config" --rows $((rows * (steps + 1))) --seq "$seq" \
  --out "$work/tokens.json"
phase attention 60 140 "$build/strata-bench" attention --backend "$backend" "${attn[@]}"
phase sdpa 60 130 "${py[@]}" scripts/gpu_scale.py sdpa --device "$backend" "${attn[@]:0:8}"
phase estimate 30 120 "$strata" estimate recipes/gpu-scale/recipe.toml "${gpu_args[@]}" --json "${train_args[@]}"
gemm=$("${py_env[@]}" python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.startswith("{"): print(json.loads(l)["attention"]["gemm_flops_per_s"])' "$out/attention.log" 2>/dev/null)
if [ -n "$gemm" ] && [ "$backend" = cuda ]; then
  phase estimate-measured 30 120 "$strata" estimate recipes/gpu-scale/recipe.toml "${gpu_args[@]}" --gpu-flops "$gemm" \
    --measure --json "${train_args[@]}"
fi
left=$((deadline - SECONDS - 100))  # the streamed run: all but what the transformers run needs
[ "$left" -gt 200 ] && left=200
if [ "$left" -ge 10 ]; then
  t0=$SECONDS n=${#failed[@]}
  step train scale_train "$left" "${train_args[@]}" --overwrite
  status=ok; [ ${#failed[@]} -gt "$n" ] && status=failed
  printf 'train\t%s\t%s\t%s\n' "$status" $((SECONDS - t0)) "$left" >> "$out/phases.tsv"
else
  printf 'train\tskipped\t0\t0\n' >> "$out/phases.tsv"; failed+=(train)
fi
cp "$work/run/metrics.jsonl" "$out/train_metrics.jsonl" 2>/dev/null
cp "$work/run/plan.json" "$out/train_plan.json" 2>/dev/null
left=$((deadline - SECONDS - 5))
phase transformers 200 5 "${py[@]}" scripts/gpu_scale.py train --device "$backend" --config "$config" \
  --data "$work/tokens.json" --seq "$seq" --global-batch "$rows" --steps 3 --time-budget $((left * 2 / 5))
cp "$config" "$out/config.json"
rm -rf "$work"

"${py_env[@]}" python3 scripts/gpu_scale.py summary "$out" --config "$out/config.json" --seq "$seq" --global-batch "$rows" --steps "$steps" \
  --backend "$backend" --budget "$budget" --elapsed "$SECONDS" --failed "${failed[*]}" | tee "$out/scale.json"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed: ${failed[*]}"
  exit 1
fi
echo "gpu_check: the scale check ran every phase; logs in $out"
exit 0
