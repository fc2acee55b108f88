#!/usr/bin/env bash
# The main job on the bundled default: install what `strata` needs, build only `strata`, and
# train the quickstart model (recipes/quickstart.toml) on the CPU. The CUDA backend is built only
# when asked for (STRATA_CUDA=ON) or when a GPU is present. Extra arguments are recipe
# overrides, e.g.
#   bash scripts/quickstart.sh train.max_steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh --strata
exec "${BUILD_DIR:-build}/strata" train recipes/quickstart.toml "$@"
