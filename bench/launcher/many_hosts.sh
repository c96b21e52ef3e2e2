#!/usr/bin/env bash
# Start-to-exit time of a job across many hosts: trainrun beside Open MPI's mpirun over the same
# network-namespace hosts, each running its own sshd (as tests/ssh/sshd_fixture.h's NetnsCluster
# makes them), one rank per host running /bin/true. Rounds alternate who goes first; medians.
#
#   bench/launcher/many_hosts.sh [ROUNDS] [HOST COUNTS...]   # default: 5 rounds; 2 4 8 16 32
#
# Needs root (ip netns), openssh-server, Open MPI (openmpi-bin) and a build in build/ (or
# $BUILD_DIR). The hosts are namespaces h1..hN behind a bridge in a client namespace, on
# 10.213.1.0/24 inside them: nothing is configured in this machine's own namespace, and everything
# (namespaces, sshds, keys) is removed at exit. Both launchers use the same user key; mpirun
# reaches the hosts with `--mca plm_rsh_agent "ssh -i KEY ..."` and Open MPI's defaults otherwise
# (its tree spawn included). The barrier case (trainrun only) also runs the rendezvous example.
# Root's ~/.bashrc is hidden from the SSH sessions (netns_hosts.sh): a slow one would time the shell.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=netns_hosts.sh
source "$root/bench/launcher/netns_hosts.sh"
build=${BUILD_DIR:-$root/build}
rounds=${1:-5}
shift || true
counts=("$@")
((${#counts[@]})) || counts=(2 4 8 16 32)
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "many_hosts.sh: ROUNDS '$rounds' is not a positive number" >&2; exit 2; }
max=0
for n in "${counts[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] && ((n <= 200)) || { echo "many_hosts.sh: host count '$n' is not 1 to 200" >&2; exit 2; }
  ((n > max)) && max=$n
done
[[ -x $build/bin/trainrun && -x $build/bin/barrier_example ]] || {
  echo "many_hosts.sh: build trainrun and barrier_example first (in $build)" >&2
  exit 1
}
command -v mpirun >/dev/null || { echo "many_hosts.sh: mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; }
[[ -x /usr/sbin/sshd ]] || { echo "many_hosts.sh: /usr/sbin/sshd not found (apt-get install openssh-server)" >&2; exit 1; }

dir=$(mktemp -d /tmp/many_hosts.XXXXXX)
prefix=trmh$$
client=$prefix-c
hosts=()
trap netns_hosts_cleanup EXIT

netns_hosts_start "$max"

ssh_cmd="ssh -i $dir/user_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
cat >"$dir/rounds.sh" <<ROUNDS
set -uo pipefail
export HOME=$dir/home
ms() { echo \$(( (\$(date +%s%N) - \$1) / 1000000 )); }
hostlist() { local list=() i; for ((i = 1; i <= \$1; i++)); do list+=("10.213.1.\$((10 + i)):1"); done; (IFS=,; echo "\${list[*]}"); }
case_trainrun() { $build/bin/trainrun -H "\$(hostlist \$1)" -i $dir/user_key -np \$1 /bin/true >/dev/null; }
case_barrier() { $build/bin/trainrun -H "\$(hostlist \$1)" -i $dir/user_key -np \$1 $build/bin/barrier_example >/dev/null; }
case_mpirun() {
  mpirun --allow-run-as-root --oversubscribe -H "\$(hostlist \$1)" -np \$1 \
    --mca plm_rsh_agent "$ssh_cmd" /bin/true >/dev/null
}
for ((r = 0; r < $rounds; r++)); do
  for n in ${counts[*]}; do
    if ((r % 2 == 0)); then order="trainrun mpirun barrier"; else order="barrier mpirun trainrun"; fi
    for c in \$order; do
      s=\$(date +%s%N)
      if case_\$c \$n; then echo "\$c \$n \$(ms \$s)"; else echo "\$c \$n failed"; fi
    done
  done
done
ROUNDS
echo "# many_hosts.sh: $rounds alternating rounds; load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
ip netns exec "$client" bash "$dir/rounds.sh" | tee "$dir/times" | sed 's/^/# /' >&2 || true
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) at end"
/usr/bin/python3 - "$dir/times" <<'REPORT'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    case, n, ms = line.split()
    times.setdefault((case, int(n)), []).append(None if ms == "failed" else int(ms))
print(f"{'hosts':>5} {'trainrun_ms':>11} {'mpirun_ms':>9} {'ratio':>6} {'trainrun+barrier_ms':>19}")
for n in sorted({n for _, n in times}):
    def med(case):
        values = times.get((case, n), [])
        ok = [v for v in values if v is not None]
        return (statistics.median(ok) if ok else float("nan")), len(values) - len(ok)
    (ours, f1), (peer, f2), (barrier, f3) = med("trainrun"), med("mpirun"), med("barrier")
    failed = f" ({f1 + f2 + f3} failed)" if f1 + f2 + f3 else ""
    print(f"{n:5d} {ours:11.0f} {peer:9.0f} {ours / peer:6.2f} {barrier:19.0f}{failed}")
print("# goal: ratio <= 0.5 at every count, growth sub-linear in hosts")
REPORT
