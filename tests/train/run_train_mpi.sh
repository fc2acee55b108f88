#!/bin/bash
# Data-parallel training under `mpirun -np N` for ctest (label mpi; src/comm/comm.cmake):
#   run_train_mpi.sh STRATA SCENARIO
# on the bundled sft-tiny recipe (tied embeddings, so the tied-head path is covered), CPU backend.
#   equal       separate stores (distributed.shared_host_store = false; resume too):
#               N ranks x A micro-batches give losses, final weights and optimizer state
#               bit-identical to one process with A x N micro-batches, eval losses included (N=2 A=1, clip on and off;
#               N=2 A=2; N=3 A=1; an untied bf16 model), and differ from one process with A (the
#               check can fail)
#   resume      saved with 2 ranks, resumed with 1 (and 1 -> 2): bit-identical to the straight run,
#               said to continue it (no warning); resumed with half the global batch: warned
#   shared      one node's ranks share a store: chosen by default (distributed.shared_host_store =
#               "auto") and forced (true): the same bit-identities (2x1, 3x2, resume 1 -> 2),
#               nothing left in /dev/shm, and 2 ranks use at most 110% of one process's host memory
#               (summed PSS, on a model whose store dominates)
#   nodes       the multi-node layout on one machine (distributed.ranks_per_node pretends nodes): 2
#               nodes x 2 ranks, one shared store per node (auto), x 1 micro-batch = 1 process x 4,
#               bit for bit over 3 steps (node 1's store feeds steps 2 and 3 of ranks 2 and 3);
#               uneven nodes (3 + 1 ranks) too; 2 nodes x 1 rank: auto keeps a store per rank
#   killed      rank 1 killed mid-run: the job exits non-zero naming rank 1 within the timeout,
#               the newest checkpoint is complete, and `--resume auto` on one rank finishes
#   hung        rank 1 stopped (SIGSTOP): rank 0 exits non-zero after distributed.timeout naming it
#   injected    STRATA_FAULT on rank 1 alone (killed mid-step, a throw mid-step): every rank exits
#               non-zero naming rank 1, and one process resumes the newest checkpoint bit-exactly
#   zo-equal    zeroth-order parallel (distributed.zo, recipes/zo-tiny.toml, 2 perturbations per
#               step): loss, loss_plus, loss_minus, zo_projected_grad, eval_loss, checkpoint-2's
#               master weights and the final weights bit-identical to one process with the same
#               global batch: "perturbation" (2 ranks, θ + εz and θ − εz) = 1 process x A; "data"
#               (2 ranks x 1) = 1 process x 2; "2d" (4 ranks: 2 pairs x 2 groups, x 1) = 1 process
#               x 2 (the one process layer-major, "data" one dual forward at a time:
#               offload.accumulation); only scalars cross (comm_bytes); and the check can fail (1
#               process x 1 differs)
#   zo-resume   zeroth order saved by 2 ranks (perturbation), resumed by 1; saved by 1, resumed
#               by 2 (data): bit-identical to the straight run
#   qlora       the same on an NF4 base (lora.base_dtype = "nf4"): 2 ranks x 1 = 1 process x 2
#               (distributed.shared_host_store false and auto); 1 process x 1 differs
#   families    the new model families: a tiny qwen3_moe (8 experts, top 2, the load-balancing
#               loss on) and a tiny gemma3 (sliding and global layers), each 2 ranks x 1 = 1 process
#               x 2 over 3 steps (losses, optimizer state, final weights bit for bit; separate stores
#               and a shared one), and 1 process x 1 differs (the check can fail)
#   lora        LoRA adapters with dropout: 2 ranks x 1 = 1 process x 2 (clip on and off, evals),
#               2 x 2 = 1 x 4, saved by 2 ranks resumed by 1: losses, adapter state and the exported
#               adapter bit-identical; rank 0 alone exports; 1 process x 1 differs
#   grpo        GRPO (train.objective = "grpo", src/train/grpo_step.h) from the random tiny model, each
#               rank sampling, scoring and training on whole groups (micro_batch_size = num_generations
#               = 4): 2 ranks x 1 = 1 process x 2 over 3 steps (losses, TRL's metrics but the times,
#               completions.jsonl with rank 1's prompt written by rank 0, optimizer state, final
#               weights, bit for bit), with dapo + scale_rewards = "batch" + 2 updates per generation
#               batch and with bnpo + beta (the reference pass); 1 process x 1 differs; micro-batches
#               smaller than a group (each rank a block of prompts) run and sample step 1 as one
#               process; after recipes/grpo-tiny's SFT stage (completions of different lengths: rows
#               padded to the step's longest on every rank) 2 x 1 = 1 x 2 over 8 steps, and with LoRA
#               (dropout, beta) over 6; groups that cannot stay whole on a rank are exit 2 naming
#               num_generations
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason when mpirun cannot start processes here.
set -u
strata="$1"; scenario="$2"
here="$(cd "$(dirname "$0")/../.." && pwd)"
recipe="$here/recipes/sft-tiny/recipe.toml"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl="self,vader" STRATA_PROGRESS=plain
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIPPED: mpirun not found (install openmpi-bin: scripts/setup.sh)"; exit 77
fi
if ! out=$(timeout 60 mpirun -np 2 true 2>&1); then
  echo "SKIPPED: mpirun cannot start 2 processes here: $out"; exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common="checkpoint.save_dtype=f32 device.cpu_threads=1 distributed.timeout=20"
fail() { echo "FAILED: $*"; exit 1; }

