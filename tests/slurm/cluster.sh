#!/usr/bin/env bash
# A real, throw-away Slurm cluster on this machine for tests (Debian's slurm-wlm 22.05 and munge):
# munged with a fresh key, slurmctld on this host, and N slurmd "nodes", each in its own network
# namespace behind a bridge that the script makes. Everything lives in DIR; nothing of the
# machine's own Slurm or munge configuration is read or written. Needs root.
#
#   tests/slurm/cluster.sh start DIR [NODES]   # prints `export` lines: SLURM_CONF, TRAINRUN_SLURM_*
#   tests/slurm/cluster.sh stop DIR            # kills everything start made, deletes namespaces,
#                                              # bridge and /etc/hosts lines; safe to repeat
#   tests/slurm/cluster.sh run [NODES] -- COMMAND...
#                                              # start in a temp DIR, run COMMAND with the cluster's
#                                              # environment, stop (also on failure or a signal),
#                                              # exit with COMMAND's status
#   tests/slurm/cluster.sh check               # exit 0 when this machine can run a cluster
#
# Layout: bridge trs<K>br at 10.214.<K>.1/24 in this namespace (slurmctld listens there, under
# this host's name); node i
# (1-based) is named trs<K>n<i>, lives in network namespace trs<K>n<i> at 10.214.<K>.<10+i>, has
# that hostname (its own UTS namespace) and a /etc/hosts line. Nodes see each other and this host
# through the bridge.
#
# Facts that shaped it (slurm-wlm 22.05): `ip netns exec` remounts /sys and slurmd then dies for
# want of /sys/fs/cgroup, so a node enters only the network namespace (nsenter --net) and a UTS
# namespace for its hostname; munged wants a 0700 key folder and a separate 0755 socket folder,
# given to every Slurm program by AuthInfo=socket=...; SlurmdSpoolDir=.../%n must exist first;
# node names must resolve, hence the /etc/hosts lines.
set -euo pipefail

die() {
  echo "slurm cluster: $*" >&2
  exit 1
}

check() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root"; return 1; }
  local program
  for program in munged slurmctld slurmd srun salloc sbatch scancel sinfo ip nsenter unshare; do
    command -v "$program" >/dev/null || { echo "needs $program (scripts/setup.sh installs it)"; return 1; }
  done
}

hosts_lock=/tmp/trainrun-slurm-test.hosts.lock

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

start() {
  local dir=$1 nodes=${2:-2}
  local why
  why=$(check) || die "$why"
  [[ $nodes =~ ^[1-9]$ ]] || die "NODES must be 1 to 9, not '$nodes'"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [[ ! -e $dir/cluster.env ]] || die "$dir already holds a cluster (stop it first)"

  # A free index K: its bridge and namespaces must not exist. `ip link add` fails when another
  # cluster took K meanwhile, and then the next K is tried.
  local k prefix bridge
  for k in $(shuf -i 1-250); do
    prefix=trs$k
    bridge=${prefix}br
    ip link show "$bridge" >/dev/null 2>&1 && continue
    ip link add "$bridge" type bridge 2>/dev/null && break
    k=""
  done
  [[ -n $k ]] || die "no free bridge name trs<K>br (K in 1..250)"
  local ctl_addr=10.214.$k.1
  {
    echo "prefix=$prefix"
    echo "bridge=$bridge"
    echo "nodes=$nodes"
  } >"$dir/cluster.env"
  ip addr add "$ctl_addr/24" dev "$bridge"
  ip link set "$bridge" up

  local hosts_lines="" node_lines="" node_names="" i
  for ((i = 1; i <= nodes; i++)); do
    local name=${prefix}n$i addr=10.214.$k.$((10 + i))
    ip netns add "$name"
    echo "netns=$name" >>"$dir/cluster.env"
    ip link add "${name}v" type veth peer name eth0 netns "$name"
    ip link set "${name}v" master "$bridge" up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$addr/24" dev eth0
    ip -n "$name" link set eth0 up
    ip -n "$name" route add default via "$ctl_addr"
    hosts_lines+="$addr $name # trainrun-slurm-test $prefix"$'\n'
    node_lines+="NodeName=$name NodeAddr=$addr CPUs=4 RealMemory=1000 State=UNKNOWN"$'\n'
    node_names+="${node_names:+,}$name"
  done
  # Under a lock: another cluster may be rewriting /etc/hosts in stop() at this moment.
  (
    flock 9
    printf '%s' "$hosts_lines" >>/etc/hosts
  ) 9>"$hosts_lock"

  # munge: a fresh key in a 0700 folder, the socket in a separate 0755 one.
  mkdir -p "$dir/munge/etc" "$dir/munge/run" "$dir/munge/lib" "$dir/log" "$dir/state" "$dir/spool"
  chmod 0700 "$dir/munge/etc" "$dir/munge/lib"
  chmod 0755 "$dir/munge/run"
  dd if=/dev/urandom of="$dir/munge/etc/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$dir/munge/etc/munge.key"
  local socket=$dir/munge/run/munge.socket
  munged --force --key-file="$dir/munge/etc/munge.key" --socket="$socket" \
    --pid-file="$dir/munge/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/lib/munged.seed" --num-threads=2
  echo "pidfile=$dir/munge/run/munged.pid" >>"$dir/cluster.env"

  local ctl_port
  ctl_port=$(free_port)
  for ((i = 1; i <= nodes; i++)); do mkdir -p "$dir/spool/${prefix}n$i"; done
  cat >"$dir/slurm.conf" <<EOF
# Made by tests/slurm/cluster.sh for one test run.
ClusterName=$prefix
SlurmctldHost=$(hostname -s)($ctl_addr)
MailProg=/bin/true
SlurmctldPort=$ctl_port
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=2
MinJobAge=2
WaitTime=0
$node_lines
PartitionName=debug Nodes=$node_names Default=YES MaxTime=INFINITE State=UP
EOF

  slurmctld -f "$dir/slurm.conf" -i
  echo "pidfile=$dir/slurmctld.pid" >>"$dir/cluster.env"
  for ((i = 1; i <= nodes; i++)); do
    local name=${prefix}n$i
    nsenter --net="/run/netns/$name" unshare --uts \
      sh -c "hostname $name && exec slurmd -N $name -f $dir/slurm.conf"
    echo "pidfile=$dir/slurmd.$name.pid" >>"$dir/cluster.env"
  done

  # Up when every node is idle.
  export SLURM_CONF=$dir/slurm.conf
  local deadline=$((SECONDS + 30)) idle=0
  while ((SECONDS < deadline)); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | grep -c . || true)
    ((idle == nodes)) && break
    sleep 0.1
  done
  if ((idle != nodes)); then
    sinfo -N >&2 || true
    tail -n 20 "$dir/log/"*.log >&2 || true
    die "only $idle of $nodes nodes became idle within 30 s (logs in $dir/log)"
  fi
  echo "export SLURM_CONF=$dir/slurm.conf"
  echo "export TRAINRUN_SLURM_NODES=$node_names"
  echo "export TRAINRUN_SLURM_NETNS=$node_names"
  echo "export TRAINRUN_SLURM_DIR=$dir"
}

