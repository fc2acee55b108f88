#!/usr/bin/env bash
# Installs what the build needs (scripts/setup.sh), configures and builds strata in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
