#!/usr/bin/env bash
# Builds trainrun's Debian packages from a build tree (reusing what it built): trainrun,
# trainrun-dev, and trainrun-nccl where the NCCL backend was built. cmake/TrainrunPackage.cmake
# says what each holds.
#
#   scripts/package.sh                     # build/ -> build/packages/*.deb
#   scripts/package.sh BUILD_DIR OUT_DIR
#   apt install ./build/packages/trainrun_0.1.0_amd64.deb     # then, on every host
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-${BUILD_DIR:-build}}
out=${2:-$build/packages}
if [[ ! -f $build/CPackConfig.cmake ]]; then
  echo "package: $build is not a configured trainrun build tree (no CPackConfig.cmake); run scripts/setup.sh or cmake -S . -B $build first" >&2
  exit 2
fi
for tool in dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || { echo "package: $tool is missing (CPack needs it for Depends); run scripts/setup.sh" >&2; exit 2; }
done
cmake --build "$build" -j2
mkdir -p "$out"
out=$(realpath "$out")
# CPack stages each package under OUT_DIR/_CPack_Packages; only the .deb files are kept.
(cd "$build" && cpack -G DEB -B "$out" >/dev/null)
rm -rf "$out/_CPack_Packages"
ls -l "$out"/*.deb
