#!/bin/bash
# Zeroth-order parallel training (distributed.zo, src/train/zo_step.h) under `mpirun -np N` for
# ctest (label mpi; src/comm/comm.cmake), on recipes/zo-tiny.toml, CPU backend:
#   run_zo_mpi.sh STRATA SCENARIO
#   equal   losses (loss, loss_plus, loss_minus, zo_projected_grad, eval_loss), the master weights
#           of a checkpoint and the final weights bit-identical to one process with the same
#           global batch: "perturbation" (2 ranks: θ + εz and θ − εz) = 1 process x A;
#           "data" (2 ranks x 1) = 1 process x 2; "2d" (4 ranks: 2 pairs x 2 groups, x 1) = 1
#           process x 2; each with 2 perturbations per step. And it can fail: "data" with 2
#           ranks x 1 differs from 1 process x 1.
#   resume  saved by 2 ranks (perturbation), resumed by 1 process; saved by 1, resumed by 2
#           ranks (data): bit-identical to the straight run
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason when mpirun cannot start processes here.
set -u
strata="$1"; scenario="$2"
here="$(cd "$(dirname "$0")/../.." && pwd)"
recipe="$here/recipes/zo-tiny.toml"
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
common="checkpoint.save_dtype=f32 device.cpu_threads=1 distributed.timeout=60 optim.zo_perturbations=2
  train.max_steps=4 checkpoint.save_steps=2 data.eval_split=0.2 train.eval_steps=2"
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
losses() { grep -o '"\(eval_loss\|loss\|loss_plus\|loss_minus\|zo_projected_grad\)":[-0-9][^,}]*' "$1/metrics.jsonl"; }
# same DIR_A DIR_B WHAT: losses, checkpoint-2's master weights and the final export, bit for bit
same() {
  [ "$(losses "$1" | grep -c zo_projected_grad)" = 4 ] || fail "$3: expected 4 zo steps in $1/metrics.jsonl"
  [ "$(losses "$1")" = "$(losses "$2")" ] || { paste <(losses "$1") <(losses "$2"); fail "$3: losses differ"; }
  cmp "$1/checkpoint-2/optimizer_state.safetensors" "$2/checkpoint-2/optimizer_state.safetensors" ||
    fail "$3: master weights differ"
  cmp "$1/final/model.safetensors" "$2/final/model.safetensors" || fail "$3: final weights differ"
  echo "bit-identical: $3 ($(losses "$1" | wc -l) values)"
}

case "$scenario" in
equal)
  train 1 "$work/s2" train.gradient_accumulation_steps=2
  train 2 "$work/p2" train.gradient_accumulation_steps=2 distributed.zo=perturbation
  grep -q "zo-sgd over 2 ranks: 2 side(s) x 1 data group(s)" "$work/p2.log" || { cat "$work/p2.log"; fail "no layout line"; }
  same "$work/s2" "$work/p2" "perturbation parallel, 2 ranks x 2 micro-batches = 1 process x 2"
  train 2 "$work/d2" train.gradient_accumulation_steps=1 distributed.zo=data
  same "$work/s2" "$work/d2" "data parallel, 2 ranks x 1 = 1 process x 2"
  train 4 "$work/t4" train.gradient_accumulation_steps=1 distributed.zo=2d
  same "$work/s2" "$work/t4" "2d, 2 pairs x 2 data groups x 1 = 1 process x 2"
  # the comparison can fail: 2 data ranks differ from one process with half the micro-batches
  train 1 "$work/s1" train.gradient_accumulation_steps=1
  ! cmp -s "$work/s1/final/model.safetensors" "$work/d2/final/model.safetensors" ||
    fail "2 data ranks x 1 equals 1 process x 1: the data was not split"
  # only scalars cross: 2 sides x 2 perturbations x 2 micro-batches x 8 bytes per step
  [ "$(grep -c '"comm_bytes":64[,}]' "$work/p2/metrics.jsonl")" = 4 ] || { grep comm_bytes "$work/p2/metrics.jsonl"; fail "expected comm_bytes 64 per step"; }
  # only rank 0 writes: one metrics record per step and eval
  [ "$(grep -c '"zo_projected_grad"' "$work/p2/metrics.jsonl")" = 4 ] || fail "metrics.jsonl written by more than rank 0"
  ;;
resume)
  train 1 "$work/ref" train.gradient_accumulation_steps=2
  # 2 ranks (perturbation) -> 1 process
  train 2 "$work/a" train.gradient_accumulation_steps=2 distributed.zo=perturbation
  rm -rf "$work/a/checkpoint-4" "$work/a/final"
  train 1 "$work/a" train.gradient_accumulation_steps=2 --resume auto
  grep -q "resumed from .*checkpoint-2" "$work/a.log" || { cat "$work/a.log"; fail "2 -> 1 did not resume at step 2"; }
  same "$work/ref" "$work/a" "saved by 2 perturbation ranks, resumed by 1 process"
  # 1 process -> 2 ranks (data)
  train 1 "$work/b" train.gradient_accumulation_steps=2
  rm -rf "$work/b/checkpoint-4" "$work/b/final"
  train 2 "$work/b" train.gradient_accumulation_steps=1 distributed.zo=data --resume auto
  grep -q "resumed from .*checkpoint-2" "$work/b.log" || { cat "$work/b.log"; fail "1 -> 2 did not resume at step 2"; }
  same "$work/ref" "$work/b" "saved by 1 process, resumed by 2 data ranks"
  ;;
*) fail "unknown scenario $scenario" ;;
esac
