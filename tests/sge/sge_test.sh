#!/usr/bin/env bash
# trainrun inside a real Grid Engine job (tests/sge/cluster.sh: a qmaster and 2 execd nodes in
# network namespaces, 2 slots each, no sshd anywhere): `qsub -pe trainrun 4` runs trainrun with
# no -H, which takes the hosts from $PE_HOSTFILE and reaches the other node with `qrsh -inherit`.
# Checks a checked allreduce on 2 nodes x 2 slots, a rank killed on the other node ending the job
# with the usual summary, and `qdel` ending the job with nothing left on either node.
# Which node is the job's master (runs the job script, so trainrun and ranks 0-1) is the
# scheduler's choice, either node from one job to the next; Grid Engine lists it first in
# $PE_HOSTFILE, so ranks 2-3 are on the other one. Each job prints its master node and the checks
# look for the remote ranks on the other node.
# Usage: sge_test.sh TRAINRUN ALLREDUCE_PERF     (root and Grid Engine; exit 77 without them)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
trainrun=$1 perf=$2
if ! why=$("$here/cluster.sh" check); then
  echo "skipped: $why"
  exit 77
fi
if [[ -z ${TRAINRUN_SGE_DIR-} ]]; then  # start a cluster and run this script inside it
  exec "$here/cluster.sh" run 2 2 -- "$0" "$@"
fi
IFS=, read -r -a nodes <<<"$TRAINRUN_SGE_NODES"
work=$(mktemp -d "${TMPDIR:-/tmp}/trainrun-sge.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
# left ROUNDS: what still runs on the nodes besides sge_execd, empty once nothing does (waits up to
# ROUNDS x 0.1 s).
left() {
  local rounds=$1 out
  for ((r = 0; r < rounds; r++)); do
    out=""
    for node in "${nodes[@]}"; do
      for pid in $(ip netns pids "$node"); do
        cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)
        [[ $cmd == *sge_execd* || -z $cmd ]] || out+="$node:$pid:$cmd; "
      done
    done
    [[ -z $out ]] && return 0
    sleep 0.1
  done
  echo "$out"
}
# other_node OUT: the node that is not the job's master, which the job's output OUT names in a
# `master node: NAME` line; status 1 when OUT names no node of this cluster.
other_node() {
  local master
  master=$(sed -n 's/^master node: //p' <<<"$1" | head -1)
  case $master in
    "${nodes[0]}") echo "${nodes[1]}" ;;
    "${nodes[1]}") echo "${nodes[0]}" ;;
    *) return 1 ;;
  esac
}
submit() {  # submit NAME SCRIPT-TEXT: qsub -sync y of a job running SCRIPT-TEXT; its output in NAME.out
  local name=$1
  printf '#!/bin/sh\n%s\n' "$2" >"$name.sh"
  chmod +x "$name.sh"
  qsub -sync y -pe trainrun 4 -cwd -j y -o "$work/$name.out" -N "$name" "$work/$name.sh" >/dev/null 2>&1
}

echo "== a checked allreduce on 2 nodes x 2 slots, hosts from \$PE_HOSTFILE, qrsh -inherit"
start=$(date +%s.%N)
submit allreduce "exec $trainrun $perf -b 1M -e 1M -n 5 -c 1"
rc=$?
wall=$(echo "$(date +%s.%N) - $start" | bc)
out=$(cat allreduce.out 2>/dev/null)
echo "$out" | grep -v '^#' | tail -3
((rc == 0)) || fail "the allreduce job: qsub -sync y exited $rc: $out"
grep -Eq '^\[0\]<stdout>: +1048576 .* 0$' <<<"$out" || fail "no checked 1 MiB row with 0 wrong: $out"
grep -q "4 ranks on 2 hosts started" <<<"$out" || fail "no start line for 4 ranks on 2 hosts: $out"
printf 'qsub -sync y of the job: %.2f s; trainrun: %s\n' "$wall" \
  "$(grep -o 'started in [0-9.]* s' <<<"$out")"
leftover=$(left 50) || fail "left running after the job: $leftover"

echo "== a rank killed on the other node ends the job with the summary"
submit killed "echo master node: \$(hostname); exec $trainrun sh -c 'if [ \"\$TRAINRUN_RANK\" = 3 ]; then sleep 1; kill -9 \$\$; fi; exec sleep 60'"
rc=$?
out=$(cat killed.out 2>/dev/null)
echo "$out" | grep -v '^\[' | tail -3
((rc == 137)) || fail "a SIGKILLed rank: the job exited $rc, not 137: $out"
other=$(other_node "$out") || fail "the job's output names no master node of ${nodes[*]}: $out"
echo "expected: rank 3 on $other, the node that is not the job's master"
grep -Eq "rank 3 on $other .*(SIGKILL|signal 9)" <<<"$out" ||
  fail "the summary does not name rank 3 on $other (not the job's master node): $out"
leftover=$(left 50) || fail "left running after the failed job: $leftover"

echo "== qdel ends the job"
# shellcheck disable=SC2016  # $(hostname) is for the job to run, on its master node
printf '#!/bin/sh\necho master node: $(hostname)\nexec %s sleep 300\n' "$trainrun" >long.sh
chmod +x long.sh
id=$(qsub -terse -pe trainrun 4 -cwd -j y -o "$work/long.out" -N long "$work/long.sh")
for _ in $(seq 300); do grep -q 'started in' long.out 2>/dev/null && break; sleep 0.1; done
grep -q '4 ranks on 2 hosts started' long.out || fail "the long job did not start: $(cat long.out)"
other=$(other_node "$(cat long.out)") || fail "the long job names no master node: $(cat long.out)"
remote=$(ip netns pids "$other" | xargs -r -I{} cat /proc/{}/cmdline 2>/dev/null | tr '\0' ' ')
[[ -n $other && $remote == *"sleep 300"* ]] || fail "no rank runs on $other: $remote"
start=$(date +%s.%N)
qdel "$id" >/dev/null
for _ in $(seq 300); do qstat -j "$id" >/dev/null 2>&1 || break; sleep 0.1; done
qstat -j "$id" >/dev/null 2>&1 && fail "job $id still known to the qmaster 30 s after qdel"
leftover=$(left 100) || fail "left running after qdel: $leftover"
printf 'qdel to nothing left: %.2f s\n' "$(echo "$(date +%s.%N) - $start" | bc)"

echo "sge: $failures failures"
((failures == 0))
