#!/bin/sh
# Fetches and unpacks the Debian source packages of installed development packages, each at the
# exact version installed, for cmake/TrainrunPortable.cmake (which compiles a few of their files
# once more as position-independent code).
#
# Usage: fetch_debian_sources.sh OUTDIR BINARY_PACKAGE... — for each installed BINARY_PACKAGE
# (e.g. libgrpc-dev), its source package is unpacked, Debian's patches applied, into
# OUTDIR/<source package>; OUTDIR/stamp is written last. apt-get runs with its own lists under
# OUTDIR/apt (the system's apt configuration is not touched) and verifies the files against
# Debian's signed Sources indices. The mirror is TRAINRUN_DEBIAN_MIRROR (default
# http://deb.debian.org/debian; its -security sibling is added for security updates).
set -eu
out=$1
shift
mirror=${TRAINRUN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
. /etc/os-release
suite=${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}
for tool in apt-get dpkg-source dpkg-query; do
  command -v "$tool" >/dev/null || {
    echo "fetch_debian_sources: $tool is missing (apt and dpkg-dev provide it)" >&2
    exit 1
  }
done

mkdir -p "$out/apt/lists/partial" "$out/apt/cache/archives/partial" "$out/download"
out=$(cd "$out" && pwd)
cat >"$out/apt/sources.list" <<EOF
deb-src $mirror $suite main
deb-src $mirror $suite-updates main
deb-src ${mirror%/debian}/debian-security $suite-security main
EOF
apt_options="-qq -o APT::Sandbox::User=root -o Dir::Etc::SourceList=$out/apt/sources.list
  -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$out/apt/lists
  -o Dir::Cache=$out/apt/cache"
# shellcheck disable=SC2086
if ! apt-get $apt_options update >"$out/apt/update.log" 2>&1; then
  echo "fetch_debian_sources: cannot read Debian's source indices from $mirror ($out/apt/update.log says why)" >&2
  exit 1
fi
for binary in "$@"; do
  spec=$(dpkg-query -W -f='${source:Package}=${source:Version}' "$binary" 2>/dev/null) || {
    echo "fetch_debian_sources: $binary is not installed" >&2
    exit 1
  }
  name=${spec%%=*}
  [ "$(cat "$out/$name/.unpacked" 2>/dev/null)" = "$spec" ] && continue
  rm -rf "${out:?}/$name" "$out/download/$name"
  mkdir -p "$out/download/$name"
  # shellcheck disable=SC2086
  if ! (cd "$out/download/$name" && apt-get $apt_options source --download-only "$spec") \
      >"$out/download/$name.log" 2>&1; then
    echo "fetch_debian_sources: cannot download source package $spec ($out/download/$name.log says why)" >&2
    exit 1
  fi
  dsc=$(ls "$out/download/$name"/*.dsc)
  dpkg-source --no-check -x "$dsc" "$out/$name" >"$out/download/$name.unpack.log" 2>&1 || {
    echo "fetch_debian_sources: dpkg-source could not unpack $dsc ($out/download/$name.unpack.log says why)" >&2
    exit 1
  }
  echo "$spec" >"$out/$name/.unpacked"
  rm -rf "${out:?}/download/$name" "$out/$name"_*
done
touch "$out/stamp"
