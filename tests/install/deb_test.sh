#!/usr/bin/env bash
# The Debian packages: scripts/package.sh builds them from the build tree; `dpkg-deb -I/-c`
# shows their control fields (Depends computed by dpkg-shlibdeps) and contents; then `dpkg -i`
# installs them, `trainrun -np 2 /usr/bin/python3 -c 'import trainrun; ...'` runs from /, and
# `dpkg -r` removes them leaving nothing behind.
#
# Installing is real (dpkg, maintainer scripts, the ldconfig trigger) but confined: it runs in a
# private mount namespace where /usr, /etc and /var are overlays whose
# changes land in this test's scratch folder. The machine's own files and dpkg database are never
# written, other processes never see the packages, and a test killed midway leaves nothing.
# Needs root (unshare, mount): ctest skips it otherwise (exit 77).
# Usage: deb_test.sh BUILD_DIR SOURCE_DIR
source "$(dirname "$0")/common.sh"
# The part that runs inside the mount namespace (this script again, with --inside).
inside() {
  for dir in /usr /etc /var; do
    layer=$WORK/overlay$dir
    mkdir -p "$layer/upper" "$layer/work"
    mount -t overlay overlay -o "lowerdir=$dir,upperdir=$layer/upper,workdir=$layer/work" "$dir"
  done
  ! dpkg -s trainrun >/dev/null 2>&1 || fail "trainrun is already installed on this machine"
  dpkg -i "$RUNTIME_DEB" "$DEV_DEB" >"$WORK/dpkg-i.log" 2>&1 || { cat "$WORK/dpkg-i.log"; fail "dpkg -i"; }
  dpkg -L trainrun trainrun-dev | sort >"$WORK/installed.txt"
  echo "installed $(wc -l <"$WORK/installed.txt") paths"

  cd /
  # As root, with bytecode written as Python does by default (the prerm must clean it up).
  out=$(env -u PYTHONPATH -u PYTHONDONTWRITEBYTECODE trainrun -np 2 /usr/bin/python3 -c "$PY_ALLREDUCE" 2>&1) ||
    fail "trainrun -np 2 /usr/bin/python3 from /: $out"
  expect_in "$out" "\[1\]<stdout>:allreduce ok from /usr/lib/python3/dist-packages/trainrun/__init__.py" "the installed package"
  echo "$out"
  [[ $(command -v trainrun) == /usr/bin/trainrun ]] || fail "trainrun on PATH is $(command -v trainrun)"
  out=$(env -u PYTHONPATH /usr/bin/python3 -m trainrun --version 2>&1)
  expect_in "$out" "0\.1\.0" "python3 -m trainrun --version"
  # (Unless this machine tells dpkg to leave manual pages out, as slim Docker images do.)
  if ! grep -qs "^path-exclude=*/usr/share/man" /etc/dpkg/dpkg.cfg.d/*; then
    expect_in "$(man -w trainrun)" "^/usr/share/man/man1/trainrun\.1\.gz$" "man -w trainrun"
  fi
  expect_in "$(pkg-config --modversion trainrun)" "^0\.1\.0$" "pkg-config finds the installed trainrun.pc"
  # The agents on other hosts default to the installed path: no --remote-trainrun needed.
  out=$(trainrun --dry-run -H node-a:1,node-b:1 /bin/true 2>&1)
  expect_in "$out" "agent: /usr/bin/trainrun --agent" "the default remote trainrun"

  # Importing as root wrote bytecode beside the package, which dpkg does not list: the prerm
  # removes it.
  [[ -d /usr/lib/python3/dist-packages/trainrun/__pycache__ ]] ||
    fail "no __pycache__ after importing trainrun as root (the prerm check would prove nothing)"
  dpkg -r trainrun-dev trainrun >"$WORK/dpkg-r.log" 2>&1 || { cat "$WORK/dpkg-r.log"; fail "dpkg -r"; }
  left=()
  while read -r path; do
    [[ -e $path && ! -d $path ]] && left+=("$path")
  done <"$WORK/installed.txt"
  ((${#left[@]} == 0)) || fail "dpkg -r left files behind: ${left[*]}"
  leftover=$(find /usr/include/trainrun /usr/lib/python3/dist-packages/trainrun /usr/share/doc/trainrun \
                  /usr/lib/cmake/trainrun /usr/lib/x86_64-linux-gnu/cmake/trainrun 2>/dev/null || true)
  [[ -z $leftover ]] || fail "dpkg -r left behind: $leftover"
  # Nothing of trainrun is left anywhere under /usr, /etc or /var (the overlays hold every file
  # written since the namespace began: also dpkg's database, logs and caches, which stay).
  added=$(cd "$WORK/overlay" && find . -path "*/upper/*" ! -type d | grep -i trainrun |
          grep -v "^./var/upper/lib/dpkg/\|^./var/upper/log/" || true)
  [[ -z $added ]] || fail "after dpkg -r, files of trainrun remain: $added"
  echo "dpkg -r left nothing behind"
}


if [[ ${1:-} == --inside ]]; then
  inside
  exit
fi
build=$(realpath "$1")
src=$(realpath "$2")
if [[ $(id -u) -ne 0 ]] || ! unshare --mount true 2>/dev/null; then
  echo "SKIP: installing the .deb needs root and mount namespaces (unshare --mount)"
  exit 77
fi
scratch deb
out=$work/packages

step "scripts/package.sh $build $out"
start=$(date +%s%N)
"$src/scripts/package.sh" "$build" "$out" >"$work/package.log" 2>&1 || {
  cat "$work/package.log"
  fail "scripts/package.sh failed"
}
echo "packages built in $((($(date +%s%N) - start) / 1000000)) ms"
runtime=$(ls "$out"/trainrun_*.deb)
dev=$(ls "$out"/trainrun-dev_*.deb)

step "dpkg-deb -I / -c"
for deb in "$out"/*.deb; do
  echo "$(basename "$deb"): $(du -k "$deb" | cut -f1) KiB packed, $(dpkg-deb -f "$deb" Installed-Size) KiB installed"
done
info=$(dpkg-deb -I "$runtime")
echo "$info" | grep -E '^ (Package|Version|Depends|Recommends|Suggests):'
expect_in "$info" '^ Package: trainrun$' "trainrun's Package"
# Depends computed by dpkg-shlibdeps from what the binaries link, plus the interpreter: the
# shared library and the extension link gRPC, Protobuf and Abseil; the executables link every
# library statically but glibc and libstdc++ (cmake/TrainrunStaticDeps.cmake), so libssh2,
# spdlog and fmt are no dependency.
depends=$(grep '^ Depends:' <<<"$info")
for dep in libc6 libstdc\\+\\+6 'libgrpc\+\+1' libprotobuf libabsl 'python3 \(>= 3'; do
  expect_in "$depends" "$dep" "trainrun's Depends"
done
for dep in libssh2 libspdlog libfmt; do
  if grep -q "$dep" <<<"$depends"; then fail "trainrun's Depends name $dep: $depends"; fi
done
expect_in "$info" 'shlibs|triggers' "trainrun's control files (shlibs, ldconfig trigger)"
contents=$(dpkg-deb -c "$runtime")
for f in ./usr/bin/trainrun ./usr/libexec/trainrun/trainrun-rank-shim \
         ./usr/lib/python3/dist-packages/trainrun/__init__.py \
         ./usr/lib/python3/dist-packages/trainrun/common/ops.py \
         ./usr/lib/python3/dist-packages/trainrun/torch/ops.py \
         './usr/lib/python3/dist-packages/trainrun/_core\..*\.so' ./usr/share/man/man1/trainrun.1.gz \
         ./usr/share/bash-completion/completions/trainrun ./usr/share/zsh/vendor-completions/_trainrun \
         './usr/lib/.*libtrainrun_collectives\.so\.0\.1\.0'; do
  expect_in "$contents" " $f\$" "trainrun's contents"
done
dev_info=$(dpkg-deb -I "$dev")
expect_in "$dev_info" '^ Depends: trainrun \(= 0\.1\.0\), libabsl-dev' "trainrun-dev's Depends"
dev_contents=$(dpkg-deb -c "$dev")
for f in ./usr/include/trainrun/collectives/communicator.h ./usr/include/trainrun/rendezvous/store.h \
         './usr/lib/.*cmake/trainrun/trainrunConfig\.cmake' './usr/lib/.*pkgconfig/trainrun\.pc' \
         './usr/lib/.*libtrainrun_collectives\.a' './usr/lib/.*libtrainrun_collectives\.so -> .*'; do
  expect_in "$dev_contents" " $f\$" "trainrun-dev's contents"
done

step "dpkg -i, run from /, dpkg -r (in a private mount namespace over overlays)"
export RUNTIME_DEB=$runtime DEV_DEB=$dev WORK=$work
unshare --mount --propagation private "$0" --inside
echo "deb: all checks passed"