# train NP OUT ARGS...: one process (NP=1, no mpirun) or mpirun -np NP
train() {
  local np="$1" out="$2"; shift 2
  if [ "$np" = 1 ]; then
    timeout 300 "$strata" train "$recipe" $common checkpoint.output_dir="$out" "$@" >"$out.log" 2>&1
  else
    timeout 300 mpirun -np "$np" "$strata" train "$recipe" $common checkpoint.output_dir="$out" "$@" >"$out.log" 2>&1
  fi
  local rc=$?
  [ $rc -eq 0 ] || { cat "$out.log"; fail "train -np $np $* exited $rc"; }
}
losses() { grep -o '"\(eval_\)\?loss":[-0-9][^,]*' "$1/metrics.jsonl"; }  # not the workers' lists
# same DIR_A DIR_B STEP WHAT: losses, the checkpoint's optimizer state and the export, bit for bit
same() {
  [ "$(losses "$1")" = "$(losses "$2")" ] || { paste <(losses "$1") <(losses "$2"); fail "$4: losses differ"; }
  cmp "$1/checkpoint-$3/optimizer_state.safetensors" "$2/checkpoint-$3/optimizer_state.safetensors" ||
    fail "$4: master weights / moments differ"
  cmp "$1/final/model.safetensors" "$2/final/model.safetensors" || fail "$4: final weights differ"
  echo "bit-identical: $4 ($(losses "$1" | wc -l) steps)"
}

lora_same() {  # lora_same DIR_A DIR_B WHAT: losses, checkpoint-2's adapter state, the exported adapter
  [ "$(losses "$1")" = "$(losses "$2")" ] || { paste <(losses "$1") <(losses "$2"); fail "$3: losses differ"; }
  cmp "$1/checkpoint-2/optimizer_state.safetensors" "$2/checkpoint-2/optimizer_state.safetensors" ||
    fail "$3: adapter master weights / moments differ"
  cmp "$1/final/adapter/adapter_model.safetensors" "$2/final/adapter/adapter_model.safetensors" ||
    fail "$3: exported adapters differ"
  echo "bit-identical: $3 ($(losses "$1" | wc -l) steps)"
}

case "$scenario" in
equal|resume) common="$common distributed.shared_host_store=false" ;;
esac
case "$scenario" in
equal)
  # (with an eval every 2 steps: the ranks split the eval micro-batches)
  for clip in 1.0 0; do
    ev="data.eval_split=0.2 train.eval_steps=2"
    train 1 "$work/s2_$clip" train.max_steps=3 train.gradient_accumulation_steps=2 optim.max_grad_norm=$clip $ev
    train 2 "$work/d2_$clip" train.max_steps=3 train.gradient_accumulation_steps=1 optim.max_grad_norm=$clip $ev \
      distributed.diagnostics_steps=2
    [ "$(grep -c eval_loss "$work/d2_$clip/metrics.jsonl")" = 2 ] || fail "expected 2 eval records"
    same "$work/s2_$clip" "$work/d2_$clip" 3 "2 ranks x 1 = 1 process x 2 micro-batches, max_grad_norm=$clip"
  done
  grep -q '"comm_bytes"' "$work/d2_1.0/metrics.jsonl" || fail "metrics.jsonl has no comm_bytes"
  # worker diagnostics at step 2 only (diagnostics_steps=2), without changing a bit (above)
  [ "$(grep -c '"workers":{"cosine":' "$work/d2_1.0/metrics.jsonl")" = 1 ] || fail "expected one workers record"
  train 1 "$work/s4" train.max_steps=2 train.gradient_accumulation_steps=4
  train 2 "$work/d22" train.max_steps=2 train.gradient_accumulation_steps=2
  same "$work/s4" "$work/d22" 2 "2 ranks x 2 = 1 process x 4"
  train 1 "$work/s3" train.max_steps=2 train.gradient_accumulation_steps=3
  train 3 "$work/d3" train.max_steps=2 train.gradient_accumulation_steps=1
  same "$work/s3" "$work/d3" 2 "3 ranks x 1 = 1 process x 3"
  # an untied lm_head in bf16 (quickstart's model with tie_word_embeddings false): the head's rows
  # go through the dense path, the embedding through the all-gathered scatter alone
  sed 's/"tie_word_embeddings": true/"tie_word_embeddings": false/' "$here/recipes/quickstart/config.json" >"$work/untied.json"
  grep -q '"tie_word_embeddings": false' "$work/untied.json" || fail "could not untie the quickstart config"
  untied="model.config=$work/untied.json model.dtype=bf16 train.micro_batch_size=2 train.max_steps=2"
  recipe_saved="$recipe"; recipe="$here/recipes/quickstart.toml"
  train 1 "$work/su" $untied train.gradient_accumulation_steps=2
  train 2 "$work/du" $untied train.gradient_accumulation_steps=1
  same "$work/su" "$work/du" 2 "untied bf16: 2 ranks x 1 = 1 process x 2"
  recipe="$recipe_saved"
  # the comparison can fail: 2 ranks differ from one process with half the micro-batches
  train 1 "$work/s1" train.max_steps=3 train.gradient_accumulation_steps=1
  ! cmp -s "$work/s1/final/model.safetensors" "$work/d2_1.0/final/model.safetensors" ||
    fail "2 ranks x 1 equals 1 process x 1: the data was not split"
  ;;