stop() {
  local dir=$1
  [[ -e $dir/cluster.env ]] || return 0
  local prefix="" bridge="" line pid
  local -a netns=() pidfiles=()
  while IFS= read -r line; do
    case $line in
      prefix=*) prefix=${line#prefix=} ;;
      bridge=*) bridge=${line#bridge=} ;;
      netns=*) netns+=("${line#netns=}") ;;
      pidfile=*) pidfiles+=("${line#pidfile=}") ;;
    esac
  done <"$dir/cluster.env"
  # Clients first: every process on this host with the cluster's SLURM_CONF in its environment
  # (srun, salloc, sbatch and whatever a test started under them). Then the daemons (each by the
  # pid it wrote), then whatever still runs in a node's namespace (slurmstepd, the job's tasks).
  local -a pids=()
  local environ
  for environ in $(grep -lzxF "SLURM_CONF=$dir/slurm.conf" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [[ $pid -ne $$ && $pid -ne $BASHPID ]] && pids+=("$pid")
  done
  for line in "${pidfiles[@]}"; do
    [[ -s $line ]] && pids+=("$(<"$line")")
  done
  for ns in "${netns[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do pids+=("$pid"); done
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  # Until nothing is left in the nodes' namespaces (a slurmd may have forked a slurmstepd meanwhile)
  # and every process killed is gone: reaped, or a zombie whose living parent (not init, which
  # reaps the daemons) has yet to wait for it. At most 10 s in all.
  local deadline=$((SECONDS + 10)) stat ppid state waiting
  while ((SECONDS < deadline)); do
    waiting=0
    for ns in "${netns[@]}"; do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null || true
        pids+=("$pid")
      done
    done
    for pid in "${pids[@]}"; do
      stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
      stat=${stat##*) }
      state=${stat%% *}
      ppid=${stat#* }
      ppid=${ppid%% *}
      [[ $state == Z && $ppid != 1 ]] && continue
      waiting=1
      break
    done
    ((waiting)) || break
    sleep 0.02
  done
  for ns in "${netns[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  [[ -n $bridge ]] && ip link del "$bridge" 2>/dev/null || true
  if [[ -n $prefix ]]; then
    # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file.
    (
      flock 9
      local kept
      kept=$(grep -v "# trainrun-slurm-test $prefix\$" /etc/hosts || true)
      printf '%s\n' "$kept" >/etc/hosts
    ) 9>"$hosts_lock"
  fi
  rm -f "$dir/cluster.env"
}

run() {
  local nodes=2
  if [[ ${1:-} != -- ]]; then nodes=$1; shift; fi
  [[ ${1:-} == -- ]] || die "usage: cluster.sh run [NODES] -- COMMAND..."
  shift
  # Global, for the EXIT trap.
  run_dir=$(mktemp -d /tmp/trainrun-slurm.XXXXXX)
  trap 'stop "$run_dir"; rm -rf "$run_dir"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local environment
  environment=$(start "$run_dir" "$nodes")
  eval "$environment"
  local status=0
  "$@" || status=$?
  return "$status"
}

case ${1:-} in
  start) [[ $# -ge 2 ]] || die "usage: cluster.sh start DIR [NODES]"; start "$2" "${3:-2}" ;;
  stop) [[ $# -eq 2 ]] || die "usage: cluster.sh stop DIR"; stop "$2" ;;
  run) shift; run "$@" ;;
  check) check ;;
  *) die "usage: cluster.sh start DIR [NODES] | stop DIR | run [NODES] -- COMMAND... | check" ;;
esac
