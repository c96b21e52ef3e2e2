#!/bin/sh
# Links an executable (or the portable collectives library, cmake/TrainrunPortable.cmake) with the
# static archives of gRPC, Protobuf, Abseil, OpenSSL, libssh2, yaml-cpp and their dependencies in place of
# their shared libraries (cmake/TrainrunStaticDeps.cmake says why).
# Usage: link_static_deps.sh COMPILER ARGS... — every argument that names one of those shared
# libraries (/path/libX.so[.N], or -lX) is replaced by /path/libX.a when that file exists, and the
# libraries are wrapped in one --start-group/--end-group so their order does not matter.
set -eu
libdir=/usr/lib/x86_64-linux-gnu
static_ok() {  # $1: library name without lib prefix and suffix
  case "$1" in
    absl_*|grpc|grpc++|grpc++_*|gpr|upb|address_sorting|protobuf|cares|re2|z|ssl|crypto|ssh2|yaml-cpp) return 0 ;;
  esac
  return 1
}
compiler=$1
shift
first=1
for arg in "$@"; do
  if [ "$first" = 1 ]; then set --; first=0; fi
  replaced=$arg
  case "$arg" in
    */lib*.so|*/lib*.so.*)
      dir=${arg%/*}
      base=${arg##*/lib}
      name=${base%%.so*}
      if static_ok "$name" && [ -f "$dir/lib$name.a" ]; then replaced="$dir/lib$name.a"; fi
      ;;
    -l*)
      name=${arg#-l}
      if static_ok "$name" && [ -f "$libdir/lib$name.a" ]; then replaced="$libdir/lib$name.a"; fi
      ;;
  esac
  set -- "$@" "$replaced"
done
exec "$compiler" "$@" -Wl,--start-group $(for a in "$@"; do case "$a" in *.a) echo "$a" ;; esac; done) -Wl,--end-group
