#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang-14 with ASan + UBSan) and runs each for SECONDS,
# starting from its seed corpus in the tree. Fails on a crash, a sanitizer report, a leak, an
# input that takes over 10 s (libFuzzer's timeout) or more user CPU than its target allows
# (100 ms; the Slurm one 1 s, see tests/fuzz/fuzz_budget.h and slurm_fuzzer.cc); the failing
# input is left in $FUZZ_BUILD_DIR/artifacts/.
#
#   scripts/fuzz.sh 60                  # each fuzzer for 60 s
#   FUZZERS="slurm_fuzzer" scripts/fuzz.sh 300
#   FUZZ_SEED=1 scripts/fuzz.sh 20       # the same inputs every run (CI's gate); unset, random
set -euo pipefail
cd "$(dirname "$0")/.."
# llvm-symbolizer (package llvm-14) makes sanitizer reports name files and lines.
export PATH="/usr/lib/llvm-14/bin:$PATH"
seconds=${1:-60}
seed_flag=()
[[ -n "${FUZZ_SEED:-}" ]] && seed_flag=(-seed="$FUZZ_SEED")
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
all_fuzzers=(host_list_fuzzer hostfile_fuzzer slurm_fuzzer ssh_config_fuzzer agent_frame_fuzzer
             handshake_fuzzer config_file_fuzzer)
read -r -a fuzzers <<<"${FUZZERS:-${all_fuzzers[*]}}"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 "${launcher[@]}" \
  -DTRAINRUN_BUILD_FUZZERS=ON -DTRAINRUN_BUILD_TESTS=OFF -DTRAINRUN_BUILD_BENCH=OFF \
  -DTRAINRUN_WITH_CUDA=OFF -DTRAINRUN_STATIC_DEPS=OFF >/dev/null
cmake --build "$build_dir" -j2 --target "${fuzzers[@]}"

mkdir -p "$build_dir/artifacts"
failed=()
printf '%-22s %10s %8s %s\n' fuzzer runs seconds result
for fuzzer in "${fuzzers[@]}"; do
  # A scratch corpus: the seeds from the tree, plus what this run finds (not written back).
  corpus="$build_dir/corpus/$fuzzer"
  mkdir -p "$corpus"
  cp -r "tests/fuzz/corpus/$fuzzer/." "$corpus/"
  log="$build_dir/artifacts/$fuzzer.log"
  status=0
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build_dir/bin/$fuzzer" "$corpus" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=8192 -print_final_stats=1 \
      "${seed_flag[@]}" \
      -artifact_prefix="$build_dir/artifacts/$fuzzer-" >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
  [[ -n "$runs" ]] || runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if ((status == 0)); then
    printf '%-22s %10s %8s %s\n' "$fuzzer" "${runs:-?}" "$seconds" ok
  else
    printf '%-22s %10s %8s %s\n' "$fuzzer" "${runs:-?}" "$seconds" "FAILED (exit $status; see $log)"
    grep -m5 -E 'ERROR|SUMMARY|trainrun fuzz|timeout|leak' "$log" >&2 || true
    failed+=("$fuzzer")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: ${failed[*]} failed; the inputs are in $build_dir/artifacts/" >&2
  exit 1
fi
