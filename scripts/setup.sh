#!/usr/bin/env bash
# Installs the Debian 12 packages strata needs (README, "Dependencies", says what each is for).
#   bash scripts/setup.sh             what building and running `strata` needs (OpenMPI included:
#                                     `mpirun -np N strata train` for several GPUs or nodes)
#   bash scripts/setup.sh --tests     plus what the test suite and benchmarks need (Catch2, git, fio)
#   bash scripts/setup.sh --goldens   plus what regenerating the torch goldens needs
#                                     (tools/golden/*.py: python3-torch, python3-numpy; ~300 MB)
#   bash scripts/setup.sh --bench     plus what `strata-bench peer` needs: python3-torch and
#                                     OpenBLAS (libopenblas0-pthread becomes the system BLAS
#                                     torch uses; the reference BLAS makes torch 14-28x slower)
# Idempotent: a package already present is skipped, and `apt-get update` runs at most once.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libpcre2-dev libutf8proc-dev liburing-dev libnuma-dev libopenmpi-dev openmpi-bin
)
for arg in "$@"; do
  case "$arg" in
    --tests) packages+=(catch2 git fio) ;;
    --goldens) packages+=(python3 python3-torch python3-numpy) ;;
    --bench) packages+=(python3 python3-torch python3-numpy libopenblas0-pthread) ;;
    *) echo "setup: unknown option '$arg' (use --tests, --goldens and/or --bench)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
