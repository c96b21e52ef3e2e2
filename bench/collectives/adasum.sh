#!/usr/bin/env bash
# Adasum beside Average (and Sum): allreduce_perf -o adasum/avg/sum at one size, over shared memory
# and TCP, at several rank counts, from ONE alternating run (adasum, avg, sum, adasum, ...),
# printing per case the median over the rounds in nccl-tests' columns and the load average seen.
#
#   bench/collectives/adasum.sh [-r ROUNDS] [-n "2 4"] [-s BYTES] [-t "shm tcp"] [-B BUILD_DIR]
#
# -r rounds (default 5), -n rank counts (default "2 4"), -s size in bytes (default 16777216,
# 16 MiB of float32), -t transports (default "shm tcp"), -B the build directory whose
# bin/allreduce_perf runs (default build/). Each run is allreduce_perf --np N (forked ranks on this
# host) with 10 timed calls after 3 warm-up calls and -c 1: allreduce_perf's Adasum inputs are
# orthogonal (rank r's nonzero only where i % n == r), so its result is exactly the sum and #wrong
# counts every element that is not. Time is the slowest rank's mean per call, in µs; busbw uses
# allreduce's factor 2(n-1)/n for every op, so that the columns compare.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rounds=5 nps="2 4" size=16777216 transports="shm tcp" build=$root/build
while getopts "r:n:s:t:B:h" opt; do
  case "$opt" in
    r) rounds=$OPTARG ;;
    n) nps=$OPTARG ;;
    s) size=$OPTARG ;;
    t) transports=$OPTARG ;;
    B) build=$OPTARG ;;
    *) sed -n '2,15p' "$0" >&2; exit 2 ;;
  esac
done
perf=$build/bin/allreduce_perf
if [[ ! -x $perf ]]; then
  echo "adasum.sh: $perf is not built (cmake --build build --target allreduce_perf)" >&2
  exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
loads=()
for ((round = 0; round < rounds; ++round)); do
  loads+=("$(cut -d' ' -f1 /proc/loadavg)")
  for transport in $transports; do
    for np in $nps; do
      for op in adasum avg sum; do
        TRAINRUN_TRANSPORT=$transport "$perf" --np "$np" -b "$size" -e "$size" -o "$op" -n 10 -w 3 \
          -c 1 | grep -v '^#' >>"$out/$transport.$np.$op"
      done
    done
  done
done
echo "# allreduce of $size bytes, median of $rounds rounds;" \
  "load average at each round's start: ${loads[*]}"
printf '# %-9s %3s %12s %12s %8s %6s %10s %8s %8s %8s\n' transport np size count type redop \
  "time(us)" "algbw" "busbw" "#wrong"
for transport in $transports; do
  for np in $nps; do
    for op in adasum avg sum; do
      sort -n -k5 "$out/$transport.$np.$op" | awk -v t="$transport" -v np="$np" '
        { line[NR] = $0; wrong += $8 }
        END {
          split(line[int((NR + 1) / 2)], f, " ")
          printf "  %-9s %3s %12s %12s %8s %6s %10.1f %8.3f %8.3f %8d\n", t, np, f[1], f[2], f[3],
                 f[4], f[5], f[6], f[7], wrong
        }'
    done
  done
done