resume)
  train 1 "$work/ref" train.max_steps=4 train.gradient_accumulation_steps=2 checkpoint.save_steps=2
  # 2 ranks -> 1: the 2-rank run's checkpoint-2, continued by one process with 2 micro-batches
  train 2 "$work/a" train.max_steps=4 train.gradient_accumulation_steps=1 checkpoint.save_steps=2
  rm -rf "$work/a/checkpoint-4" "$work/a/final"
  train 1 "$work/a" train.max_steps=4 train.gradient_accumulation_steps=2 checkpoint.save_steps=2 --resume auto
  grep -q "resumed from .*checkpoint-2" "$work/a.log" || { cat "$work/a.log"; fail "2 -> 1 did not resume at step 2"; }
  same "$work/ref" "$work/a" 4 "saved by 2 ranks, resumed by 1"
  # the exact continuation is said to be one, with no warning (issue 43, item 5) ...
  ! grep -q "not the run it continues" "$work/a.log" || { cat "$work/a.log"; fail "2 -> 1 x 2 warned"; }
  grep -q "global batch was [0-9]* rows per step (micro_batch_size [0-9]* x gradient_accumulation_steps 1 x 2 ranks); this run deals the same rows" "$work/a.log" ||
    { cat "$work/a.log"; fail "2 -> 1 x 2 did not say the run continues as it was"; }
  # ... and half the global batch is warned about, naming the accumulation that continues it
  train 2 "$work/h" train.max_steps=4 train.gradient_accumulation_steps=1 checkpoint.save_steps=2
  rm -rf "$work/h/checkpoint-4" "$work/h/final"
  train 1 "$work/h" train.max_steps=4 train.gradient_accumulation_steps=1 checkpoint.save_steps=2 --resume auto
  grep -q "warning: the checkpoint's global batch was [0-9]* rows per step .* x 2 ranks) and this run's is [0-9]* .* x 1 rank).*not the run it continues (train.gradient_accumulation_steps = 2 continues it exactly)" "$work/h.log" ||
    { cat "$work/h.log"; fail "2 -> 1 x 1 (half the global batch) was not warned about"; }
  # 1 -> 2
  train 1 "$work/b" train.max_steps=4 train.gradient_accumulation_steps=2 checkpoint.save_steps=2
  rm -rf "$work/b/checkpoint-4" "$work/b/final"
  train 2 "$work/b" train.max_steps=4 train.gradient_accumulation_steps=1 checkpoint.save_steps=2 --resume auto
  grep -q "resumed from .*checkpoint-2" "$work/b.log" || { cat "$work/b.log"; fail "1 -> 2 did not resume at step 2"; }
  same "$work/ref" "$work/b" 4 "saved by 1 process, resumed by 2 ranks"
  ;;
shared)
  # distributed.shared_host_store = true: one store in shared memory, the optimizer split over the
  # ranks; still bit-identical to one process (and to separate stores), resumable across counts
  sh="distributed.shared_host_store=true"
  # clip 1.0: by default ("auto"); clip 0: forced
  for clip in 1.0 0; do
    train 1 "$work/s2_$clip" train.max_steps=3 train.gradient_accumulation_steps=2 optim.max_grad_norm=$clip
    if [ $clip = 0 ]; then force=$sh; else force=""; fi
    train 2 "$work/d2_$clip" train.max_steps=3 train.gradient_accumulation_steps=1 optim.max_grad_norm=$clip $force
    grep -q "one shared host store per node (1 nodes, 2 ranks" "$work/d2_$clip.log" ||
      { cat "$work/d2_$clip.log"; fail "the ranks did not share a store (${force:-auto})"; }
    same "$work/s2_$clip" "$work/d2_$clip" 3 "shared store (${force:-auto}): 2 ranks x 1 = 1 process x 2, max_grad_norm=$clip"
  done
  train 1 "$work/s6" train.max_steps=2 train.gradient_accumulation_steps=6
  train 3 "$work/d32" train.max_steps=2 train.gradient_accumulation_steps=2 $sh
  same "$work/s6" "$work/d32" 2 "shared store: 3 ranks x 2 = 1 process x 6"
  train 1 "$work/b" train.max_steps=4 train.gradient_accumulation_steps=2 checkpoint.save_steps=2
  cp -r "$work/b" "$work/ref"
  rm -rf "$work/b/checkpoint-4" "$work/b/final"
  train 2 "$work/b" train.max_steps=4 train.gradient_accumulation_steps=1 checkpoint.save_steps=2 --resume auto $sh
  same "$work/ref" "$work/b" 4 "shared store: saved by 1 process, resumed by 2 ranks"
  [ -z "$(ls /dev/shm | grep '^strata-')" ] || fail "a shared store was left in /dev/shm: $(ls /dev/shm | grep '^strata-')"
  # host memory: the summed proportional set size (PSS: shared pages split between the processes
  # that map them) of the 2 ranks sharing a store (not the launcher), against one process, on a
  # model whose store (~305M parameters, 96 layers: ~3.5 GB of f32 weights, gradients and
  # moments) dwarfs what each process needs for itself (~200 MB in a build with CUDA: the CUDA
  # runtime's and cuBLAS's start-up memory, ~150 MB even on the cpu backend; code and libraries,
  # the CPU device's arena of two layers' weight and gradient slots, pinned staging, tokenized
  # data; under mpirun OpenMPI's own buffers); sampled every 0.2 s, the peak compared. Issue 16
  # asks for 2 ranks within 110% of one process; a second store would be ~190%. (With 48 layers
  # a CUDA-enabled build measured 110.1%, a CPU-only one 105.9%.) The weights are streamed and
  # every layer recomputed (offload.weights = stream, offload.recompute = always): on the cpu
  # backend the device is process memory, and the planner would otherwise fill device.memory with
  # resident weights and kept activations, a copy per rank that says nothing about the shared store.
  sed -e 's/"hidden_size": 128/"hidden_size": 512/' -e 's/"intermediate_size": 352/"intermediate_size": 1408/' \
      -e 's/"num_hidden_layers": 4/"num_hidden_layers": 96/' "$here/recipes/quickstart/config.json" >"$work/big.json"
  big="model.config=$work/big.json train.micro_batch_size=1 train.max_steps=2 data.sequence_len=64 distributed.timeout=120 offload.weights=stream offload.recompute=always"
  recipe="$here/recipes/quickstart.toml"
  peak_pss() {  # peak_pss PID OUTDIR: the peak of the summed PSS (kB) of the strata processes writing OUTDIR
    local peak=0 sum p v
    while kill -0 "$1" 2>/dev/null; do
      sum=0
      for p in $(pgrep -f "checkpoint.output_dir=$2"); do
        case "$(readlink "/proc/$p/exe" 2>/dev/null)" in */strata) ;; *) continue ;; esac  # not mpirun
        v=$(awk '/^Pss:/ {print $2}' /proc/$p/smaps_rollup 2>/dev/null); sum=$((sum + ${v:-0}))
      done
      [ $sum -gt $peak ] && peak=$sum
      sleep 0.2
    done
    echo $peak
  }
  "$strata" train "$recipe" $common $big train.gradient_accumulation_steps=2 checkpoint.output_dir="$work/m1" >"$work/m1.log" 2>&1 &
  one=$(peak_pss $! "$work/m1")
  mpirun -np 2 "$strata" train "$recipe" $common $big train.gradient_accumulation_steps=1 $sh \
    checkpoint.output_dir="$work/m2" >"$work/m2.log" 2>&1 &
  two=$(peak_pss $! "$work/m2")
  echo "host memory (peak summed PSS): 1 process $((one / 1024)) MiB; 2 ranks sharing a store $((two / 1024)) MiB" \
    "($((two * 1000 / (one > 0 ? one : 1) / 10)).$((two * 1000 / (one > 0 ? one : 1) % 10))% of one process)"
  cmp -s "$work/m1/final/model.safetensors" "$work/m2/final/model.safetensors" || { tail -5 "$work/m2.log"; fail "the large model differs"; }
  [ $one -gt 1000000 ] || fail "one process peaked at $one kB: the measurement missed it"
  [ $((two * 100)) -le $((one * 110)) ] || fail "2 ranks sharing a store use more than 110% of one process's memory"
  ;;
