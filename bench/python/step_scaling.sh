#!/usr/bin/env bash
# Scaling efficiency of a training step: bench/python/step_time.py at -np 1 (the one-rank figure:
# no communication in either contender) and at each N given, then images/s at N divided by
# N x the one-rank images/s, for trainrun's DistributedOptimizer and for DDP (gloo).
#
#   bench/python/step_scaling.sh [N ...] [-- step_time.py flags]   (default: 2 4 -- --model resnet18)
#
# On a machine with fewer cores than N ranks the efficiency is bounded by cores/N (2 cores, N=4:
# at most 0.5); each rank runs 1 torch thread (step_time.py --threads).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TRAINRUN_BUILD_DIR:-$root/build}
counts=()
while (($#)) && [[ $1 != -- ]]; do
  [[ $1 =~ ^[1-9][0-9]*$ ]] || { echo "step_scaling.sh: '$1' is not a rank count (before --)" >&2; exit 2; }
  counts+=("$1")
  shift
done
(($#)) && shift
flags=("$@")
((${#flags[@]})) || flags=(--model resnet18)
((${#counts[@]})) || counts=(2 4)

run() {  # run N: step_time.py's table, rank 0's lines without the [0]<stdout>: prefix
  "$build/bin/trainrun" -np "$1" /usr/bin/python3 "$root/bench/python/step_time.py" "${flags[@]}" \
    2>/dev/null | sed -n 's/^\[0\]<stdout>://p'
}
ips() {  # ips TABLE NAME: the images/s column of contender NAME
  awk -v n="$2" '$1 == n { print $3 }' <<<"$1"
}

one=$(run 1)
echo "# -np 1:"; echo "$one"
declare -A base=([trainrun]=$(ips "$one" trainrun) [ddp-gloo]=$(ips "$one" ddp-gloo))
for n in "${counts[@]}"; do
  table=$(run "$n")
  echo "# -np $n:"; echo "$table"
  for name in trainrun ddp-gloo; do
    awk -v name="$name" -v n="$n" -v r="$(ips "$table" "$name")" -v b="${base[$name]}" \
      'BEGIN { printf "# scaling efficiency, %s at -np %d: %.1f / (%d x %.1f) = %.2f\n", name, n, r, n, b, r / (n * b) }'
  done
done
