#!/usr/bin/env bash
# Installs the Debian packages tinyddp builds with, when they are missing.
# As root it runs apt-get itself; otherwise it prints the one line to run.
#
#   scripts/deps.sh [extra packages...]   what the build needs (make deps, make build, make demo)
#   scripts/deps.sh --tests               also what the launcher tests run our programs under (make test):
#                                         torchrun (python3-torch), numpy for the f16 check (python3-numpy),
#                                         mpirun (openmpi-bin), a one-node Slurm
#                                         (slurmctld, slurmd, slurm-client, munge), and clang-format for the
#                                         format check (scripts/check_format.sh). These are optional:
#                                         when they cannot be installed, make test goes on and those tests
#                                         skip, each saying what is missing.
#   scripts/deps.sh --bench               also the peers make bench runs beside tinyddp (bench/peers/):
#                                         Open MPI (openmpi-bin, libopenmpi-dev), Gloo (libgloo-dev),
#                                         PyTorch (python3-torch), and gnuplot (gnuplot-nox) for the plots.
#                                         Optional as well: a peer that cannot be installed is skipped,
#                                         saying so, and ours are measured alone.
set -euo pipefail
packages=(cmake g++ make pkg-config ccache libasio-dev doctest-dev libopenblas-dev libdnnl-dev nlohmann-json3-dev libcli11-dev zlib1g-dev)
optional=()
purpose="make test: the launcher tests skip"
if [ "${1:-}" = --tests ]; then
  shift
  # Not slurm-wlm, which also brings slurmdbd and the graphical sview: the three daemons' packages
  # are what a one-node cluster needs.
  optional=(python3-torch python3-numpy openmpi-bin slurmctld slurmd slurm-client munge clang-format)
elif [ "${1:-}" = --bench ]; then
  shift
  optional=(openmpi-bin libopenmpi-dev libgloo-dev python3-torch gnuplot-nox)
  purpose="make bench: the peers and plots are skipped"
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

# Another install on this machine holds dpkg's lock: wait for it, at most TINYDDP_APT_LOCK_TIMEOUT seconds.
lock_wait=(-o "DPkg::Lock::Timeout=${TINYDDP_APT_LOCK_TIMEOUT:-600}")
install() {
  export DEBIAN_FRONTEND=noninteractive
  # Refresh the package lists only when an install fails on a stale list.
  apt-get install "${lock_wait[@]}" -y -qq "$@" >/dev/null 2>&1 ||
    { apt-get update "${lock_wait[@]}" -qq && apt-get install "${lock_wait[@]}" -y -qq "$@" >/dev/null; }
}

if [ "$(id -u)" -ne 0 ]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "make deps: these Debian packages are missing. Install them with:"
    echo "  sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
  echo "$purpose without ${missing_optional[*]} (sudo apt-get install -y ${missing_optional[*]})"
  exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "make deps: installing ${missing[*]}"
  install "${missing[@]}"
fi
if [ ${#missing_optional[@]} -gt 0 ]; then
  echo "${purpose%%:*}: installing ${missing_optional[*]}"
  # The daemons must not start as services on this machine: the tests start their own, privately.
  policy=/usr/sbin/policy-rc.d
  [ -e "$policy" ] || { printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && trap 'rm -f "$policy"' EXIT; }
  # One at a time when they do not install together, so that one missing package costs only its own.
  install "${missing_optional[@]}" 2>/dev/null || for p in "${missing_optional[@]}"; do
    install "$p" || echo "${purpose%%:*}: could not install $p; what needs it will be skipped, saying so"
  done
fi