nodes)
  # every rank's store is its node's: 2 segments; rank 0 exports node 0's, and node 1's feeds the
  # forwards of ranks 2 and 3, so a wrong node 1 store shows in steps 2 and 3
  train 1 "$work/s4" train.max_steps=3 train.gradient_accumulation_steps=4
  train 4 "$work/n22" train.max_steps=3 train.gradient_accumulation_steps=1 distributed.ranks_per_node=2
  grep -q "one shared host store per node (2 nodes, 4 ranks" "$work/n22.log" || { cat "$work/n22.log"; fail "no 2 x 2 layout"; }
  same "$work/s4" "$work/n22" 3 "2 nodes x 2 ranks sharing a store per node, x 1 = 1 process x 4"
  train 4 "$work/n31" train.max_steps=3 train.gradient_accumulation_steps=1 distributed.ranks_per_node=3
  grep -q "one shared host store per node (2 nodes, 4 ranks" "$work/n31.log" || { cat "$work/n31.log"; fail "no 3 + 1 layout"; }
  same "$work/s4" "$work/n31" 3 "nodes of 3 and 1 ranks, x 1 = 1 process x 4"
  train 2 "$work/n11" train.max_steps=3 train.gradient_accumulation_steps=2 distributed.ranks_per_node=1
  grep -q 'one host store per rank (distributed.shared_host_store = "auto": every node runs one rank)' "$work/n11.log" ||
    { cat "$work/n11.log"; fail "2 nodes x 1 rank did not keep a store per rank"; }
  same "$work/s4" "$work/n11" 3 "2 nodes x 1 rank (separate stores), x 2 = 1 process x 4"
  ;;
killed|hung)
  out="$work/f"
  timeout 300 mpirun -np 2 "$strata" train "$recipe" $common checkpoint.output_dir="$out" train.max_steps=100000 \
    train.gradient_accumulation_steps=1 checkpoint.save_steps=3 checkpoint.keep_last=2 distributed.timeout=5 \
    >"$work/f.log" 2>&1 &
  job=$!
  newest() { ls -d "$out"/checkpoint-* 2>/dev/null | sed 's/.*checkpoint-//' | sort -n | tail -1; }
  # checkpoint-6 or later (keep_last removes older ones, and a fast machine passes 6 between polls)
  for _ in $(seq 600); do [ "$(newest)" -ge 6 ] 2>/dev/null && break; sleep 0.2; done
  [ "$(newest)" -ge 6 ] 2>/dev/null || { kill $job; cat "$work/f.log"; fail "no checkpoint-6 or later after 120 s"; }
  victim=""
  for p in $(pgrep -f "checkpoint.output_dir=$out"); do
    if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$p; fi
  done
  [ -n "$victim" ] || { kill $job; fail "rank 1's process not found"; }
  start=$(date +%s)
  if [ "$scenario" = killed ]; then kill -KILL "$victim"; else kill -STOP "$victim"; fi
  wait $job
  rc=$?
  end=$(date +%s)
  cat "$work/f.log" | tail -20
  echo "mpirun exited $rc $((end - start)) s after rank 1 was ${scenario}"
  [ $rc -ne 0 ] || fail "the job exited 0 with a ${scenario} rank"
  [ $rc -ne 124 ] || fail "the job hung"
  if [ "$scenario" = killed ]; then
    grep -Eq "rank 1|process rank 1" "$work/f.log" || fail "no message names rank 1"
  else
    grep -Eq "rank 0: .*(rank 1)" "$work/f.log" || fail "rank 0 did not name rank 1"
  fi
  kill -KILL "$victim" 2>/dev/null
  latest=$(ls -d "$out"/checkpoint-* | sed 's/.*checkpoint-//' | sort -n | tail -1)
  [ -f "$out/checkpoint-$latest/COMPLETE" ] || fail "the newest checkpoint-$latest is not complete"
  # a second launch continues from it (one process, same global batch)
  timeout 300 "$strata" train "$recipe" $common checkpoint.output_dir="$out" train.max_steps=$((latest + 1)) \
    train.gradient_accumulation_steps=2 checkpoint.save_steps=3 checkpoint.keep_last=2 --resume auto >"$work/r.log" 2>&1 ||
    { cat "$work/r.log"; fail "--resume auto after the fault failed"; }
  grep -q "resumed from .*checkpoint-$latest" "$work/r.log" || { cat "$work/r.log"; fail "did not resume from checkpoint-$latest"; }
  echo "as expected: non-zero exit naming rank 1, checkpoint-$latest complete and resumable"
  ;;
