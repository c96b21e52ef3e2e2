#!/usr/bin/env bash
# pip: from a clean copy of the source tree (the files git tracks or would track), `pip install
# --no-build-isolation --no-index` into a venv made with --system-site-packages (NumPy and PyTorch
# from Debian), nothing written into the copy; then `import trainrun.torch`, a 2-rank allreduce
# under the trainrun the package installed (the venv's bin/trainrun), and `python -m trainrun`.
#
# The CMake build pip runs (python/setup.py) is kept in BUILD_DIR/install-tests/pip-build, and
# the copy (made afresh each run, at the same place, BUILD_DIR/install-tests/pip-src) keeps the
# files' times, so a second run rebuilds only what changed. The venv is made afresh too.
# Usage: pip_test.sh BUILD_DIR SOURCE_DIR PYTHON
source "$(dirname "$0")/common.sh"
build=$(realpath "$1")
src=$(realpath "$2")
python=$3
scratch pip
cd "$work"
unset PYTHONPATH

step "a clean copy of $src"
tests=$build/install-tests
copy=$tests/pip-src
rm -rf "$copy" "$tests/pip-venv"
mkdir -p "$copy"
git -C "$src" ls-files -z --cached --others --exclude-standard |
  (cd "$src" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _) |
  tar -C "$src" --null -T - -cf - | tar -C "$copy" -xf -
snapshot() { (cd "$copy" && find . -printf '%p %s %T@ %m\n' | sort); }
snapshot >"$work/before.txt"
echo "$(wc -l <"$work/before.txt") paths"

step "venv --system-site-packages, pip install --no-build-isolation --no-index $copy/python"
venv=$tests/pip-venv
"$python" -m venv --system-site-packages "$venv"
start=$(date +%s)
TRAINRUN_CMAKE_BUILD_DIR=$tests/pip-build CMAKE_BUILD_PARALLEL_LEVEL=2 \
  "$venv/bin/python" -m pip install --no-build-isolation --no-index --disable-pip-version-check \
  "$copy/python" >"$work/pip.log" 2>&1 || { tail -50 "$work/pip.log"; fail "pip install"; }
echo "pip install took $(($(date +%s) - start)) s"
snapshot >"$work/after.txt"
diff "$work/before.txt" "$work/after.txt" || fail "pip install wrote into the source tree (above)"
echo "nothing written into the source tree"

step "import trainrun.torch"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
out=$("$venv/bin/python" -c 'import trainrun.torch, trainrun; print(trainrun.__file__)')
[[ $out == "$site/trainrun/__init__.py" ]] || fail "import trainrun found $out, not the venv's $site"
[[ -x $venv/bin/trainrun ]] || fail "pip did not install the launcher as $venv/bin/trainrun"
for f in common/ops.py common/process_sets.py torch/ops.py torch/functions.py torch/elastic/state.py; do
  [[ -f $site/trainrun/$f ]] || fail "pip did not install trainrun/$f into $site"
done

step "2-rank allreduce (trainrun.torch) under the installed $venv/bin/trainrun"
out=$("$venv/bin/trainrun" -np 2 "$venv/bin/python" -c 'import torch, trainrun.torch as hvd
hvd.init()
t = torch.full((1000,), float(hvd.rank() + 1))
s = hvd.allreduce(t, op=hvd.Sum)
assert bool((s == 3).all()), s
print("torch allreduce ok from", hvd.__file__)' 2>&1) || fail "trainrun -np 2: $out"
expect_in "$out" "\[1\]<stdout>:torch allreduce ok from $site/trainrun/torch/__init__.py" "rank 1"
echo "$out"
out=$("$venv/bin/trainrun" -np 2 "$venv/bin/python" -c "$PY_ALLREDUCE" 2>&1) || fail "numpy allreduce: $out"
expect_in "$out" "\[0\]<stdout>:allreduce ok from $site/trainrun/__init__.py" "rank 0"

step "python -m trainrun runs the venv's launcher"
out=$("$venv/bin/python" -m trainrun -np 1 /bin/sh -c 'readlink /proc/$PPID/exe /proc/$(cut -d" " -f4 /proc/$PPID/stat)/exe' 2>&1) || fail "$out"
expect_in "$out" "^\[0\]<stdout>:$(realpath "$venv/libexec/trainrun/trainrun-rank-shim")$" "the venv's rank shim"
expect_in "$out" "^\[0\]<stdout>:$(realpath "$venv/bin/trainrun")$" "python -m trainrun's launcher"
echo "$out"
echo "pip: all checks passed"
