#!/bin/sh
# Checks that each object compiled for the portable library (cmake/TrainrunPortable.cmake) defines
# exactly the global symbols of the Debian archive member it replaces, i.e. that the same source
# file, configured as Debian configured it, was compiled. Weak symbols (inline functions, which
# the optimizer may or may not emit) are left out of the comparison.
#
# Usage: portable_check_objects.sh OBJECT... — each named like Debian's member (arena.cc.o for
# libprotobuf.a's arena.o). Where an archive holds two members of that name, the one that uses
# local-exec thread-local storage (the reason for the replacement) is compared.
set -eu
libdir=${TRAINRUN_DEBIAN_LIBDIR:-/usr/lib/x86_64-linux-gnu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
strong_globals() {
  nm -g --defined-only --format=posix "$1" | awk '$2 !~ /^[wWvVu]$/ {print $1}' | sort
}
for object in "$@"; do
  base=${object##*/}
  case $base in
    arena.cc.o) archive=libprotobuf.a member=arena.o ;;
    sysinfo.cc.o) archive=libabsl_base.a member=$base ;;
    cordz_functions.cc.o) archive=libabsl_cordz_functions.a member=$base ;;
    pool_urbg.cc.o) archive=libabsl_random_internal_pool_urbg.a member=$base ;;
    raw_hash_set.cc.o) archive=libabsl_raw_hash_set.a member=$base ;;
    re2.cc.o) archive=libre2.a member=re2.o ;;
    *) echo "portable_check_objects: $object replaces no known Debian object" >&2; exit 1 ;;
  esac
  count=$(ar t "$libdir/$archive" | grep -cxF "$member" || true)
  found=
  i=1
  while [ "$i" -le "$count" ]; do
    rm -rf "$work/x" && mkdir "$work/x"
    (cd "$work/x" && ar xN "$i" "$libdir/$archive" "$member")
    if readelf -rW "$work/x/$member" | grep -q "R_X86_64_TPOFF32 "; then found=$work/x/$member; break; fi
    i=$((i + 1))
  done
  if [ -z "$found" ]; then
    echo "portable_check_objects: $archive has no member $member with local-exec TLS; the portable library's list of replaced objects (cmake/TrainrunPortable.cmake) is out of date" >&2
    exit 1
  fi
  if ! strong_globals "$found" >"$work/debian" || ! strong_globals "$object" >"$work/ours"; then
    echo "portable_check_objects: nm could not read $object or $archive($member)" >&2
    exit 1
  fi
  if ! cmp -s "$work/debian" "$work/ours"; then
    echo "portable_check_objects: $object does not define the symbols of $archive($member):" >&2
    diff "$work/debian" "$work/ours" | head -20 >&2
    exit 1
  fi
  if readelf -rW "$object" | grep -q "R_X86_64_TPOFF32 "; then
    echo "portable_check_objects: $object still uses local-exec thread-local storage" >&2
    exit 1
  fi
done
