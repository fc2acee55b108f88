#!/usr/bin/env bash
# Installs the Debian 12 packages strata needs (README, "Dependencies", says what each is for).
#   bash scripts/setup.sh             what building and running `strata` needs (OpenMPI included:
#                                     `mpirun -np N strata train` for several GPUs or nodes)
#   bash scripts/setup.sh --tests     plus what the test suite and benchmarks need (Catch2, git, fio)
#   bash scripts/setup.sh --goldens   plus what regenerating the torch goldens needs
#                                     (tools/golden/*.py: python3-torch, python3-numpy; ~300 MB)
#   bash scripts/setup.sh --bench     plus what `strata-bench peer` needs: python3-venv, and a
#                                     venv .venv-bench/ in the source tree with today's PyTorch
#                                     from PyPI's CPU index and transformers (~1 GB; skipped when
#                                     it already imports both)
# Idempotent: a package already present is skipped, and `apt-get update` runs at most once.
set -euo pipefail

bench_venv=0
packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libpcre2-dev libutf8proc-dev liburing-dev libnuma-dev libopenmpi-dev openmpi-bin
)
for arg in "$@"; do
  case "$arg" in
    --tests) packages+=(catch2 git fio) ;;
    --goldens) packages+=(python3 python3-torch python3-numpy) ;;
    --bench) packages+=(python3 python3-venv); bench_venv=1 ;;
    *) echo "setup: unknown option '$arg' (use --tests, --goldens and/or --bench)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The peer benchmark's torch: PyPI's CPU build (oneDNN with AMX / AVX512-BF16 kernels, fused SDPA,
# torch.compile) and transformers, in a venv beside the sources (ignored by git). strata-bench peer
# looks for it there; nothing else uses it.
if [ "$bench_venv" -eq 1 ]; then
  venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-bench"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, transformers, numpy" 2>/dev/null; then
    echo "setup: $venv has torch and transformers"
  else
    echo "setup: making $venv (torch from https://download.pytorch.org/whl/cpu or PyPI, transformers from PyPI)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    if ! "$venv/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu; then
      echo "setup: PyTorch's CPU index is not reachable: torch from PyPI instead (its CUDA build, a larger"
      echo "setup: download; on a machine without a GPU it runs on the CPU the same)"
      "$venv/bin/pip" install -q torch
    fi
    "$venv/bin/pip" install -q transformers numpy
    "$venv/bin/python" -c "import torch, transformers; print('setup: torch', torch.__version__, 'transformers', transformers.__version__)"
  fi
fi
