#!/usr/bin/env bash
# Installs, once, every Debian 12 package trainrun's build, tests and examples need, then builds
# into build/. Safe to run again: it installs only what is missing and rebuilds incrementally.
#
#   scripts/setup.sh            # packages + build
#   BUILD_DIR=out scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}

packages=(
  # toolchain
  cmake ninja-build g++ make pkg-config git ca-certificates clang-format
  # libraries (DESIGN.md's dependencies)
  libboost-dev libboost-filesystem-dev libssh2-1-dev libcli11-dev libspdlog-dev libfmt-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev libssl-dev catch2
  # --config-file's YAML (cli/src/config_file.cc) is read by yaml-cpp
  libyaml-cpp-dev
  # Python bindings, the PyTorch example and its tests
  python3-dev pybind11-dev python3-numpy python3-torch python3-sklearn python3-pytest
  # launcher and multi-host tests: real processes, a real sshd, network namespaces
  openssh-server openssh-client iproute2 procps
  # installing (tests/install): pip into a venv, the .deb (CPack's Depends via dpkg-shlibdeps and
  # file), the man page (man -l) and shell completion (zsh)
  python3-pip python3-venv python3-setuptools python3-wheel dpkg-dev file man-db groff-base zsh
  # scripts/fuzz.sh and scripts/sanitize.sh: libFuzzer and the sanitizer runtimes come with clang's
  # compiler-rt; llvm-symbolizer (llvm-14) turns sanitizer reports' addresses into lines
  clang-14 libclang-rt-14-dev llvm-14
  # Slurm tests (label slurm): a real cluster of slurmd "nodes" in network namespaces, with munge
  # (tests/slurm/cluster.sh); util-linux gives nsenter and unshare
  slurmctld slurmd slurm-client munge util-linux
  # Grid Engine tests (label sge): a real qmaster and execd "nodes" in network namespaces
  # (tests/sge/cluster.sh), trainrun reaching them with qrsh -inherit; bc for their timings
  gridengine-master gridengine-exec gridengine-client bc
  # trainrun.run(fn): the function and its arguments travel to the ranks by cloudpickle
  python3-cloudpickle
  # tests/monitor: the --monitor page in headless Chromium, driven over the DevTools protocol
  # (python3-websocket), /metrics through Prometheus' own text parser, `trainrun top` in tmux
  chromium fonts-dejavu-core python3-websocket python3-prometheus-client tmux
  # the portable bundle's test (tests/install/portable_test.sh): a minimal Debian root to run it in
  debootstrap
  # tests/hardening: a capture of the rendezvous' traffic must not hold the job token (tcpdump);
  # trainrun under valgrind, and scripts/sanitize.sh memcheck; the speed guard (tests/guard,
  # bench/guard/guard.py): instruction counts under callgrind and blocking system calls by strace
  tcpdump valgrind strace
  # bench/launcher/sync_vs_rsync.sh: --sync-dst-dir beside rsync over the same SSH
  rsync
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  # Grid Engine's packages would configure a cell of their own and start its daemons; the tests
  # make throw-away cells (tests/sge/cluster.sh), so the packages only install the programs.
  printf '%s\n' "gridengine-common shared/gridengineconfig boolean false" \
    "gridengine-master shared/gridengineconfig boolean false" \
    "gridengine-exec shared/gridengineconfig boolean false" \
    "gridengine-client shared/gridengineconfig boolean false" | $sudo debconf-set-selections
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j2
