#!/usr/bin/env bash
# The aarch64 cross-compile (Grace Hopper and Graviton nodes): builds the collectives' transports
# and reductions (shared memory, TCP, the algorithms over them, the store calls, with the
# rendezvous' MemoryStore) for aarch64 with Debian's g++-aarch64-linux-gnu at -O2 -Werror, links
# tests/cross/transports_check.cc, and runs it under qemu-aarch64: 2 and 4 ranks as threads,
# allreduce over shared memory and over TCP on loopback, results checked (docs/development.md).
#
# gRPC and protobuf have no arm64 packages here, so the rest of the library (communicator,
# rendezvous client and server, launcher) and the Catch2 suites are not cross-built. Abseil and
# OpenSSL, which the TCP transport's store and handshake need, are Debian's arm64 packages, unpacked
# into a private sysroot (dpkg -x, not installed: their versions need not match the amd64 ones).
#
#   scripts/cross-aarch64.sh            # BUILD_DIR=build-aarch64
set -euo pipefail
cd "$(dirname "$0")/.."
out=${BUILD_DIR:-build-aarch64}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Packages: the cross compiler and qemu-user from amd64; the arm64 libraries downloaded only.
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
arm_debs=(libabsl-dev libabsl20220623 libssl-dev libssl3)
sysroot=$out/sysroot
if ((${#need[@]})) || [[ ! -e $sysroot/.unpacked ]]; then
  if [[ $(id -u) != 0 ]]; then
    echo "cross-aarch64: ${need[*]:-arm64 libraries} missing, and installing needs root" >&2
    exit 1
  fi
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
    apt-get update -qq
  fi
  if ((${#need[@]})); then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  fi
  if [[ ! -e $sysroot/.unpacked ]]; then
    rm -rf "$out/debs" "$sysroot"
    mkdir -p "$out/debs" "$sysroot"
    chmod 777 "$out/debs"  # apt's download runs as _apt
    (cd "$out/debs" && apt-get download -qq "${arm_debs[@]/%/:arm64}" ||
      { apt-get update -qq && apt-get download -qq "${arm_debs[@]/%/:arm64}"; })
    for deb in "$out"/debs/*.deb; do dpkg -x "$deb" "$sysroot"; done
    touch "$sysroot/.unpacked"
  fi
fi

cxx=(aarch64-linux-gnu-g++)
command -v ccache >/dev/null && cxx=(ccache aarch64-linux-gnu-g++)
flags=(-std=c++17 -O2 -pthread -Wall -Wextra -Wpedantic -Wshadow=local -Wno-unused-parameter
  -Werror -Icollectives/src -Icollectives/include -Icollectives/testing/include -Irendezvous/include
  -isystem "$sysroot/usr/include" -isystem "$sysroot/usr/include/aarch64-linux-gnu")
sources=(
  collectives/src/acceptor.cc collectives/src/algorithms.cc collectives/src/handshake.cc
  collectives/src/reduce.cc collectives/src/shm_allreduce.cc collectives/src/shm_ring.cc
  collectives/src/shm_segment.cc collectives/src/shm_transport.cc collectives/src/shm_wait.cc
  collectives/src/socket.cc collectives/src/store_calls.cc collectives/src/tcp_transport.cc
  collectives/src/types.cc collectives/src/wait_limit.cc
  rendezvous/src/admission.cc rendezvous/src/environment.cc rendezvous/src/memory_store.cc
  rendezvous/src/store.cc
  tests/cross/transports_check.cc)
objects=()
pids=()
for src in "${sources[@]}"; do
  obj=$out/obj/${src%.cc}.o
  mkdir -p "$(dirname "$obj")"
  objects+=("$obj")
  extra=()
  [[ $src == collectives/src/reduce.cc ]] && extra=(-O3)  # as the native build (CMakeLists)
  "${cxx[@]}" "${flags[@]}" "${extra[@]}" -c "$src" -o "$obj" &
  pids+=($!)
  if ((${#pids[@]} >= ${CROSS_JOBS:-2})); then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
libdir=$sysroot/usr/lib/aarch64-linux-gnu
aarch64-linux-gnu-g++ -pthread -o "$out/transports_check" "${objects[@]}" -L"$libdir" -Wl,--disable-new-dtags,-rpath,"$libdir" \
  -labsl_strings -labsl_str_format_internal -labsl_status -labsl_statusor -labsl_cord \
  -labsl_strings_internal -labsl_int128 -labsl_raw_logging_internal -labsl_throw_delegate \
  -lcrypto
file "$out/transports_check" | grep -q 'ARM aarch64' ||
  { echo "cross-aarch64: $out/transports_check is not an aarch64 executable" >&2; exit 1; }
qemu-aarch64 -L /usr/aarch64-linux-gnu "$out/transports_check"
