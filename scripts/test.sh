#!/usr/bin/env bash
# The whole test suite: set up, build, run ctest (Catch2 unit, golden and end-to-end tests,
# plus the sanitizer-built safetensors fuzzer).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 600
