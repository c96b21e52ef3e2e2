#!/usr/bin/env bash
# Builds and gathers a portable bundle of trainrun: a folder to copy onto any x86-64 Linux host
# with glibc >= 2.34 (Debian 12, Ubuntu 22.04, RHEL 9 and later), whatever else it lacks.
#
#   scripts/portable-build.sh OUTDIR [BUILD_DIR]     # BUILD_DIR: default build/ (configured)
#
# OUTDIR (replaced; ~25 MiB, checked under 64 MiB):
#   bin/trainrun                          the launcher            \  need only glibc, libstdc++
#   libexec/trainrun/trainrun-rank-shim   each rank's supervisor   > and libgcc_s (checked
#   lib/libtrainrun_collectives.so.0      the collectives, C/C++  /  here: readelf -d NEEDED)
#   include/                              trainrun's headers and Abseil's (they use absl::Status)
#   python/                               the Python package's sources, and python/bundle/build.sh
#                                         that builds the extension against lib/ there (~30 s)
#   examples/allreduce.cc                 a C++ worker to build against the bundle
# The executables link every library statically (cmake/TrainrunStaticDeps.cmake); the library is
# the build's trainrun_collectives_portable target (cmake/TrainrunPortable.cmake; its first build
# downloads Debian's Protobuf, Abseil and RE2 sources). CUDA and NCCL are not in the bundle: the
# collectives open them at run time where they are installed.
#
# The Python extension is built on the target host rather than carried: it is a pybind11 module,
# and pybind11 has no interpreter-independent (limited API) build, so a module made here would
# load only in this host's Python version; building it there takes well under a minute.
#
# How scripts/gpu-check.sh uses it: it runs this script here, carries OUTDIR to the GPU machine
# (the `carry` of its `device` call), and there runs OUTDIR/python/bundle/build.sh BUILD_DIR
# python3 against that machine's Python and PyTorch, then its checks with OUTDIR/bin/trainrun and
# PYTHONPATH=BUILD_DIR/python; C++ workers are built there with
#   c++ -std=c++17 -IOUTDIR/include W.cc -LOUTDIR/lib -ltrainrun_collectives \
#       -Wl,-rpath,OUTDIR/lib
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/portable-build.sh OUTDIR [BUILD_DIR]}
build=${2:-${BUILD_DIR:-build}}
if [[ ! -f $build/build.ninja && ! -f $build/Makefile ]]; then
  echo "portable-build: $build is not a configured trainrun build tree; run scripts/setup.sh or cmake -S . -B $build first" >&2
  exit 2
fi
cmake --build "$build" -j2 --target trainrun trainrun_rank_shim trainrun_collectives_portable
library=$(readlink -f "$build/portable/lib/libtrainrun_collectives.so.0")

rm -rf "$out"
mkdir -p "$out"/{bin,libexec/trainrun,lib,include/trainrun,python,examples}
strip -o "$out/bin/trainrun" "$build/bin/trainrun"
strip -o "$out/libexec/trainrun/trainrun-rank-shim" "$build/bin/trainrun-rank-shim"
strip --strip-unneeded -o "$out/lib/${library##*/}" "$library"
ln -s "${library##*/}" "$out/lib/libtrainrun_collectives.so.0"
ln -s libtrainrun_collectives.so.0 "$out/lib/libtrainrun_collectives.so"
for module in collectives rendezvous; do
  cp -r "$module/include/trainrun/$module" "$out/include/trainrun/"
done
absl_include=$(dirname "$(dirname "$(find /usr/include/absl -name status.h -path '*/status/*' | head -1)")")
cp -r "$absl_include" "$out/include/"
tar -C python --exclude=__pycache__ --exclude='*.pyc' -cf - CMakeLists.txt README.md src trainrun bundle \
  | tar -C "$out/python" -xf -
cp tests/install/consumer/allreduce.cc "$out/examples/allreduce.cc"

# Check: what the binaries need, and the size.
allowed='^(libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libstdc\+\+\.so\.6|ld-linux-x86-64\.so\.2|libz\.so\.1|libssl\.so\.3|libcrypto\.so\.3)$'
for binary in "$out/bin/trainrun" "$out/libexec/trainrun/trainrun-rank-shim" "$out/lib/${library##*/}"; do
  needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  extra=$(grep -Ev "$allowed" <<<"$needed" || true)
  if [[ -n $extra ]]; then
    echo "portable-build: $binary needs $(echo $extra) beyond glibc, libstdc++, zlib and OpenSSL 3" >&2
    exit 1
  fi
done
size=$(du -sb "$out" | cut -f1)
if ((size > 64 * 1024 * 1024)); then
  echo "portable-build: the bundle is $((size / 1024 / 1024)) MiB, over the 64 MiB that can be carried" >&2
  exit 1
fi
echo "portable-build: $out ($((size / 1024 / 1024)) MiB): bin/trainrun, lib/libtrainrun_collectives.so.0, include/, python/"