injected)
  # faults injected into rank 1 alone (STRATA_FAULT, src/core/fault.h; an MPMD launch gives it only
  # to the second process): killed mid-step 3, and a throw mid-step 3. Each: every rank exits
  # non-zero within the timeout naming rank 1, checkpoint-2 is the newest and complete, and one
  # process resuming it with the same global batch ends bit-identical to a run never interrupted.
  train 1 "$work/ref" train.max_steps=4 train.gradient_accumulation_steps=2 checkpoint.save_steps=1
  for fault in kill@step:3 throw@step:3; do
    out="$work/inj_${fault%%@*}"
    args=(train "$recipe" $common checkpoint.output_dir="$out" train.max_steps=4 train.gradient_accumulation_steps=1
          checkpoint.save_steps=1 distributed.timeout=10)
    start=$(date +%s)
    timeout 300 mpirun -np 1 "$strata" "${args[@]}" : -np 1 env STRATA_FAULT=$fault "$strata" "${args[@]}" \
      >"$out.log" 2>&1
    rc=$?
    echo "$fault on rank 1: mpirun exited $rc after $(( $(date +%s) - start )) s"
    [ $rc -ne 0 ] || { cat "$out.log"; fail "$fault: the job exited 0"; }
    [ $rc -ne 124 ] || { cat "$out.log"; fail "$fault: the job hung"; }
    grep -Eq "rank 1" "$out.log" || { cat "$out.log"; fail "$fault: no message names rank 1"; }
    if [ "${fault%%@*}" = throw ]; then  # the cause is said, and the rank exits, never aborts
      grep -q "rank 1: error: STRATA_FAULT: a task threw at step" "$out.log" || { cat "$out.log"; fail "$fault: the cause is not said"; }
      ! grep -q "terminate called" "$out.log" || { cat "$out.log"; fail "$fault: rank 1 aborted (std::terminate)"; }
    fi
    latest=$(ls -d "$out"/checkpoint-* | sed 's/.*checkpoint-//' | sort -n | tail -1)
    [ "$latest" = 2 ] || { ls "$out"; fail "$fault: the newest checkpoint is $latest, not 2"; }
    [ -f "$out/checkpoint-2/COMPLETE" ] || fail "$fault: checkpoint-2 is not complete"
    [ -z "$(ls /dev/shm | grep -i strata)" ] || fail "$fault: shared memory left in /dev/shm: $(ls /dev/shm)"
    timeout 300 "$strata" train "$recipe" $common checkpoint.output_dir="$out" train.max_steps=4 \
      train.gradient_accumulation_steps=2 checkpoint.save_steps=1 --resume auto >"$out.resume.log" 2>&1 ||
      { cat "$out.resume.log"; fail "$fault: --resume auto failed"; }
    same "$work/ref" "$out" 4 "$fault on rank 1, resumed by one process"
  done
  ;;
