#!/usr/bin/env bash
# Start-to-exit time of a 2-node job (np=4, 2 ranks per node, the rendezvous barrier example)
# reached through Slurm next to the same job over SSH, on the test cluster of tests/slurm/cluster.sh
# (slurmd nodes in network namespaces, which here also run an sshd). Rounds alternate the cases.
#
#   bench/launcher/slurm_vs_ssh.sh [ROUNDS]       # needs root, a build in build/ (or $BUILD_DIR)
#
# Until trainrun reaches hosts through Slurm itself (issue 21, --launcher slurm), the Slurm case
# runs today's agent protocol over `srun -u -N1 -n1 -w NODE trainrun --agent`, one step per node,
# by putting a shim named `ssh` first on PATH with --ssh-client openssh: no sshd is involved in it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
rounds=${1:-10}
[[ -x $build/bin/trainrun && -x $build/bin/barrier_example ]] || {
  echo "slurm_vs_ssh: build trainrun and barrier_example first" >&2
  exit 1
}

inner=$(mktemp /tmp/slurm_vs_ssh.XXXXXX)
trap 'rm -f "$inner"' EXIT
cat >"$inner" <<'INNER'
set -euo pipefail
dir=$TRAINRUN_SLURM_DIR
IFS=, read -r -a nodes <<<"$TRAINRUN_SLURM_NODES"
# An sshd in each node's namespace (the cluster's stop kills it with the rest).
mkdir -p "$dir/ssh/home/.ssh" /run/sshd
ssh-keygen -q -t ed25519 -N "" -f "$dir/ssh/host_key"
ssh-keygen -q -t ed25519 -N "" -f "$dir/ssh/user_key"
for node in "${nodes[@]}"; do
  printf '%s\n' "Port 22" "ListenAddress 0.0.0.0" "HostKey $dir/ssh/host_key" \
    "PidFile $dir/ssh/sshd.$node.pid" "AuthorizedKeysFile $dir/ssh/user_key.pub" "UsePAM no" \
    "StrictModes no" "PermitRootLogin prohibit-password" "PasswordAuthentication no" \
    "MaxStartups 100" >"$dir/ssh/sshd_config.$node"
  nsenter --net="/run/netns/$node" /usr/sbin/sshd -f "$dir/ssh/sshd_config.$node" -E "$dir/ssh/sshd.$node.log"
done
# The shim: `ssh [options] HOST -- COMMAND` becomes one Slurm step on HOST. srun -u gives the step
# a pty for stdout, which `trainrun --agent` refuses, hence `| cat`.
mkdir -p "$dir/shim"
cat >"$dir/shim/ssh" <<'SHIM'
#!/bin/bash
while [[ $# -gt 0 ]]; do
  case $1 in
    -o | -p | -l | -F | -i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
[[ ${1:-} == -- ]] && shift
exec srun -u -N1 -n1 -w "$host" --kill-on-bad-exit=1 sh -c "$* | cat"
SHIM
chmod +x "$dir/shim/ssh"
cat >"$dir/rounds.sh" <<ROUNDS
set -euo pipefail
hosts=${nodes[0]}:2,${nodes[1]}:2
ms() { echo \$(( (\$(date +%s%N) - \$1) / 1000000 )); }
for ((i = 0; i < $ROUNDS; i++)); do
  s=\$(date +%s%N); srun -N 2 true; echo "srun -N 2 true: \$(ms \$s)"
  s=\$(date +%s%N); PATH=$dir/shim:\$PATH $BUILD/bin/trainrun --ssh-client openssh -np 4 $BUILD/bin/barrier_example >/dev/null
  echo "trainrun through Slurm (srun per node): \$(ms \$s)"
  s=\$(date +%s%N); HOME=$dir/ssh/home $BUILD/bin/trainrun -H \$hosts -i $dir/ssh/user_key -np 4 $BUILD/bin/barrier_example >/dev/null
  echo "trainrun over SSH (libssh2): \$(ms \$s)"
  s=\$(date +%s%N); HOME=$dir/ssh/home $BUILD/bin/trainrun --ssh-client openssh -H \$hosts -i $dir/ssh/user_key -np 4 $BUILD/bin/barrier_example >/dev/null
  echo "trainrun over SSH (openssh): \$(ms \$s)"
done
ROUNDS
salloc -Q -N 2 --ntasks-per-node 2 bash "$dir/rounds.sh"
INNER
ROUNDS=$rounds BUILD=$build "$root/tests/slurm/cluster.sh" run 2 -- bash "$inner" |
  /usr/bin/python3 -c '
import statistics, sys
times = {}
for line in sys.stdin:
    name, _, ms = line.rpartition(": ")
    if name and ms.strip().isdigit():
        times.setdefault(name, []).append(int(ms))
for name, values in times.items():
    label = name + ":"
    print(f"{label:44s} median {statistics.median(values):6.0f} ms  (n={len(values)})")
'
