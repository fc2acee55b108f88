#!/usr/bin/env bash
# The whole test suite: install what the tests need, build everything (scripts/build.sh), run
# ctest (Catch2 unit, golden and end-to-end tests, the CUDA emulator suites, the
# sanitizer-built safetensors fuzzer; on a machine with a GPU the real CUDA tests too).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" --timeout 600
