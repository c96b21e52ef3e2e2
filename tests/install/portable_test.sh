#!/usr/bin/env bash
# The portable bundle (scripts/portable-build.sh) on a host without trainrun's libraries: a
# minimal Debian 12 root made by debootstrap (glibc, libstdc++, zlib; no gRPC, Protobuf, Abseil,
# c-ares, RE2, libssh2, spdlog, fmt, OpenSSL), kept under BUILD_DIR/portable/debian-root so that
# reruns are fast. The bundle is copied in, a C++ worker built against the bundle alone (its
# headers and library, nothing of the build tree), and `trainrun -np 2` of it allreduces inside the
# root under chroot. Also: readelf -d NEEDED of every binary in the bundle is in the allowed set
# (glibc, libstdc++, libgcc_s, zlib, OpenSSL 3), ldd inside the root finds everything, the
# bundle runs with glibc 2.34, and the Python extension builds against the bundle alone
# (python/bundle/build.sh, timed) and allreduces at 2 ranks on this host. /proc, /dev/shm and
# /dev/pts are mounted for the job and unmounted after; nothing is left in the root.
#
# Usage: portable_test.sh BUILD_DIR SOURCE_DIR [PYTHON]. Exit 77 (skip) when not root (chroot,
# mount) or when Debian's mirror (TRAINRUN_DEBIAN_MIRROR, default http://deb.debian.org/debian)
# cannot be reached for the root or the sources the portable library is built from.
set -euo pipefail
build=$(realpath "$1")
source_dir=$(realpath "$2")
. "$source_dir/tests/install/common.sh"

if [[ $(id -u) -ne 0 ]]; then
  echo "portable_test: skipped: chroot and mount need root"
  exit 77
