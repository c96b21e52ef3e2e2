#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then, from outside the source and build trees:
#   - the layout (binary, libraries with SONAME, headers, CMake package, trainrun.pc, Python
#     package in the interpreter's site folder under the prefix, man page, completion), with no
#     reference to the build or source tree in the package files;
#   - the installed `trainrun -np 2` runs the installed Python package's allreduce, and
#     `python3 -m trainrun` runs the installed launcher;
#   - tests/install/consumer (find_package(trainrun)) builds against the prefix, and its C++, C
#     and static-archive programs allreduce under the installed trainrun;
#   - `pkg-config --cflags --libs trainrun` compiles the same program;
#   - DESTDIR is honoured.
# Usage: install_tree_test.sh BUILD_DIR SOURCE_DIR PYTHON
source "$(dirname "$0")/common.sh"
build=$(realpath "$1")
src=$(realpath "$2")
python=$3
scratch install-tree
prefix=$work/prefix
cd "$work"
unset PYTHONPATH

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p' "$build/CMakeCache.txt")
site=$("$python" -c 'import sys, sysconfig
print(sysconfig.get_path("platlib", "posix_prefix", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' "$prefix")
for f in bin/trainrun libexec/trainrun/trainrun-rank-shim "$libdir/libtrainrun_collectives.so.0.1.0" \
         "$libdir/libtrainrun_collectives.so" \
         "$libdir/libtrainrun_collectives.a" include/trainrun/collectives/communicator.h \
         include/trainrun/collectives/c_api.h include/trainrun/rendezvous/store.h \
         "$libdir/cmake/trainrun/trainrunConfig.cmake" "$libdir/cmake/trainrun/trainrunConfigVersion.cmake" \
         "$libdir/pkgconfig/trainrun.pc" share/man/man1/trainrun.1.gz \
         share/bash-completion/completions/trainrun share/zsh/vendor-completions/_trainrun \
         share/doc/trainrun/README.md share/doc/trainrun/docs/usage.md; do
  [[ -e $prefix/$f ]] || fail "cmake --install did not install $f"
done
ls "$site"/trainrun/_core.*.so "$site"/trainrun/__init__.py "$site"/trainrun/__main__.py \
   "$site"/trainrun/torch/__init__.py "$site"/trainrun/common/ops.py "$site"/trainrun/torch/ops.py \
   "$site"/trainrun/torch/elastic/state.py >/dev/null || fail "the Python package is not in $site"
expect_in "$(readelf -d "$prefix/$libdir/libtrainrun_collectives.so.0.1.0")" \
  'SONAME.*\[libtrainrun_collectives\.so\.0\]' "the shared library's SONAME"
[[ $(readlink "$prefix/$libdir/libtrainrun_collectives.so.0") == libtrainrun_collectives.so.0.1.0 ]] ||
  fail "libtrainrun_collectives.so.0 does not point at libtrainrun_collectives.so.0.1.0"
if grep -rlE "$build|$src" "$prefix/$libdir/cmake" "$prefix/$libdir/pkgconfig"; then
  fail "the CMake package or trainrun.pc names the build or source tree"
fi
if readelf -d "$prefix/bin/trainrun" "$prefix/$libdir/libtrainrun_collectives.so.0.1.0" \
     "$site"/trainrun/_core.*.so | grep -E "R(UN)?PATH.*($build|$src)"; then
  fail "an installed binary has an RPATH into the build or source tree"
fi
echo "layout ok: $(cd "$prefix" && find . -type f | wc -l) files, $(du -sh "$prefix" | cut -f1)"

step "installed trainrun -np 2 runs the installed Python package's allreduce"
out=$(PYTHONPATH=$site "$prefix/bin/trainrun" -np 2 "$python" -c "$PY_ALLREDUCE" 2>&1) ||
  fail "trainrun -np 2 python3 allreduce failed: $out"
expect_in "$out" "\[0\]<stdout>:allreduce ok from $site/trainrun/__init__.py" "rank 0"
expect_in "$out" "\[1\]<stdout>:allreduce ok from $site/trainrun/__init__.py" "rank 1"
echo "$out"

step "python3 -m trainrun runs the launcher installed with the package"
# The rank's parent is trainrun's rank shim, the one installed beside it; the shim's is the launcher.
out=$(PYTHONPATH=$site "$python" -m trainrun -np 1 /bin/sh -c 'readlink /proc/$PPID/exe /proc/$(cut -d" " -f4 /proc/$PPID/stat)/exe' 2>&1) ||
  fail "python3 -m trainrun failed: $out"
expect_in "$out" "^\[0\]<stdout>:$prefix/libexec/trainrun/trainrun-rank-shim$" "the installed rank shim"
expect_in "$out" "^\[0\]<stdout>:$prefix/bin/trainrun$" "python3 -m trainrun's launcher"
echo "$out"

step "find_package(trainrun): tests/install/consumer against $prefix"
cmake -S "$src/tests/install/consumer" -B consumer -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" >consumer.log 2>&1 || { cat consumer.log; fail "configure"; }
cmake --build consumer >>consumer.log 2>&1 || { cat consumer.log; fail "build"; }
[[ -x consumer/allreduce_static ]] || fail "trainrun::collectives_static was not defined"
expect_in "$(ldd consumer/allreduce_cxx)" \
  "libtrainrun_collectives\.so\.0 => $prefix/$libdir/libtrainrun_collectives\.so\.0" "allreduce_cxx's library"
if ldd consumer/allreduce_static | grep -q libtrainrun; then fail "allreduce_static links the shared library"; fi
for program in allreduce_cxx allreduce_c allreduce_static; do
  out=$("$prefix/bin/trainrun" -np 2 "consumer/$program" 2>&1) || fail "$program under trainrun: $out"
  expect_in "$out" "\[1\]<stdout>:rank 1 of 2: C(\+\+)? allreduce sum 3 ok" "$program"
  echo "$out"
done

if [[ -e $prefix/$libdir/cmake/trainrun/trainrunNcclTargets.cmake ]]; then
  # The NCCL backend was built: the consumer links it, and it loads (running it needs a GPU).
  [[ -x consumer/nccl_link ]] || fail "trainrun::collectives_nccl was not defined"
  expect_in "$(consumer/nccl_link)" "trainrun::collectives_nccl loaded" "nccl_link"
  echo "trainrun::collectives_nccl links and loads"
fi

step "pkg-config --cflags --libs trainrun"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
expect_in "$(pkg-config --modversion trainrun)" '^0\.1\.0$' "pkg-config --modversion"
g++ -std=c++17 -o pc_allreduce "$src/tests/install/consumer/allreduce.cc" $(pkg-config --cflags --libs trainrun)
gcc -o pc_allreduce_c "$src/tests/install/consumer/allreduce.c" $(pkg-config --cflags --libs trainrun)
for program in pc_allreduce pc_allreduce_c; do
  out=$(LD_LIBRARY_PATH=$prefix/$libdir "$prefix/bin/trainrun" -np 2 "./$program" 2>&1) ||
    fail "$program under trainrun: $out"
  expect_in "$out" "\[0\]<stdout>:rank 0 of 2: C(\+\+)? allreduce sum 3 ok" "$program"
  echo "$out"
done

step "DESTDIR"
DESTDIR=$work/stage cmake --install "$build" --prefix /opt/trainrun-test >/dev/null
staged_site=$("$python" -c 'import sys, sysconfig
print(sysconfig.get_path("platlib", "posix_prefix", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' /opt/trainrun-test)
for f in /opt/trainrun-test/bin/trainrun "$staged_site/trainrun/__init__.py" \
         /opt/trainrun-test/share/man/man1/trainrun.1.gz; do
  [[ -e $work/stage$f ]] || fail "DESTDIR: no $work/stage$f"
done
[[ $(cd "$work/stage" && find . ! -type d | grep -v '^./opt/trainrun-test/') == "" ]] ||
  fail "DESTDIR: files outside DESTDIR/opt/trainrun-test"
[[ ! -e /opt/trainrun-test ]] || fail "DESTDIR: /opt/trainrun-test was written"
echo "install tree: all checks passed"
