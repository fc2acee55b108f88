#!/usr/bin/env bash
# The main job on the bundled default: set up, build, and train the quickstart model
# (recipes/quickstart.toml) on the CPU. Extra arguments are recipe overrides, e.g.
#   bash scripts/quickstart.sh train.max_steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec build/strata train recipes/quickstart.toml "$@"
