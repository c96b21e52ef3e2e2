#!/usr/bin/env bash
# Start-to-exit time of a 2-node job (np=4, 2 ranks per node, the rendezvous barrier example)
# reached through Grid Engine (`qrsh -inherit` per node, inside `qsub -pe`) next to the same job over
# SSH, on the test cluster of tests/sge/cluster.sh (execd nodes in network namespaces, which here also
# run an sshd). Rounds alternate the cases, inside one Grid Engine job; bench/launcher/slurm_vs_ssh.sh
# is the same for Slurm.
#
#   bench/launcher/sge_vs_ssh.sh [ROUNDS]       # needs root, a build in build/ (or $BUILD_DIR)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
rounds=${1:-10}
[[ -x $build/bin/trainrun && -x $build/bin/barrier_example ]] || {
  echo "sge_vs_ssh: build trainrun and barrier_example first" >&2
  exit 1
}
inner=$(mktemp /tmp/sge_vs_ssh.XXXXXX)
trap 'rm -f "$inner"' EXIT
cat >"$inner" <<'INNER'
set -euo pipefail
dir=$TRAINRUN_SGE_DIR
IFS=, read -r -a nodes <<<"$TRAINRUN_SGE_NODES"
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
cat >"$dir/rounds.sh" <<ROUNDS
#!/bin/bash
set -euo pipefail
hosts=${nodes[0]}:2,${nodes[1]}:2
ms() { echo \$(( (\$(date +%s%N) - \$1) / 1000000 )); }
for ((i = 0; i < $ROUNDS; i++)); do
  s=\$(date +%s%N); qrsh -inherit ${nodes[1]} true; echo "qrsh -inherit true: \$(ms \$s)"
  s=\$(date +%s%N); $BUILD/bin/trainrun -np 4 $BUILD/bin/barrier_example >/dev/null
  echo "trainrun through Grid Engine (qrsh -inherit): \$(ms \$s)"
  s=\$(date +%s%N); HOME=$dir/ssh/home $BUILD/bin/trainrun --launcher ssh -H \$hosts -i $dir/ssh/user_key -np 4 $BUILD/bin/barrier_example >/dev/null
  echo "trainrun over SSH (libssh2): \$(ms \$s)"
done
ROUNDS
chmod +x "$dir/rounds.sh"
qsub -sync y -S /bin/bash -pe trainrun 4 -j y -o "$dir/rounds.out" "$dir/rounds.sh" >/dev/null || true
cat "$dir/rounds.out"
INNER
ROUNDS=$rounds BUILD=$build "$root/tests/sge/cluster.sh" run 2 2 -- env ROUNDS="$rounds" BUILD="$build" bash "$inner" |
  /usr/bin/python3 -c '
import statistics, sys
times = {}
for line in sys.stdin:
    name, _, ms = line.rpartition(": ")
    if name and ms.strip().isdigit():
        times.setdefault(name, []).append(int(ms))
    else:
        print(line, end="", file=sys.stderr)  # what went wrong, when something did
for name, values in times.items():
    label = name + ":"
    print(f"{label:48s} median {statistics.median(values):6.0f} ms  (n={len(values)})")
'