fi
mirror=${TRAINRUN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
export TRAINRUN_DEBIAN_MIRROR=$mirror
host=${mirror#*://}
host=${host%%/*}
reachable() { timeout 20 bash -c "exec 3<>/dev/tcp/$host/80" 2>/dev/null; }

root=$build/portable/debian-root
mkdir -p "$build/portable"
exec 9>"$build/portable/debian-root.lock"
flock 9  # one test at a time in the root

step "the minimal Debian root"
if [[ ! -f $root/.trainrun-complete ]]; then
  command -v debootstrap >/dev/null || fail "debootstrap is missing (scripts/setup.sh installs it)"
  if ! reachable; then
    echo "portable_test: skipped: debootstrap cannot reach $mirror"
    exit 77
  fi
  rm -rf "$root" "$root.tmp"
  start=$(date +%s)
  if ! debootstrap --variant=minbase bookworm "$root.tmp" "$mirror" >"$build/portable/debootstrap.log" 2>&1; then
    if ! reachable; then
      echo "portable_test: skipped: debootstrap cannot reach $mirror"
      exit 77
    fi
    tail -5 "$build/portable/debootstrap.log" >&2
    fail "debootstrap failed ($build/portable/debootstrap.log)"
  fi
  mv "$root.tmp" "$root"
  touch "$root/.trainrun-complete"
  echo "debootstrap --variant=minbase bookworm: $(($(date +%s) - start)) s"
fi
echo "$root: $(du -sm "$root" | cut -f1) MiB"
libdir=$root/usr/lib/x86_64-linux-gnu
for lib in libgrpc libgpr libprotobuf libabsl libcares libre2 libssh2 libspdlog libfmt libssl libcrypto; do
  if compgen -G "$libdir/$lib*" >/dev/null || compgen -G "$root/lib/x86_64-linux-gnu/$lib*" >/dev/null; then
    fail "the minimal root has $lib, which the bundle must not need"
  fi
done
expect_in "$(ls "$libdir")" '^libstdc\+\+\.so\.6$' "the root's libraries"

step "the bundle"
bundle=$build/portable/bundle
if [[ ! -f $build/portable/debian-sources/stamp ]] && ! reachable; then
  echo "portable_test: skipped: the portable library's Debian sources cannot be fetched from $mirror"
  exit 77
fi
"$source_dir/scripts/portable-build.sh" "$bundle" "$build"
echo "bundle: $(du -sm "$bundle" | cut -f1) MiB"

step "a C++ worker built against the bundle alone"
worker=$build/portable/allreduce_cxx
c++ -std=c++17 -O2 -I"$bundle/include" "$bundle/examples/allreduce.cc" -L"$bundle/lib" \
  -ltrainrun_collectives -Wl,-rpath,'$ORIGIN/../lib' -o "$worker"

step "readelf -d: NEEDED only glibc, libstdc++, libgcc_s, zlib, OpenSSL 3"
allowed='^(libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libstdc\+\+\.so\.6|ld-linux-x86-64\.so\.2|libz\.so\.1|libssl\.so\.3|libcrypto\.so\.3)$'
for binary in "$bundle/bin/trainrun" "$bundle/libexec/trainrun/trainrun-rank-shim" \
              "$bundle/lib/libtrainrun_collectives.so.0" "$worker"; do
  if ! readelf -d "$binary" | grep -q NEEDED; then
    echo "${binary#"$build"/}: statically linked"
    continue
  fi
  needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  echo "${binary#"$build"/}: $(echo $needed)"
  extra=$(grep -Ev "$allowed" <<<"$needed" | grep -vx 'libtrainrun_collectives\.so\.0' || true)
  [[ -z $extra ]] || fail "$binary needs $(echo $extra)"
  newest=$(objdump -T "$binary" | grep -oE 'GLIBC_2\.[0-9]+' | sort -t. -k2 -n -u | tail -1)
  echo "  newest glibc symbol version: $newest"
  [[ ${newest#GLIBC_2.} -le 34 ]] || fail "$binary needs $newest (the bundle promises glibc 2.34)"
done

step "trainrun -np 2 inside the root (chroot)"
inside=/opt/trainrun-portable-test
cleanup() {
  for mount in "$root/dev/pts" "$root/dev/shm" "$root/proc"; do
    if mountpoint -q "$mount"; then umount "$mount" || umount -l "$mount"; fi
  done
  rm -rf "${root:?}$inside"
}
trap cleanup EXIT
cleanup
mkdir -p "$root$inside"
cp -a "$bundle/." "$root$inside/"
cp "$worker" "$root$inside/bin/allreduce_cxx"
mount -t proc proc "$root/proc"
mount -t tmpfs -o size=256m,mode=1777 tmpfs "$root/dev/shm"
mount --bind /dev/pts "$root/dev/pts"  # ranks' output comes through pseudo-terminals
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root "$@"; }
ldd_out=$(in_root ldd "$inside/bin/trainrun" "$inside/bin/allreduce_cxx" "$inside/lib/libtrainrun_collectives.so.0" 2>&1)
echo "$ldd_out"
if grep -q "not found" <<<"$ldd_out"; then fail "ldd inside the root: a library is missing"; fi
in_root "$inside/bin/trainrun" --version
set +e
run=$(in_root timeout 120 "$inside/bin/trainrun" -np 2 "$inside/bin/allreduce_cxx" 2>&1)
status=$?
set -e
echo "$run"
[[ $status -eq 0 ]] || fail "trainrun -np 2 allreduce_cxx inside the root exited $status"
for rank in 0 1; do
  expect_in "$run" "^\[$rank\]<stdout>:rank $rank of 2: C\+\+ allreduce sum 3 ok" "rank $rank's output"
done

step "the Python extension built against the bundle alone (as on a GPU machine), 2 ranks"
# Not in the root, which has no Python: on this host, with the bundle's headers and library only
# (the extension must find every symbol it needs in libtrainrun_collectives.so.0).
python=${3:-/usr/bin/python3}
if "$python" -c 'import numpy' 2>/dev/null && [[ -f /usr/lib/cmake/pybind11/pybind11Config.cmake ||
      -n $("$python" -m pybind11 --cmakedir 2>/dev/null) ]]; then
  pybuild=$build/portable/python-build
  rm -rf "$pybuild"
  start=$(date +%s%N)
  "$bundle/python/bundle/build.sh" "$pybuild" "$python" >"$build/portable/python-build.log" 2>&1 ||
    { tail -20 "$build/portable/python-build.log" >&2; fail "python/bundle/build.sh failed"; }
  echo "python/bundle/build.sh: $((($(date +%s%N) - start) / 1000000)) ms (load: $(cut -d' ' -f1 /proc/loadavg))"
  extension=$(ls "$pybuild"/python/trainrun/_core*.so)
  needed=$(readelf -d "$extension" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  echo "${extension##*/}: $(echo $needed)"
  extra=$(grep -Ev "$allowed" <<<"$needed" | grep -vx 'libtrainrun_collectives\.so\.0' || true)
  [[ -z $extra ]] || fail "the extension needs $(echo $extra)"
  set +e
  run=$(timeout 120 "$bundle/bin/trainrun" -np 2 env PYTHONPATH="$pybuild/python" "$python" -c "$PY_ALLREDUCE" 2>&1)
  status=$?
  set -e
  echo "$run"
  [[ $status -eq 0 ]] || fail "trainrun -np 2 of the Python allreduce exited $status"
  expect_in "$run" "allreduce ok from $pybuild/python/trainrun" "the Python ranks' output"
else
  echo "no NumPy or pybind11 for $python: the Python extension is not built here"
fi

step "nothing left behind"
cleanup
trap - EXIT
if grep -q " $root/" /proc/mounts; then fail "a mount under $root is left: $(grep " $root/" /proc/mounts)"; fi
[[ ! -e $root$inside ]] || fail "$root$inside is left"
echo "PASS: the portable bundle runs trainrun -np 2 in a minimal Debian 12 root"
