#!/bin/bash
# Issue 37's GPU scenarios, estimated (no GPU needed): `strata estimate --json` with every "auto"
# left to the planner against the fastest of the 96 combinations of explicit offload.weights,
# accumulation, checkpoints, optimizer, working_weights and norm_pass, under the same step model.
#   bash tools/bench/plan_gpu_scenarios.sh all|8b4090|32b|q8 ["--gpu-flops 700e12 ... (pinned rates)"]
# From the repository root, after bash scripts/build.sh; python3 reads the JSON.
S=${STRATA:-build/strata}
C=recipes/configs
PIN="$2"
mkdir -p "${NVME:-/tmp/strata_nvme}"
run() { $S estimate "$@" --json 2>/dev/null | tail -1; }
scen() {
  local name="$1"; shift
  local a=$(run "$@" $PIN)
  local auto_s=$(echo "$a" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["step"]["seconds"] if j.get("fits") else "nofit", j["weights"], j["resident_layers"], j["norm_pass"], j["accumulation"], j["step"]["bottleneck"], round(j["tiers"]["nvme"]/2**30,1))')
  local best=1e99 bestc=""
  for w in "offload.weights=device" "offload.weights=stream"; do
   for acc in layer_major micro_batch; do
    for ck in host nvme auto; do
     for op in host nvme; do
      for wk in stored derived; do
       for np in off on; do
        o="$w offload.accumulation=$acc offload.checkpoints=$ck offload.optimizer=$op offload.working_weights=$wk offload.norm_pass=$np"
        r=$(run "$@" $PIN $o | python3 -c 'import json,sys
try:
  j=json.load(sys.stdin); print(j["step"]["seconds"] if j.get("fits") else "nofit")
except Exception: print("err")')
        case "$r" in nofit|err) continue;; esac
        if python3 -c "import sys; sys.exit(0 if $r < $best else 1)"; then best=$r; bestc="$o"; fi
       done; done; done; done; done; done
  echo "$name | auto: $auto_s | best forced: $best ($bestc)"
}
M="model.dtype=bf16"
if [ "$1" = 8b4090 ] || [ "$1" = all ]; then scen "Llama-3.1-8B RTX4090 128GiB 1x16x4096" --model $C/llama-3.1-8b $M data.sequence_len=4096 train.micro_batch_size=1 train.gradient_accumulation_steps=16 --gpu 'RTX 4090' --host-memory 128GiB --nvme-path ${NVME:-/tmp/strata_nvme}; fi
if [ "$1" = 32b ] || [ "$1" = all ]; then scen "Qwen2.5-32B H200 512GiB 1x96x1024" --model $C/qwen2.5-32b $M data.sequence_len=1024 train.micro_batch_size=1 train.gradient_accumulation_steps=96 --gpu H200 --host-memory 512GiB --nvme-path ${NVME:-/tmp/strata_nvme}; fi
if [ "$1" = q8 ] || [ "$1" = all ]; then scen "Qwen3-8B H100 256GiB 1x64x2048" --model $C/qwen3-8b $M data.sequence_len=2048 train.micro_batch_size=1 train.gradient_accumulation_steps=64 --gpu 'H100 SXM' --host-memory 256GiB --nvme-path ${NVME:-/tmp/strata_nvme}; fi
