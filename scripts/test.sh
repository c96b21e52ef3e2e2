#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds, and runs every test that needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir=${BUILD_DIR:-build}
ctest --test-dir "$build_dir" -LE gpu --output-on-failure --timeout 300 "$@"
