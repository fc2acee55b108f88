#!/usr/bin/env bash
# The real-GPU check of the CUDA backend, in one command (for a machine with an NVIDIA GPU):
# builds with -DSTRATA_CUDA=ON for this GPU, runs the `cuda` and `cuda-emu` ctest labels, trains
# the quickstart and the tiny SFT recipe on the GPU (and the quickstart on the CPU backend for
# the same steps, to compare losses), checks that a run resumed from a checkpoint on the GPU
# ends with the same losses and weights as the straight run, and runs the benchmarks. Every
# step's output goes to OUT_DIR (one log per step); a failed step is reported and the rest run.
#
#   bash scripts/gpu_check.sh OUT_DIR [--deps-prefix DIR] [--backend cuda|cpu] [--no-build] [--stop-after N]
#   bash scripts/gpu_check.sh OUT_DIR --scale [--deps-prefix DIR] [--backend cuda|cpu] [--no-build]
#
# --deps-prefix DIR: the build's libraries (oneDNN, toml++, liburing, ...) are unpacked under
#   DIR/usr instead of installed (e.g. `dpkg -x` of Debian 12's .deb files on a machine without
#   a package registry); CMake, pkg-config and the loader are pointed there.
# --backend cpu: the same steps on the CPU backend (a dry run of this script without a GPU).
# --no-build: use the build already in BUILD_DIR (default build-gpu) as it is.
# --stop-after N: for leases of limited GPU time, the emulated suite (the `cuda-emu` label, run
#   last: the same sources run under the emulator on every CI machine) is stopped once the whole
#   check has run N seconds (it reports the tests that did not finish as failed).
# --scale: the scale check instead (scripts/gpu_check_scale.sh: one device call of at most 6
#   minutes, build included): attention forward + backward against torch's SDPA, a streamed
#   full fine-tuning run of a 3B Llama-shaped model at 64k tokens a step against `strata
#   estimate` and against transformers + PyTorch training it in GPU memory; one JSON line.
# The build makes only what the check runs: strata, strata-bench and the CUDA test binaries.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash scripts/gpu_check.sh OUT_DIR [--deps-prefix DIR] [--backend cuda|cpu] [--no-build]}"
shift
deps="" backend=cuda build_it=1 stop_after=0 scale=0
while [ $# -gt 0 ]; do
  case "$1" in
    --scale) scale=1; shift ;;
    --no-build) build_it=0; shift ;;
    --deps-prefix) deps="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --stop-after) stop_after="$2"; shift 2 ;;
    *) echo "gpu_check: unknown option '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
build="${BUILD_DIR:-build-gpu}"
work="$(mktemp -d)"
failed=()
step() {  # step NAME COMMAND...: runs COMMAND with its output in OUT_DIR/NAME.log
  local name="$1"; shift
  echo "gpu_check: $name"
  if ! "$@" > "$out/$name.log" 2>&1; then failed+=("$name"); echo "gpu_check: $name FAILED (see $out/$name.log)"; fi
}

cmake_args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_FUZZ=OFF -DSTRATA_CUDA_EMU_TSAN=OFF)
if [ "$scale" = 1 ]; then  # the scale check's build: the two programs, Hopper only, no tests
  cmake_args+=(-DSTRATA_TESTS=OFF)
  [ "$backend" = cuda ] && cmake_args+=(-DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
  [ "$backend" = cuda ] || cmake_args+=(-DSTRATA_CUDA=OFF)
elif [ "$backend" = cuda ]; then
  cmake_args+=(-DSTRATA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native)
else
  cmake_args+=(-DSTRATA_CUDA=OFF)
fi
if [ -n "$deps" ]; then
  export PKG_CONFIG_SYSROOT_DIR="$deps"
  export PKG_CONFIG_LIBDIR="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig"
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps/usr" -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include")
fi
export PATH="/usr/local/cuda/bin:$PATH"

machine() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  nvcc --version | tail -2 || true
  nproc; uname -r
}
step machine machine
if [ "$scale" = 1 ]; then
  . scripts/gpu_check_scale.sh  # runs the scale check and exits
fi
targets=(strata strata-bench strata_cuemu_tests strata_cuda_emu_tests)
[ "$backend" = cuda ] && targets+=(strata_cuda_tests)
[ "$build_it" = 1 ] && step build bash -c "cmake ${cmake_args[*]@Q} && cmake --build '$build' -j\$(nproc) --target ${targets[*]} -- -k 0"
cp "$build/cuda_ptxas.log" "$out/" 2>/dev/null
[ "$backend" = cuda ] && step ctest-cuda bash -c "cd '$build' && ctest -L '^cuda\$' --output-on-failure -j4"

strata="$build/strata"
train() {  # train NAME RECIPE [overrides...]: a fresh run into WORK/NAME
  local name="$1" recipe="$2"; shift 2
  STRATA_PROGRESS=plain "$strata" train "$recipe" device.backend="$backend" checkpoint.output_dir="$work/$name" \
    --overwrite "$@" </dev/null
}
step quickstart train quickstart recipes/quickstart.toml
step quickstart-cpu train quickstart-cpu recipes/quickstart.toml device.backend=cpu
step sft-tiny train sft-tiny recipes/sft-tiny/recipe.toml

# resume: the straight sft-tiny run saved checkpoint-3; continue from a copy of it alone
resume() {
  mkdir -p "$work/sft-resumed" && cp -r "$work/sft-tiny/checkpoint-3" "$work/sft-resumed/" &&
    STRATA_PROGRESS=plain "$strata" train recipes/sft-tiny/recipe.toml device.backend="$backend" \
      checkpoint.output_dir="$work/sft-resumed" --resume auto </dev/null &&
    cmp "$work/sft-tiny/final/model.safetensors" "$work/sft-resumed/final/model.safetensors" &&
    echo "final weights of the straight and the resumed run are identical"
}
step sft-resume resume

compare() {  # the per-step losses of the runs, and how far apart they are
  python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{work}/{name}/metrics.jsonl") if '"loss"' in l]
a, b = losses("quickstart"), losses("quickstart-cpu")
d = [abs(x - y) for x, y in zip(a, b)]
print(f"quickstart, this backend vs the CPU backend: {len(d)} steps, max |loss difference| {max(d):.3g} "
      f"at step {d.index(max(d)) + 1}; final {a[-1]:.6f} vs {b[-1]:.6f}")
s, r = losses("sft-tiny"), losses("sft-resumed")
print("sft-tiny straight:", [round(x, 6) for x in s])
print("sft-tiny resumed: ", [round(x, 6) for x in r])
sys.exit(0 if s[-len(r):] == r else 1)
EOF
}
step compare compare
cp "$work/quickstart/metrics.jsonl" "$out/quickstart_metrics.jsonl" 2>/dev/null

bench=(pipeline --backend "$backend")
[ "$backend" = cuda ] && bench+=(--hidden 2048 --layers 16 --tokens 2048 --batch 2 --device-memory 24GiB)
step bench-pipeline "$build/strata-bench" "${bench[@]}"
step bench-adamw "$build/strata-bench" adamw --no-torch
rm -rf "$work"

emu=(ctest -L 'cuda-emu' -E 'tsan' --output-on-failure -j"$(nproc)")
if [ "$stop_after" -gt 0 ]; then
  left=$((stop_after - SECONDS)); [ "$left" -lt 1 ] && left=1
  emu=(timeout "$left" "${emu[@]}")
fi
step ctest-cuda-emu bash -c "cd '$build' && ${emu[*]@Q}"

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed: ${failed[*]}"
  exit 1
fi
echo "gpu_check: every step passed; logs in $out"
