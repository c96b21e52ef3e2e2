# Helpers for the install tests (sourced): step titles, failures that say what was expected, and
# a scratch folder removed on exit.
set -euo pipefail
step() { echo "== $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_in TEXT PATTERN WHAT: TEXT contains the extended regex PATTERN, else fail naming WHAT.
expect_in() {
  grep -Eq -- "$2" <<<"$1" || { printf '%s\n' "$1" >&2; fail "$3: expected /$2/"; }
}
scratch() {  # scratch NAME: a fresh folder under $TMPDIR, removed when the test exits
  work=$(mktemp -d "${TMPDIR:-/tmp}/trainrun-$1.XXXXXX")
  trap 'rm -rf "$work"' EXIT
}
# A worker that checks a 2-rank allreduce through the Python package and says where it came from.
PY_ALLREDUCE='import numpy, trainrun
trainrun.init()
x = trainrun.allreduce(numpy.full(1000, trainrun.rank() + 1.0), op=trainrun.Sum)
assert (x == 3).all(), x
print("allreduce ok from", trainrun.__file__)
trainrun.shutdown()'
