#!/usr/bin/env bash
# A/B of two builds: alternating rounds (A B, B A, A B, ...) of allreduce_perf over shared memory and
# over TCP, and of the Python step benchmark, printing per size both medians, their ratio (B / A)
# and the load average seen during the rounds.
#
#   bench/ab.sh BUILD_A BUILD_B [SIZES]
#
# BUILD_A, BUILD_B: build directories (with bin/allreduce_perf; bin/trainrun and python/ for the
# step benchmark), or source trees whose build/ is one. Make an old commit's build with
#   git worktree add /tmp/old COMMIT && cmake -S /tmp/old -B /tmp/old/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/old/build --target allreduce_perf trainrun
# SIZES: comma-separated bytes with K/M suffixes (default 8,4K,16K,64K,256K,1M,4M,16M).
#
# Environment:
#   AB_ROUNDS=5          rounds per build (each round runs every size once)
#   AB_NP=2              ranks
#   AB_TRANSPORTS="shm tcp"
#   AB_STEP=1            also the step benchmark (step_time.py --model mlp; 0: skip; needs both
#                        builds' python/ and trainrun)
#   AB_BUSY=0            N: run N busy loops (one CPU each) beside every round, as other work would
#   AB_PRIORITY=0        1: run the rounds in a session of their own whose autogroup has nice -20
#                        (needs root or CAP_SYS_NICE), so that other sessions' work on a shared
#                        machine hardly competes; AB_BUSY's loops run inside it too
#   AB_LAUNCH=standalone standalone: allreduce_perf --np forks the ranks (every build has it);
#                        trainrun: BUILD/bin/trainrun -np starts them
#   AB_ENV="K=V ..."     extra environment for both builds (e.g. TRAINRUN_SHM_WAIT=spin)
#
# Each allreduce_perf run times one size for about 64 MiB of data (20 to 2,000 calls, after 20 warm-up
# calls); the figure is the slowest rank's mean per call in µs. Medians are over the rounds. A
# ratio above 1 means B is slower.
set -euo pipefail

usage() {
  sed -n '2,30p' "$0" >&2
  exit 2
}
(($# >= 2)) || usage
here=$(cd "$(dirname "$0")" && pwd)

build_dir() {
  local d=$1
  [[ -x $d/bin/allreduce_perf ]] && { cd "$d" && pwd; return; }
  [[ -x $d/build/bin/allreduce_perf ]] && { cd "$d/build" && pwd; return; }
  echo "ab.sh: $d has neither bin/allreduce_perf nor build/bin/allreduce_perf; build the target allreduce_perf there" >&2
  exit 2
}
A=$(build_dir "$1")
B=$(build_dir "$2")
sizes=${3:-8,4K,16K,64K,256K,1M,4M,16M}
rounds=${AB_ROUNDS:-5}
np=${AB_NP:-2}
transports=${AB_TRANSPORTS:-shm tcp}
step=${AB_STEP:-1}
busy=${AB_BUSY:-0}
priority=${AB_PRIORITY:-0}
launch=${AB_LAUNCH:-standalone}
extra_env=${AB_ENV:-}

bytes_of() {
  local s=$1 n
  case "$s" in
    *K | *k) n=$((${s%?} * 1024)) ;;
    *M | *m) n=$((${s%?} * 1048576)) ;;
    *G | *g) n=$((${s%?} * 1073741824)) ;;
    *) n=$s ;;
  esac
  [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || { echo "ab.sh: size '$s' is not a number of bytes (K, M, G suffixes)" >&2; exit 2; }
  echo "$n"
}
size_list=()
IFS=',' read -r -a raw <<<"$sizes"
for s in "${raw[@]}"; do size_list+=("$(bytes_of "$s")"); done

