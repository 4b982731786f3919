#!/usr/bin/env bash
# Installs the Debian packages tinyddp builds with, when they are missing.
# As root it runs apt-get itself; otherwise it prints the one line to run.
# usage: scripts/deps.sh [extra packages...]
set -euo pipefail
packages=(cmake g++ make pkg-config libasio-dev doctest-dev libopenblas-dev libdnnl-dev nlohmann-json3-dev libcli11-dev zlib1g-dev "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "make deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Refresh the package lists only when an install fails on a stale list.
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${missing[@]}"; }
else
  echo "make deps: these Debian packages are missing. Install them with:"
  echo "  sudo apt-get install -y ${missing[*]}"
  exit 1
fi
