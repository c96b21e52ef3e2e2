#!/usr/bin/env bash
# Small allreduces on one host: trainrun (shared memory) beside Open MPI (vader shared memory), at
# several rank counts, on a quiet machine and beside a busy process, from ONE alternating run
# (ours, Open MPI, ours, Open MPI, ...), printing per size the medians over the rounds in
# nccl-tests' columns, ours and Open MPI's side by side, and the ratio of the times.
#
#   bench/collectives/small_messages.sh [-r ROUNDS] [-n "2 4"] [-b MIN] [-e MAX] [-i ITERS]
#                                       [-T MS] [-c "quiet loaded"] [-B BUILD_DIR]
#
# -r rounds (default 5), -n rank counts (default "2 4"), -b/-e smallest/largest size in bytes
# (default 8 and 262144, doubling), -i timed iterations per size (default 1000, warm-up 50),
# -T at least this many milliseconds timed per size (default 100: more iterations than -i where
# those take less, so that every window spans many scheduler time slices; with a window shorter
# than one slice a loaded run measures only whether a preemption fell into it),
# -c conditions: quiet, loaded (one more process spinning, `yes >/dev/null`, for the whole pair),
# -B the build directory whose bin/trainrun and bin/allreduce_perf to run (default build/).
# The bound (n=2 only) is bench/collectives/peers/shm_bound.c: two bare processes doing, per
# operation, the least a copy-in shared-memory allreduce must do (copy in, publish, wait for the
# peer, sum its slot), timed by the same rule and in the same condition, alternating with the rest.
# Open MPI's probe (bench/collectives/peers/mpi_allreduce_sizes.c) is built with mpicc into a
# temporary directory; install Open MPI with ../shared/bench/peers.sh setup (or apt-get install
# openmpi-bin libopenmpi-dev). Both run float32 sum with the same sizes, iterations and warm-up;
# time is the mean per operation on the slowest rank, in µs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rounds=5 nps="2 4" min=8 max=262144 iters=1000 warmup=50 min_ms=100 conditions="quiet loaded"
build=$root/build
while getopts "r:n:b:e:i:T:c:B:h" opt; do
  case "$opt" in
    r) rounds=$OPTARG ;;
    n) nps=$OPTARG ;;
    b) min=$OPTARG ;;
    e) max=$OPTARG ;;
    i) iters=$OPTARG ;;
    T) min_ms=$OPTARG ;;
    c) conditions=$OPTARG ;;
    B) build=$(cd "$OPTARG" && pwd) ;;
    *) sed -n '2,21p' "$0"; exit 2 ;;
  esac
done
for c in $conditions; do
  [[ $c == quiet || $c == loaded ]] || { echo "small_messages.sh: unknown condition '$c' (quiet, loaded)" >&2; exit 2; }
done
for f in "$build/bin/trainrun" "$build/bin/allreduce_perf"; do
  [[ -x $f ]] || { echo "small_messages.sh: $f is missing; build it (cmake --build build --target trainrun allreduce_perf)" >&2; exit 2; }
done
command -v mpicc >/dev/null && command -v mpirun >/dev/null ||
  { echo "small_messages.sh: Open MPI is not installed (../shared/bench/peers.sh setup)" >&2; exit 2; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/small-messages-XXXXXX)
busy=
cleanup() {
  [[ -n $busy ]] && kill "$busy" 2>/dev/null && wait "$busy" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
mpicc -O2 "$here/peers/mpi_allreduce_sizes.c" -o "$work/mpi_allreduce_sizes"
cc -O2 "$here/peers/shm_bound.c" -o "$work/shm_bound"

# ours|mpi NP OUTFILE: one table, data rows only (size count type redop time algbw busbw #wrong).
run() {
  if [[ $1 == ours ]]; then
    "$build/bin/trainrun" -q -np "$2" --no-tag-output "$build/bin/allreduce_perf" \
      -b "$min" -e "$max" -f 2 -n "$iters" -w "$warmup" -T "$min_ms" -c 1
  elif [[ $1 == bound ]]; then
    "$work/shm_bound" "$min" "$max" 2 "$iters" "$warmup" "$min_ms"
  else
    mpirun -np "$2" --oversubscribe --bind-to none "$work/mpi_allreduce_sizes" \
      "$min" "$max" 2 "$iters" "$warmup" "$min_ms"
  fi | grep -v '^ *#' | awk 'NF == 8' >"$3"
}

start_busy() { (exec yes >/dev/null) & busy=$!; }
stop_busy() { kill "$busy"; wait "$busy" 2>/dev/null || true; busy=; }

echo "# $(date -u +%FT%TZ) $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg);" \
  "$rounds alternating rounds, $iters iterations per size and at least $min_ms ms"
for ((r = 1; r <= rounds; r++)); do
  for c in $conditions; do
    [[ $c == loaded ]] && start_busy
    for np in $nps; do
      run ours "$np" "$work/ours.$c.$np.$r"
      run mpi "$np" "$work/mpi.$c.$np.$r"
      [[ $np == 2 ]] && run bound "$np" "$work/bound.$c.$np.$r"
    done
    [[ $c == loaded ]] && stop_busy
  done
done

# Median of the times per size; algbw and busbw from the median time; #wrong the largest.
for c in $conditions; do
  for np in $nps; do
    echo
    echo "# n=$np, $c$([[ $c == loaded ]] && echo ' (beside yes >/dev/null)'): median of $rounds rounds;" \
      "ratio = trainrun time / Open MPI time (<= 1: trainrun as fast or faster);" \
      "bound = shm_bound's time (n=2 only), ours/bound = trainrun time / bound"
    printf "# %10s %12s %8s %6s | %-8s %10s %8s %8s %8s | %-8s %10s %8s %8s %8s | %6s | %8s %10s\n" \
      size count type redop trainrun time algbw busbw '#wrong' 'Open MPI' time algbw busbw '#wrong' ratio \
      bound ours/bound
    awk -v np="$np" -v rounds="$rounds" '
      function median(list,   a, k, t, i, j) {
        k = split(list, a, " ")
        for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
      }
      {
        src = FILENAME ~ /\/ours\./ ? "ours" : FILENAME ~ /\/bound\./ ? "bound" : "mpi"
        key = src SUBSEP $1
        times[key] = times[key] " " $5
        if ($8 > wrong[key]) wrong[key] = $8
        count[$1] = $2; type[$1] = $3; op[$1] = $4
        if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 }
      }
      END {
        for (i = 1; i <= n; i++) {
          s = order[i]
          to = median(times["ours" SUBSEP s]); tm = median(times["mpi" SUBSEP s])
          ao = s / to / 1e3; am = s / tm / 1e3; f = 2 * (np - 1) / np
          printf "%12d %12d %8s %6s | %-8s %10.1f %8.3f %8.3f %8d | %-8s %10.1f %8.3f %8.3f %8d | %6.2f | ",
            s, count[s], type[s], op[s], "", to, ao, ao * f, wrong["ours" SUBSEP s],
            "", tm, am, am * f, wrong["mpi" SUBSEP s], to / tm
          if (("bound" SUBSEP s) in times) {
            tb = median(times["bound" SUBSEP s])
            printf "%8.1f %10.2f\n", tb, to / tb
          } else printf "%8s %10s\n", "-", "-"
        }
      }' "$work"/ours."$c"."$np".* "$work"/mpi."$c"."$np".* $(compgen -G "$work/bound.$c.$np.*")
  done
done