work=$(mktemp -d)
busy_pids=()
cleanup() {
  local p
  for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# run CMD...: in the prioritized session when asked.
run() {
  if ((priority)); then
    setsid bash -c 'echo -20 > /proc/$$/autogroup && exec nice -n -20 "$@"' ab "$@"
  else
    "$@"
  fi
}

start_busy() {
  local i
  for ((i = 0; i < busy; i++)); do
    if ((priority)); then
      setsid bash -c 'echo -20 > /proc/$$/autogroup; exec nice -n -20 bash -c "while :; do :; done"' &
    else
      bash -c 'while :; do :; done' &
    fi
    busy_pids+=($!)
  done
}
stop_busy() {
  local p
  for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${busy_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  busy_pids=()
}

# with_env K=V... CMD...: CMD (a function too) with AB_ENV's and the given variables exported.
with_env() (
  local kv
  for kv in $extra_env; do export "${kv?}"; done
  while [[ $1 == *=* ]]; do
    export "${1?}"
    shift
  done
  "$@"
)

load() { cut -d' ' -f1 /proc/loadavg; }

# perf BUILD TRANSPORT BYTES -> µs per call (slowest rank), or "fail"
perf_one() {
  local build=$1 transport=$2 bytes=$3 iters out
  iters=$((67108864 / bytes))
  ((iters < 20)) && iters=20
  ((iters > 2000)) && iters=2000
  local cmd=("$build/bin/allreduce_perf" -b "$bytes" -e "$bytes" -n "$iters" -w 20 -c 0)
  if [[ $launch == trainrun ]]; then
    cmd=("$build/bin/trainrun" -np "$np" "${cmd[@]}")
  else
    cmd+=(--np "$np")
  fi
  if ! out=$(with_env TRAINRUN_TRANSPORT="$transport" run "${cmd[@]}" 2>&1); then
    echo fail
    return
  fi
  echo "$out" | awk -v b="$bytes" '{sub(/^\[[0-9]+\]<stdout>:/, "")} $1 == b && $4 == "sum" {print $5; exit}'
}

# step BUILD -> median step ms of trainrun's DistributedOptimizer (MLP), or "fail"
step_one() {
  local build=$1 out
  [[ -x $build/bin/trainrun && -d $build/python ]] || { echo "n/a"; return; }
  if ! out=$(with_env TRAINRUN_BUILD_DIR="$build" run "$build/bin/trainrun" -np "$np" \
    /usr/bin/python3 "$here/python/step_time.py" --model mlp --rounds 4 --steps 20 2>&1); then
    echo fail
    return
  fi
  echo "$out" | awk '{sub(/^\[[0-9]+\]<stdout>:/, "")} $1 == "trainrun" || $1 == "ours" {print $2; exit}'
}

record() { echo "$1 $2 $3 $4" >>"$work/results"; }  # build key value load

echo "# ab.sh: A=$A"
echo "#        B=$B"
echo "# np=$np rounds=$rounds transports='$transports' busy=$busy priority=$priority launch=$launch env='$extra_env'"
echo "# $(nproc) CPUs; load at start $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < rounds; r++)); do
  order=(A B)
  ((r % 2)) && order=(B A)
  for which in "${order[@]}"; do
    build=$A
    [[ $which == B ]] && build=$B
    start_busy
    for t in $transports; do
      for bytes in "${size_list[@]}"; do
        record "$which" "$t:$bytes" "$(perf_one "$build" "$t" "$bytes")" "$(load)"
      done
    done
    if ((step)); then record "$which" "step:mlp" "$(step_one "$build")" "$(load)"; fi
    stop_busy
  done
  echo "# round $((r + 1))/$rounds done, load $(load)" >&2
done

keys=()
for t in $transports; do for bytes in "${size_list[@]}"; do keys+=("$t:$bytes"); done; done
((step)) && keys+=("step:mlp")
printf '%-14s %10s %10s %8s %7s   %s\n' what A_median B_median B/A load "A rounds | B rounds"
for k in "${keys[@]}"; do
  awk -v k="$k" '
    function median(v, n,   i, j, t) {
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      if (n == 0) return "";
      return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    $2 == k {
      if ($3 ~ /^[0-9.]+$/) { if ($1 == "A") a[++na] = $3 + 0; else b[++nb] = $3 + 0 }
      if ($1 == "A") as = as " " $3; else bs = bs " " $3
      load[++nl] = $4 + 0
    }
    END {
      ma = median(a, na); mb = median(b, nb); ml = median(load, nl)
      ratio = (ma != "" && mb != "" && ma > 0) ? sprintf("%.2f", mb / ma) : "-"
      unit = (k ~ /^step/) ? "ms" : "us"
      printf "%-14s %10s %10s %8s %7.2f  %s |%s\n", k, (ma == "" ? "-" : sprintf("%.1f", ma)), (mb == "" ? "-" : sprintf("%.1f", mb)), ratio, ml, as, bs
    }' "$work/results"
done
echo "# times: allreduce µs per call (slowest rank's mean), step ms (median); load: 1-min average during the rounds"
