#!/usr/bin/env bash
# The Slurm test cluster itself (tests/slurm/cluster.sh): srun across two nodes, salloc, sbatch, and
# nothing left behind afterwards, also when the command run in it fails. Exits 77 (skipped) on a
# machine that cannot run the cluster (not root, or Slurm not installed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/cluster.sh
if ! why=$("$cluster" check); then
  echo "skipped: $why"
  exit 77
fi

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

leftovers() {
  # Anything a cluster could leave: daemons, node namespaces, bridges, /etc/hosts lines.
  local name
  for name in munged slurmctld slurmd slurmstepd; do pgrep -x "$name" || true; done
  ip netns list | grep -E '^trs[0-9]+n[0-9]' || true
  ip -br link | grep -E '^trs[0-9]+br' || true
  grep 'trainrun-slurm-test' /etc/hosts || true
}
before=$(leftovers)

# Inside the cluster: srun on two nodes, salloc, sbatch (checked by the script below).
cat >/tmp/trainrun-slurm-check.$$ <<'CHECK'
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
IFS=, read -r -a nodes <<<"$TRAINRUN_SLURM_NODES"
[[ ${#nodes[@]} -eq 3 ]] || fail "3 nodes expected, got $TRAINRUN_SLURM_NODES"

start=$(date +%s%N)
got=$(srun -N 2 hostname | sort | tr '\n' ' ')
echo "srun -N 2 hostname: $got($((($(date +%s%N) - start) / 1000000)) ms)"
[[ $got == "${nodes[0]} ${nodes[1]} " ]] || fail "srun -N 2 hostname gave '$got'"

# Each node is its own network namespace, with its own address.
got=$(srun -N 3 sh -c 'echo $(hostname) $(ip -4 -o addr show dev eth0 | awk "{print \$4}")' | sort)
echo "$got"
[[ $(awk '{print $2}' <<<"$got" | sort -u | wc -l) -eq 3 ]] || fail "nodes share an address: $got"

got=$(salloc -N 2 --ntasks-per-node 2 sh -c 'echo $SLURM_JOB_NODELIST $SLURM_TASKS_PER_NODE; srun hostname | sort | uniq -c' 2>/dev/null)
echo "salloc: $got"
grep -q "2(x2)" <<<"$got" || fail "salloc -N 2 --ntasks-per-node 2: tasks per node not 2(x2): $got"
[[ $(grep -c " 2 trs" <<<"$got") -eq 2 ]] || fail "salloc -N 2 --ntasks-per-node 2 did not run two tasks per node: $got"

out=$TRAINRUN_SLURM_DIR/batch.out
printf '#!/bin/sh\n#SBATCH -N 3\nsrun hostname\nexit 3\n' >"$TRAINRUN_SLURM_DIR/job.sh"
status=0
sbatch --wait -o "$out" "$TRAINRUN_SLURM_DIR/job.sh" || status=$?
echo "sbatch: $(sort "$out" | tr '\n' ' ')(exit $status)"
[[ $status -eq 3 ]] || fail "sbatch --wait of a script ending 'exit 3' returned $status"
[[ $(sort -u "$out" | wc -l) -eq 3 ]] || fail "sbatch -N 3 ran on $(sort -u "$out" | wc -l) nodes"
CHECK
trap 'rm -f /tmp/trainrun-slurm-check.$$' EXIT

start=$(date +%s%N)
"$cluster" run 3 -- bash /tmp/trainrun-slurm-check.$$ || fail "the checks inside the cluster failed"
echo "cluster up, checked and down in $((($(date +%s%N) - start) / 1000000)) ms"
[[ $(leftovers) == "$before" ]] || fail "left behind: $(leftovers)"

# A failing command: its status comes back and the cluster is gone all the same.
status=0
"$cluster" run 2 -- sh -c 'srun -N 2 sleep 300 & sleep 1; exit 7' || status=$?
[[ $status -eq 7 ]] || fail "run returned $status for a command that exited 7"
[[ $(leftovers) == "$before" ]] || fail "left behind after a failing command: $(leftovers)"
pgrep -f 'srun -N 2 sleep 300' && fail "the command's srun is still running"
echo "PASS"
