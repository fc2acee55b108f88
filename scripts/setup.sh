#!/usr/bin/env bash
# Installs the Debian 12 packages strata needs to build and test. Idempotent: a package
# already present is skipped, and `apt-get update` runs at most once per call.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev libeigen3-dev libcli11-dev catch2 libtomlplusplus-dev nlohmann-json3-dev
  libpcre2-dev libutf8proc-dev liburing-dev libnuma-dev libopenmpi-dev openmpi-bin
  python3-torch python3-numpy
)

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
