#!/usr/bin/env bash
# --sync-dst-dir beside rsync over the same SSH: a 200 MiB source (4 files of 40 MiB, 2,000 of
# 20 KiB in 40 directories, and a .git both leave out) copied to 4 network-namespace hosts, each
# running its own sshd in a mount namespace with a private tmpfs for the copies (no shared disk).
# Rounds alternate the order of the cases; each round does a first sync (the hosts' copies wiped
# before) and a no-change resync. Printed: every time, then the medians and the load average.
#
#   bench/launcher/sync_vs_rsync.sh [ROUNDS]      # default 5
#   TRAINRUN_ARGS="--ssh-client openssh" bench/launcher/sync_vs_rsync.sh   # trainrun through `ssh`
#
# Cases, each to all 4 hosts:
#   trainrun   trainrun -H h1..h4 -np 4 --sync-dst-dir D --sync-src-dir SRC /bin/true: connect,
#              sync (in parallel), then a job of /bin/true
#   job        the same job without --sync-dst-dir: what of `trainrun` is not the sync
#   rsync      `rsync -a --exclude .git -e "ssh -i KEY ..." SRC/ root@hN:D/`, the 4 hosts in
#              parallel (MXNet's launch.py runs `rsync -az` one host after another; -z compresses,
#              which random data does not repay, so -a is rsync's better case here)
# Needs root (ip netns), openssh-server, rsync and a build in build/ (or $BUILD_DIR). Everything
# (namespaces, sshds, keys, copies) is removed at exit.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=netns_hosts.sh
source "$root/bench/launcher/netns_hosts.sh"
build=${BUILD_DIR:-$root/build}
rounds=${1:-5}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "sync_vs_rsync.sh: ROUNDS '$rounds' is not a positive number" >&2; exit 2; }
[[ -x $build/bin/trainrun ]] || { echo "sync_vs_rsync.sh: build trainrun first (in $build)" >&2; exit 1; }
command -v rsync >/dev/null || { echo "sync_vs_rsync.sh: rsync not found (apt-get install rsync)" >&2; exit 1; }
[[ -x /usr/sbin/sshd ]] || { echo "sync_vs_rsync.sh: /usr/sbin/sshd not found (apt-get install openssh-server)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "sync_vs_rsync.sh: needs root (network namespaces)" >&2; exit 1; }
n=4
dir=$(mktemp -d /tmp/sync_vs_rsync.XXXXXX)
prefix=trsy$$
client=$prefix-c
hosts=()
trap netns_hosts_cleanup EXIT

# The source: random bytes, so that neither side gains from compression.
src=$dir/src
mkdir -p "$src/.git/objects"
for i in 1 2 3 4; do head -c $((40 << 20)) /dev/urandom >"$src/weights$i.bin"; done
head -c $((20 << 20)) /dev/urandom >"$dir/pool"
for d in $(seq 40); do
  mkdir -p "$src/pkg$d"
  for f in $(seq 50); do
    dd if="$dir/pool" of="$src/pkg$d/mod$f.py" bs=20480 count=1 skip=$(((d * 50 + f) % 1000)) status=none
  done
done
rm "$dir/pool"
head -c $((8 << 20)) /dev/urandom >"$src/.git/objects/pack"
total=$(du -sm --exclude=.git "$src" | cut -f1)

# Each host's sshd has a private tmpfs at $dir/disk: the host's own disk.
mkdir -p "$dir/disk"
netns_hosts_start "$n" "mount -t tmpfs sync-bench $dir/disk"
# wipe D: the copies of D on every host removed (the next sync is a first one).
wipe() {
  for ((i = 1; i <= n; i++)); do nsenter -t "$(cat "$dir/sshd.$i.pid")" -m rm -rf "$dir/disk/$1"; done
}

ssh_cmd="ssh -i $dir/user_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
hostlist=$(for ((i = 1; i <= n; i++)); do printf '10.213.1.%d:1,' $((10 + i)); done)
hostlist=${hostlist%,}
in_client() { ip netns exec "$client" env HOME="$dir/home" "$@"; }
case_trainrun() {
  in_client "$build/bin/trainrun" -q -H "$hostlist" -i "$dir/user_key" -np $n ${TRAINRUN_ARGS:-} \
    --sync-dst-dir "$dir/disk/trainrun" --sync-src-dir "$src" /bin/true
}
case_job() {
  in_client "$build/bin/trainrun" -q -H "$hostlist" -i "$dir/user_key" -np $n ${TRAINRUN_ARGS:-} /bin/true
}
case_rsync() {
  local i pids=()
  for ((i = 1; i <= n; i++)); do
    in_client rsync -a --exclude=.git -e "$ssh_cmd" "$src/" "root@10.213.1.$((10 + i)):$dir/disk/rsync/" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || return 1; done
}
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }

echo "# sync_vs_rsync.sh: $total MiB (without .git) to $n hosts, $rounds alternating rounds; load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
: >"$dir/times"
for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then order="trainrun rsync job"; else order="job rsync trainrun"; fi
  for kind in first resync; do
    for c in $order; do
      [[ $kind == first ]] && wipe "$c"
      s=$(date +%s%N)
      if case_$c >/dev/null; then echo "$c $kind $(ms "$s")"; else echo "$c $kind failed"; fi
    done
  done | tee -a "$dir/times" | sed 's/^/# /'
done
# Both copies are whole: the same bytes as the source on every host, .git left out.
for ((i = 1; i <= n; i++)); do
  for c in trainrun rsync; do
    nsenter -t "$(cat "$dir/sshd.$i.pid")" -m diff -r --exclude=.git "$src" "$dir/disk/$c" >/dev/null ||
      echo "sync_vs_rsync.sh: host $i's $c copy differs from the source" >&2
    nsenter -t "$(cat "$dir/sshd.$i.pid")" -m test ! -e "$dir/disk/$c/.git" ||
      echo "sync_vs_rsync.sh: host $i's $c copy has .git" >&2
  done
done
echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) at end"
/usr/bin/python3 - "$dir/times" "$total" "$n" <<'REPORT'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    case, kind, ms = line.split()
    if ms != "failed":
        times.setdefault((case, kind), []).append(int(ms))
mib, hosts = int(sys.argv[2]), int(sys.argv[3])
print(f"{'case':<10}{'first sync (ms)':>18}{'resync (ms)':>14}   runs")
for case in ("trainrun", "rsync", "job"):
    first = times.get((case, "first"), [])
    resync = times.get((case, "resync"), [])
    med = lambda v: f"{statistics.median(v):.0f}" if v else "-"
    print(f"{case:<10}{med(first):>18}{med(resync):>14}   {len(first)}+{len(resync)}")
t, r = times.get(("trainrun", "first")), times.get(("rsync", "first"))
if t and r:
    print(f"first sync: {mib * hosts / (statistics.median(t) / 1000):.0f} MiB/s into the hosts with "
          f"trainrun (job included), {mib * hosts / (statistics.median(r) / 1000):.0f} MiB/s with rsync")
REPORT