zo-equal|zo-resume)
  recipe="$here/recipes/zo-tiny.toml"
  common="$common optim.zo_perturbations=2 train.max_steps=4 checkpoint.save_steps=2 data.eval_split=0.2 train.eval_steps=2"
  zo_losses() { grep -o '"\(eval_loss\|loss\|loss_plus\|loss_minus\|zo_projected_grad\)":[-0-9][^,}]*' "$1/metrics.jsonl"; }
  # zo_same DIR_A DIR_B WHAT: losses, checkpoint-2's master weights and the final export, bit for bit
  zo_same() {
    [ "$(zo_losses "$1" | grep -c zo_projected_grad)" = 4 ] || fail "$3: expected 4 zo steps in $1/metrics.jsonl"
    [ "$(zo_losses "$1")" = "$(zo_losses "$2")" ] || { paste <(zo_losses "$1") <(zo_losses "$2"); fail "$3: losses differ"; }
    cmp "$1/checkpoint-2/optimizer_state.safetensors" "$2/checkpoint-2/optimizer_state.safetensors" ||
      fail "$3: master weights differ"
    cmp "$1/final/model.safetensors" "$2/final/model.safetensors" || fail "$3: final weights differ"
    echo "bit-identical: $3 ($(zo_losses "$1" | wc -l) values)"
  }
  train 1 "$work/s2" train.gradient_accumulation_steps=2
  if [ "$scenario" = zo-equal ]; then
    train 2 "$work/p2" train.gradient_accumulation_steps=2 distributed.zo=perturbation
    grep -q "zo-sgd over 2 ranks: 2 side(s) x 1 data group(s)" "$work/p2.log" || { cat "$work/p2.log"; fail "no layout line"; }
    zo_same "$work/s2" "$work/p2" "perturbation parallel, 2 ranks x 2 micro-batches = 1 process x 2"
    # only scalars cross: 2 sides x 2 perturbations x 2 micro-batches x 8 bytes per step; rank 0 alone writes
    [ "$(grep -c '"comm_bytes":64[,}]' "$work/p2/metrics.jsonl")" = 4 ] || fail "expected comm_bytes 64 in 4 records"
    # one process runs its step layer-major ("auto"); these ranks one dual forward at a time
    grep -q 'offload.accumulation = "auto": layer-major' "$work/s2.log" || { cat "$work/s2.log"; fail "1 process not layer-major"; }
    train 2 "$work/d2" train.gradient_accumulation_steps=1 distributed.zo=data offload.accumulation=micro_batch
    zo_same "$work/s2" "$work/d2" "data parallel one at a time, 2 ranks x 1 = 1 process x 2 layer-major"
    train 4 "$work/t4" train.gradient_accumulation_steps=1 distributed.zo=2d
    zo_same "$work/s2" "$work/t4" "2d, 2 pairs x 2 data groups x 1 = 1 process x 2"
    # the comparison can fail: 2 data ranks differ from one process with half the micro-batches
    train 1 "$work/s1" train.gradient_accumulation_steps=1
    ! cmp -s "$work/s1/final/model.safetensors" "$work/d2/final/model.safetensors" ||
      fail "2 data ranks x 1 equals 1 process x 1: the data was not split"
  else
    train 2 "$work/a" train.gradient_accumulation_steps=2 distributed.zo=perturbation
    rm -rf "$work/a/checkpoint-4" "$work/a/final"
    train 1 "$work/a" train.gradient_accumulation_steps=2 --resume auto
    grep -q "resumed from .*checkpoint-2" "$work/a.log" || { cat "$work/a.log"; fail "2 -> 1 did not resume at step 2"; }
    zo_same "$work/s2" "$work/a" "saved by 2 perturbation ranks, resumed by 1 process"
    train 1 "$work/b" train.gradient_accumulation_steps=2
    rm -rf "$work/b/checkpoint-4" "$work/b/final"
    train 2 "$work/b" train.gradient_accumulation_steps=1 distributed.zo=data --resume auto
    grep -q "resumed from .*checkpoint-2" "$work/b.log" || { cat "$work/b.log"; fail "1 -> 2 did not resume at step 2"; }
    zo_same "$work/s2" "$work/b" "saved by 1 process, resumed by 2 data ranks"
  fi
  ;;
lora)
  # LoRA adapters (bf16 frozen base, dropout 0.1): each rank's micro-batch adapter gradients go
  # through the host reduction (offload/engine/engine.cpp: lora_grads_land), every rank runs the same
  # AdamW, rank 0 exports; the dropout masks follow the global micro-batch index
  lo="model.dtype=bf16 lora.r=8 lora.alpha=16 lora.dropout=0.1 data.sequence_len=64 checkpoint.save_steps=2"
  for clip in 1.0 0; do
    ev="data.eval_split=0.2 train.eval_steps=2"
    train 1 "$work/s2_$clip" $lo train.max_steps=3 train.gradient_accumulation_steps=2 optim.max_grad_norm=$clip $ev
    train 2 "$work/d2_$clip" $lo train.max_steps=3 train.gradient_accumulation_steps=1 optim.max_grad_norm=$clip $ev
    lora_same "$work/s2_$clip" "$work/d2_$clip" "LoRA: 2 ranks x 1 = 1 process x 2, max_grad_norm=$clip"
  done
  [ -f "$work/d2_0/final/adapter/adapter_config.json" ] || fail "no adapter exported"
  [ ! -e "$work/d2_0/final/model.safetensors" ] || fail "a LoRA run without lora.merge wrote a merged model"
  train 1 "$work/s4" $lo train.max_steps=2 train.gradient_accumulation_steps=4
  train 2 "$work/d22" $lo train.max_steps=2 train.gradient_accumulation_steps=2
  lora_same "$work/s4" "$work/d22" "LoRA: 2 ranks x 2 = 1 process x 4"
  # resumed by another rank count: saved by 2 ranks, continued by 1 process
  train 2 "$work/r" $lo train.max_steps=3 train.gradient_accumulation_steps=2
  rm -rf "$work/r/checkpoint-3" "$work/r/final"
  train 1 "$work/r" $lo train.max_steps=3 train.gradient_accumulation_steps=4 --resume auto
  grep -q "resumed from .*checkpoint-2" "$work/r.log" || { cat "$work/r.log"; fail "LoRA 2 -> 1 did not resume at step 2"; }
  train 1 "$work/s4r" $lo train.max_steps=3 train.gradient_accumulation_steps=4
  lora_same "$work/s4r" "$work/r" "LoRA: saved by 2 ranks x 2, resumed by 1 process x 4"
  # the check can fail: another micro-batch order (1 process x 1) gives other adapters
  train 1 "$work/s1" $lo train.max_steps=3 train.gradient_accumulation_steps=1
  ! cmp -s "$work/s1/final/adapter/adapter_model.safetensors" "$work/d2_1.0/final/adapter/adapter_model.safetensors" ||
    fail "LoRA: 2 ranks x 1 equals 1 process x 1: the data was not split"
  ;;
