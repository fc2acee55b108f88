#!/usr/bin/env bash
# Configures and builds strata in build/ (BUILD_DIR overrides it).
#   bash scripts/build.sh            everything: strata, the test binaries, the CUDA emulator
#                                    suites, the fuzzer, strata-bench (what scripts/test.sh runs)
#   bash scripts/build.sh --strata   only the `strata` program, tests off (what the quickstart needs),
#                                    with precompiled headers (STRATA_PCH: a faster cold build)
# The CUDA backend: STRATA_CUDA=ON|OFF|AUTO in the environment decides. Unset, the full build
# takes AUTO (built when nvcc is found); the --strata build builds it only when a GPU answers
# (nvidia-smi) and nvcc is there, for this machine's GPU alone.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
jobs="$(nproc)"

args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=Release)
[ -f "$build/CMakeCache.txt" ] || ! command -v ninja >/dev/null || args+=(-G Ninja)
command -v ccache >/dev/null && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

case "${1:-}" in
  --strata)
    cuda="${STRATA_CUDA:-}"
    if [ -z "$cuda" ]; then
      cuda=OFF
      if nvidia-smi >/dev/null 2>&1; then
        if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
          cuda=ON
          args+=(-DCMAKE_CUDA_ARCHITECTURES=native)
          echo "build: a GPU answers nvidia-smi: building the CUDA backend for it"
        else
          echo "build: a GPU answers nvidia-smi but nvcc is not installed: building the CPU backend only"
        fi
      fi
    fi
    cmake "${args[@]}" -DSTRATA_TESTS=OFF -DSTRATA_CUDA="$cuda" -DSTRATA_PCH=ON
    cmake --build "$build" -j"$jobs" --target strata
    ;;
  "")
    cmake "${args[@]}" -DSTRATA_TESTS=ON -DSTRATA_CUDA="${STRATA_CUDA:-AUTO}"
    cmake --build "$build" -j"$jobs"
    ;;
  *) echo "build: unknown option '$1' (use --strata, or nothing for everything)" >&2; exit 2 ;;
esac
