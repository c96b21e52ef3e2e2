#!/usr/bin/env bash
# Sanitizer runs for CI (issue 22). Each builds the tree with GCC's sanitizers (clang-14 cannot
# compile the collectives' _Float16 code) in its own build directory and runs tests under the
# sanitizer; any report (from the test process or from any trainrun, agent or worker process it
# started) fails the run.
#
#   scripts/sanitize.sh asan     # ASan + UBSan: every test not labelled gpu, slow, python,
#                                # install or hardening
#   TRAINRUN_ASAN_BUDGET=S scripts/sanitize.sh asan
#                                # the same within S seconds, build included: the tests run in
#                                # three tiers (unit, launcher/integration, ssh/netns/slurm), and a
#                                # tier that would not fit in what is left is left out, said in one
#                                # line (CI's use: its 90 minutes do not always hold a cold build)
#   scripts/sanitize.sh tsan     # TSan: the collectives and rendezvous tests
#   scripts/sanitize.sh memcheck # Valgrind's memcheck on the launcher: its in-process tests
#                                # (supervisor, stall, output, host discovery) and whole trainrun
#                                # jobs (-np 2 true; -np 2 barrier_example: the rendezvous over
#                                # TLS), in the normal build (MEMCHECK_BUILD_DIR, default build/)
#   scripts/sanitize.sh          # asan and tsan
#
# The python-labelled tests are left out: they load the extension into Debian's uninstrumented
# python3, which would need the sanitizer runtime preloaded and reports PyTorch's own leaks. So are
# the install-labelled ones: they build and install the release tree (a wheel, a .deb), which
# this build's flags do not reach. So are the hardening-labelled ones: they time jobs under attack
# against the plain job, and one runs trainrun under valgrind.
# Suppressions (scripts/sanitizers/) name third-party code only, each with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
# llvm-symbolizer (package llvm-14) makes sanitizer reports name files and lines.
export PATH="/usr/lib/llvm-14/bin:$PATH"
root=$PWD
modes=("$@")
((${#modes[@]})) || modes=(asan tsan)

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

# configure DIR FLAGS [OPT]: a build of the tree with FLAGS on every compile and link, optimized
# with OPT (default RelWithDebInfo's -O2 -g).
configure() {
  local dir=$1 flags=$2 opt=${3:--O2 -g -DNDEBUG}
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
    -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
    -DTRAINRUN_STATIC_DEPS=OFF -DTRAINRUN_BUILD_BENCH=OFF -DTRAINRUN_WITH_CUDA=OFF >/dev/null
}

# check_reports DIR: fails, printing them, when any sanitizer report was written.
check_reports() {
  local dir=$1
  if compgen -G "$dir/report.*" >/dev/null; then
    echo "sanitize: reports in $dir:" >&2
    head -n 40 "$dir"/report.* >&2
    return 1
  fi
  echo "sanitize: no reports"
}

run_asan() {
  local dir=${ASAN_BUILD_DIR:-build-asan} budget=${TRAINRUN_ASAN_BUDGET:-0} start=$SECONDS
  # Without UBSan's vptr check: GCC 12's runtime reads an object's vtable through a pipe
  # (IsAccessibleMemoryRange), so in a process out of descriptors, which the burst test makes on
  # purpose, every polymorphic call is reported as "invalid vptr" (a 10-line program with a
  # shared_ptr does it). A stale vptr means a use after free, which ASan reports anyway.
  # -O1 -g1 (ASan's own advice, line tables for the reports' file:line) compiles in about half
  # the time of -O2 -g, which is what decides whether the run fits in CI.
  configure "$dir" "-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
    "-O1 -g1 -DNDEBUG"
  # The executables of those tests (and what they depend on), not the Python extension or
  # benchmarks. A test whose executable is not built is "Not Run", which fails: the list must cover
  # every test the tiers select (the collectives label includes the GPU loader's and the fake-GPU
  # tests, the monitor label its unit tests and the fake NVML library; the integration and netns
  # tests run trainrun and worker programs such as straggler_worker and allreduce_perf).
  # Within a budget, a build that cannot end in time is stopped and said, not failed: it found
  # nothing, and CI's own deadline would otherwise fail everything before it.
  local limit=()
  ((budget > 0)) && limit=(timeout --foreground "$budget")
  local built=0 extra=()
  # nccl_not_linked (label collectives) reads the NCCL backend's shared library too, where the
  # tree has one.
  if cmake --build "$dir" --target help | grep -q '^trainrun_collectives_nccl_shared:'; then
    extra+=(trainrun_collectives_nccl_shared)
  fi
  "${limit[@]}" cmake --build "$dir" -j2 --target "${extra[@]}" hostfile_test rendezvous_test collectives_test \
    launcher_test cli_test integration_test flags_test ssh_test ssh_agent_test ssh_netns_test \
    per_node_netns_test ssh_multihost_test slurm_fixture_test trainrun_nccl_tests \
    attribution_test monitor_unit_test gpu_loader_test device_collectives_test elastic_worker_test \
    trainrun straggler_worker straggler_netns_test allreduce_perf fake_nvml ssh_sync_netns_test \
    || built=$?
  if ((built == 124)); then
    echo "sanitize: the ASan build did not finish within the budget of $budget s; no test ran" >&2
    return 0
  fi
  ((built == 0)) || return "$built"
  echo "sanitize: the ASan build took $((SECONDS - start)) s"
  local reports="$root/$dir/sanitizer-reports"
  rm -rf "$reports" && mkdir -p "$reports"
  export ASAN_OPTIONS="log_path=$reports/report:detect_leaks=1:abort_on_error=0"
  export LSAN_OPTIONS="suppressions=$root/scripts/sanitizers/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="log_path=$reports/report:print_stacktrace=1:halt_on_error=1"
  # guard: the instruction-count guard measures the release build under callgrind, which an ASan
  # build cannot run under (and whose counts it would not be).
  local never='gpu|slow|python|install|hardening|guard' remote='ssh|netns|slurm' status=0 ran=0 left=()
  # asan_tier NAME COST SELECTION...: runs the tests that SELECTION (ctest -L/-LE) picks, unless
  # COST seconds more would overrun the budget. The costs are what the tiers took here at load
  # 5-10 (221, 134 and 396 s, -j2), rounded up by about a half for a slower machine.
  asan_tier() {
    local name=$1 cost=$2
    shift 2
    if ((budget > 0 && SECONDS - start + cost > budget)); then
      left+=("$name (~$cost s)")
      return
    fi
    ctest --test-dir "$dir" "$@" --output-on-failure --timeout 300 -j2 --repeat until-pass:2 ||
      status=$?
    ran=$((ran + 1))
  }
  # Cheapest and most input-facing first.
  asan_tier "unit" 360 -LE "$never|$remote|launcher|integration"
  asan_tier "launcher and integration" 240 -L 'launcher|integration' -LE "$never|$remote"
  asan_tier "ssh, netns and slurm" 600 -L "$remote" -LE "$never"
  if ((${#left[@]})); then
    local joined
    printf -v joined '%s; ' "${left[@]}"
    echo "sanitize: ASan left out, for lack of time in a budget of $budget s: ${joined%; }" >&2
  fi
  ((ran > 0)) || { echo "sanitize: the ASan build left no time for any test tier" >&2; }
  check_reports "$reports" || status=1
  return "$status"
}

run_tsan() {
  local dir=${TSAN_BUILD_DIR:-build-tsan}
  configure "$dir" "-fsanitize=thread -fno-omit-frame-pointer"
  cmake --build "$dir" -j2 --target collectives_test rendezvous_test barrier_example burst_server \
    gpu_loader_test device_collectives_test
  local reports="$root/$dir/sanitizer-reports"
  rm -rf "$reports" && mkdir -p "$reports"
  export TSAN_OPTIONS="log_path=$reports/report:suppressions=$root/scripts/sanitizers/tsan.supp:halt_on_error=0:second_deadlock_stack=1"
  # TSan slows gRPC calls 5-15 times: a test that missed one of its time bounds gets a second try
  # (a sanitizer report fails the run either way). "An unreachable server..." bounds a gRPC
  # client's own start-up at 3 s, which takes 6-7 s under TSan; the normal suite runs it.
  local status=0
  ctest --test-dir "$dir" -L 'rendezvous|collectives' -LE 'netns|slow' -E 'unreachable server' \
    --output-on-failure --timeout 300 -j2 --repeat until-pass:2 || status=$?
  check_reports "$reports" || status=1
  return "$status"
}

run_memcheck() {
  local dir=${MEMCHECK_BUILD_DIR:-build}
  command -v valgrind >/dev/null || { echo "sanitize: valgrind is not installed" >&2; return 1; }
  cmake --build "$dir" -j2 --target launcher_test trainrun trainrun_rank_shim barrier_example
  # Definite leaks and every memory error fail the run; gRPC's and abseil's process-lifetime
  # singletons are "still reachable", not reported. The ranks themselves are not traced.
  local vg=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
            --show-leak-kinds=definite)
  local status=0
  "${vg[@]}" "$dir/bin/launcher_test" "[supervisor],[stall],[output]" || status=$?
  "${vg[@]}" "$dir/bin/trainrun" -np 2 true || status=$?
  "${vg[@]}" "$dir/bin/trainrun" -np 2 "$dir/bin/barrier_example" || status=$?
  ((status == 0)) && echo "sanitize: memcheck found nothing"
  return "$status"
}

for mode in "${modes[@]}"; do
  start=$SECONDS
  case $mode in
    asan) run_asan ;;
    tsan) run_tsan ;;
    memcheck) run_memcheck ;;
    *) echo "usage: $0 [asan|tsan|memcheck]..." >&2; exit 2 ;;
  esac
  echo "sanitize: $mode took $((SECONDS - start)) s"
done