qlora)
  # QLoRA (lora.base_dtype = "nf4", double-quantized, streamed; dropout 0.1): each rank quantizes
  # the base into its own store at load (LoRA keeps a store per rank, "auto" included), and the
  # adapters train as LoRA's do: 2 ranks x 1 = 1 process x 2 bit for bit
  lo="model.dtype=bf16 lora.r=8 lora.alpha=16 lora.dropout=0.1 lora.base_dtype=nf4 offload.weights=stream"
  lo="$lo data.sequence_len=64 checkpoint.save_steps=2 train.max_steps=3 optim.max_grad_norm=1.0"
  train 1 "$work/q_s2" $lo train.gradient_accumulation_steps=2
  for shared in false auto; do
    train 2 "$work/q_d2_$shared" $lo train.gradient_accumulation_steps=1 distributed.shared_host_store=$shared
    lora_same "$work/q_s2" "$work/q_d2_$shared" "QLoRA: 2 ranks x 1 = 1 process x 2, shared_host_store=$shared"
  done
  grep -q "NF4" "$work/q_s2.log" || { cat "$work/q_s2.log"; fail "the QLoRA run's plan does not show an NF4 base"; }
  # the check can fail: one process x 1 trains other adapters
  train 1 "$work/q_s1" $lo train.gradient_accumulation_steps=1
  ! cmp -s "$work/q_s1/final/adapter/adapter_model.safetensors" "$work/q_d2_false/final/adapter/adapter_model.safetensors" ||
    fail "QLoRA: 2 ranks x 1 equals 1 process x 1: the data was not split"
  ;;
families)
  # the sft-tiny chats and tokenizer (vocab 640) under two configs of the new families, random init
  tiny="$here/recipes/sft-tiny"
  cat >"$work/moe.json" <<'JSON'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 640,
 "max_position_embeddings": 512, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 40,
 "norm_topk_prob": true, "output_router_logits": true, "router_aux_loss_coef": 0.01, "tie_word_embeddings": true,
 "eos_token_id": 594, "pad_token_id": 592}
JSON
  cat >"$work/gemma3.json" <<'JSON'
{"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 48, "intermediate_size": 96,
 "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 640,
 "sliding_window": 16, "sliding_window_pattern": 3, "query_pre_attn_scalar": 16, "max_position_embeddings": 512,
 "eos_token_id": 594, "pad_token_id": 592, "tie_word_embeddings": true}
JSON
  for family in moe gemma3; do
    cat >"$work/$family.toml" <<TOML
[model]
config = "$work/$family.json"
init_seed = 3
[data]
path = "$tiny/data/chat.jsonl"
tokenizer = "$tiny/models/tiny"
sequence_len = 128
packing = true
[train]
max_steps = 3
micro_batch_size = 2
seed = 7
[optim]
learning_rate = 3e-3
[checkpoint]
save_steps = 3
TOML
    recipe="$work/$family.toml"
    train 1 "$work/${family}_s2" train.gradient_accumulation_steps=2
    train 2 "$work/${family}_d2" train.gradient_accumulation_steps=1 distributed.shared_host_store=false
    same "$work/${family}_s2" "$work/${family}_d2" 3 "$family: 2 ranks x 1 = 1 process x 2"
    train 2 "$work/${family}_sh" train.gradient_accumulation_steps=1 distributed.shared_host_store=true
    same "$work/${family}_s2" "$work/${family}_sh" 3 "$family, shared store: 2 ranks x 1 = 1 process x 2"
    train 1 "$work/${family}_s1" train.gradient_accumulation_steps=1
    ! cmp -s "$work/${family}_s1/final/model.safetensors" "$work/${family}_d2/final/model.safetensors" ||
      fail "$family: 2 ranks x 1 equals 1 process x 1: the data was not split"
  done
  ;;
