#!/usr/bin/env bash
# Installs what ladle builds with, from Debian's packages, when it is missing. The CUDA
# toolkit (headers and libnvrtc) is expected under /usr/local/cuda (or $CUDA_HOME).
set -euo pipefail
pkgs=(cmake ninja-build g++ libfmt-dev libxtensor-dev xtl-dev libxsimd-dev catch2
      nlohmann-json3-dev libcli11-dev libdlpack-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/nvrtc.h" ]; then
  echo "ladle needs the CUDA toolkit's headers and NVRTC: $cuda/include/nvrtc.h is missing" >&2
  exit 1
fi
