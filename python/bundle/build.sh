#!/usr/bin/env bash
# Builds trainrun's Python extension against the portable bundle this script is in
# (BUNDLE/python/bundle/build.sh; scripts/portable-build.sh made the bundle), for one interpreter:
#
#   BUNDLE/python/bundle/build.sh BUILD_DIR [PYTHON]      # PYTHON: default python3 on PATH
#   PYTHONPATH=BUILD_DIR/python PYTHON -c 'import trainrun'
#   BUNDLE/bin/trainrun -np 2 env PYTHONPATH=BUILD_DIR/python PYTHON train.py
#
# Needs CMake >= 3.20, ninja or make, a C++17 compiler, the interpreter's headers and pybind11
# (`pip install pybind11`, or Debian's pybind11-dev); nothing else, and no network.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: build.sh BUILD_DIR [PYTHON]}
python=$(command -v "${2:-python3}") || { echo "build.sh: no interpreter ${2:-python3} on PATH" >&2; exit 2; }
pybind11_dir=$("$python" -m pybind11 --cmakedir 2>/dev/null || true)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DTRAINRUN_PYTHON_EXECUTABLE="$python" ${pybind11_dir:+-Dpybind11_DIR="$pybind11_dir"} >/dev/null
cmake --build "$build" -j "$(nproc)"
echo "build.sh: PYTHONPATH=$(cd "$build" && pwd)/python $python -c 'import trainrun'"