grpo)
  recipe="$here/recipes/grpo-tiny/recipe.toml"
  g=("model.path=$here/recipes/sft-tiny/models/tiny" train.max_steps=3 train.micro_batch_size=4
     grpo.num_generations=4 grpo.max_completion_length=6 grpo.reward_funcs=accuracy,format
     'grpo.format_regex=[aeiou]' grpo.log_completions=2 checkpoint.save_steps=3 optim.learning_rate=1e-2)
  grpo_metrics() {  # the step records' values that do not measure time
    grep -o '"\(loss\|grad_norm\|loss_tokens\|reward\|reward_std\|frac_reward_zero_std\|rewards/[a-z]*/[a-z]*\|entropy\|kl\|clip_ratio[a-z/_]*\|completions/[a-z_]*\)":[-0-9][^,}]*' "$1/metrics.jsonl"
  }
  grpo_same() {  # grpo_same DIR_A DIR_B WHAT
    [ "$(grpo_metrics "$1" | grep -c '"entropy"')" = 3 ] || fail "$3: expected 3 steps with an entropy in $1/metrics.jsonl"
    [ "$(grpo_metrics "$1")" = "$(grpo_metrics "$2")" ] || { paste <(grpo_metrics "$1") <(grpo_metrics "$2"); fail "$3: metrics differ"; }
    cmp "$1/completions.jsonl" "$2/completions.jsonl" || fail "$3: completions.jsonl differ"
    cmp "$1/checkpoint-3/optimizer_state.safetensors" "$2/checkpoint-3/optimizer_state.safetensors" ||
      fail "$3: master weights / moments differ"
    cmp "$1/final/model.safetensors" "$2/final/model.safetensors" || fail "$3: final weights differ"
    echo "bit-identical: $3 ($(grpo_metrics "$1" | wc -l) values)"
  }
  v=0
  for variant in "grpo.loss_type=dapo grpo.scale_rewards=batch grpo.num_iterations=2" "grpo.loss_type=bnpo grpo.beta=0.04"; do
    v=$((v + 1))
    train 1 "$work/g_s2_$v" "${g[@]}" $variant train.gradient_accumulation_steps=2
    train 2 "$work/g_d2_$v" "${g[@]}" $variant train.gradient_accumulation_steps=1
    grpo_same "$work/g_s2_$v" "$work/g_d2_$v" "GRPO $variant: 2 ranks x 1 = 1 process x 2"
  done
  grep -q '"kl":' "$work/g_d2_2/metrics.jsonl" || fail "GRPO with beta logged no kl"
  grep -q "one host store per rank (.*GRPO keeps a store per rank" "$work/g_d2_1.log" || { cat "$work/g_d2_1.log"; fail "GRPO did not say it keeps a store per rank"; }
  # rank 0 wrote both prompts' 4 completions each step, rank 1's included
  [ "$(grep -c '"step":1,' "$work/g_d2_1/completions.jsonl")" = 8 ] || fail "completions.jsonl lacks rank 1's prompt"
  # the check can fail: one process with half the completions trains other weights
  train 1 "$work/g_s1" "${g[@]}" grpo.loss_type=dapo grpo.scale_rewards=batch grpo.num_iterations=2 train.gradient_accumulation_steps=1
  ! cmp -s "$work/g_s1/final/model.safetensors" "$work/g_d2_1/final/model.safetensors" ||
    fail "GRPO: 2 ranks x 1 equals 1 process x 1: the prompts were not split"
  # completions of different lengths (recipes/grpo-tiny's SFT stage first: its answers stop at EOS
  # early): every micro-batch padded to the step's longest row on every rank, 2 ranks x 1 = 1 x 2
  timeout 300 "$strata" train "$here/recipes/grpo-tiny/sft.toml" $common checkpoint.output_dir="$work/g_sft" \
    train.max_steps=150 >"$work/g_sft.log" 2>&1 || { cat "$work/g_sft.log"; fail "the SFT stage failed"; }
  t=("model.path=$work/g_sft/final" train.max_steps=8 checkpoint.save_steps=8)
  train 1 "$work/g_t2" "${t[@]}" train.gradient_accumulation_steps=2
  train 2 "$work/g_d2" "${t[@]}" train.gradient_accumulation_steps=1
  [ "$(grpo_metrics "$work/g_t2" | grep -c '"completions/min_length":[1-4][,.]')" -gt 0 ] ||
    fail "the trained model's completions did not stop early: the lengths were not exercised"
  [ "$(grpo_metrics "$work/g_t2")" = "$(grpo_metrics "$work/g_d2")" ] || fail "GRPO after SFT: metrics differ"
  cmp "$work/g_t2/final/model.safetensors" "$work/g_d2/final/model.safetensors" || fail "GRPO after SFT: final weights differ"
  cmp "$work/g_t2/completions.jsonl" "$work/g_d2/completions.jsonl" || fail "GRPO after SFT: completions.jsonl differ"
  echo "bit-identical: GRPO after SFT, completions of different lengths: 2 ranks x 1 = 1 process x 2 (8 steps)"
  # LoRA with dropout and beta (the reference: the base with the adapters off): the generator adds
  # each rank's adapters, equal after every update
  l=("${t[@]}" train.max_steps=6 checkpoint.save_steps=6 lora.r=8 lora.alpha=16 lora.dropout=0.1 grpo.beta=0.04)
  train 1 "$work/g_l2" "${l[@]}" train.gradient_accumulation_steps=2
  train 2 "$work/g_ld2" "${l[@]}" train.gradient_accumulation_steps=1
  [ "$(grpo_metrics "$work/g_l2")" = "$(grpo_metrics "$work/g_ld2")" ] || fail "GRPO LoRA: metrics differ"
  cmp "$work/g_l2/final/adapter/adapter_model.safetensors" "$work/g_ld2/final/adapter/adapter_model.safetensors" ||
    fail "GRPO LoRA: exported adapters differ"
  echo "bit-identical: GRPO with LoRA (dropout, beta): 2 ranks x 1 = 1 process x 2 (6 steps)"
  # micro-batches of 2 < num_generations: each rank a block of whole prompts; step 1 samples as one
  # process does (the same prompts, seeds and starting weights); later steps agree to rounding only
  train 2 "$work/g_blk" "${g[@]}" grpo.loss_type=dapo grpo.scale_rewards=batch grpo.num_iterations=2 \
    train.micro_batch_size=2 train.gradient_accumulation_steps=2
  [ "$(grpo_metrics "$work/g_blk" | grep '"reward"' | head -1)" = "$(grpo_metrics "$work/g_s2_1" | grep '"reward"' | head -1)" ] ||
    fail "GRPO with micro-batches smaller than a group: step 1's reward differs from one process's"
  # a group that cannot stay on one rank: exit 2 naming the key
  out=$(timeout 120 mpirun -np 2 "$strata" train "$recipe" $common checkpoint.output_dir="$work/g_bad" "${g[@]}" \
    train.micro_batch_size=2 train.gradient_accumulation_steps=1 2>&1)
  rc=$?
  [ $rc -ne 0 ] && echo "$out" | grep -q "grpo.num_generations (4) must divide .*each rank's, so that it keeps whole groups" ||
    { echo "$out"; fail "GRPO with groups split over ranks: expected an error naming num_generations (rc $rc)"; }
  ;;
*) fail "unknown scenario $scenario" ;;
esac
