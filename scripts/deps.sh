#!/usr/bin/env bash
# Installs the Debian packages tinyddp builds with, when they are missing.
# As root it runs apt-get itself; otherwise it prints the one line to run.
#
#   scripts/deps.sh [extra packages...]   what the build needs (make deps, make build, make demo)
#   scripts/deps.sh --tests               also what the launcher tests run our programs under (make test):
#                                         torchrun (python3-torch), numpy for the f16 check (python3-numpy),
#                                         mpirun (openmpi-bin), a one-node Slurm
#                                         (slurmctld, slurmd, slurm-client, munge). These are optional:
#                                         when they cannot be installed, make test goes on and those tests
#                                         skip, each saying what is missing.
set -euo pipefail
packages=(cmake g++ make pkg-config ccache libasio-dev doctest-dev libopenblas-dev libdnnl-dev nlohmann-json3-dev libcli11-dev zlib1g-dev)
optional=()
if [ "${1:-}" = --tests ]; then
  shift
  # Not slurm-wlm, which also brings slurmdbd and the graphical sview: the three daemons' packages
  # are what a one-node cluster needs.
  optional=(python3-torch python3-numpy openmpi-bin slurmctld slurmd slurm-client munge)
fi
packages+=("$@")

missing_of() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(missing_of "${packages[@]}")
mapfile -t missing_optional < <(missing_of "${optional[@]}")
[ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ] && exit 0

install() {
  export DEBIAN_FRONTEND=noninteractive
  # Refresh the package lists only when an install fails on a stale list.
  apt-get install -y -qq "$@" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; }
}

if [ "$(id -u)" -ne 0 ]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "make deps: these Debian packages are missing. Install them with:"
    echo "  sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
  echo "make test: the launcher tests skip without ${missing_optional[*]} (sudo apt-get install -y ${missing_optional[*]})"
  exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "make deps: installing ${missing[*]}"
  install "${missing[@]}"
fi
if [ ${#missing_optional[@]} -gt 0 ]; then
  echo "make test: installing what the launcher tests run under: ${missing_optional[*]}"
  # The daemons must not start as services on this machine: the tests start their own, privately.
  policy=/usr/sbin/policy-rc.d
  [ -e "$policy" ] || { printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && trap 'rm -f "$policy"' EXIT; }
  install "${missing_optional[@]}" ||
    echo "make test: could not install ${missing_optional[*]}; the tests that need them will skip"
fi
