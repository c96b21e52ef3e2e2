#!/usr/bin/env bash
# Formats every C, C++ and CUDA source the repository tracks with clang-format 14 (Debian 12's
# `clang-format` package; other versions format differently) and the tree's .clang-format.
#
#   scripts/format.sh           # rewrite files in place
#   scripts/format.sh --check   # change nothing; list unformatted files and exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."

clang_format=$(command -v clang-format-14 || true)
if [[ -z $clang_format ]]; then
  echo "format: clang-format-14 is not installed; run scripts/setup.sh (or apt-get install clang-format)" >&2
  exit 2
fi

mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' '*.cu' '*.cpp' '*.hpp')
case "${1:-}" in
  "")
    "$clang_format" -i "${files[@]}"
    ;;
  --check)
    bad=()
    for f in "${files[@]}"; do
      "$clang_format" "$f" | cmp -s - "$f" || bad+=("$f")
    done
    if ((${#bad[@]})); then
      printf 'format: not formatted (run scripts/format.sh): %s\n' "${bad[@]}" >&2
      exit 1
    fi
    echo "format: ${#files[@]} files formatted"
    ;;
  *)
    echo "format: unknown argument '$1' (expected nothing or --check)" >&2
    exit 2
    ;;
esac
