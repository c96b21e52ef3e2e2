#!/usr/bin/env bash
# A real, throw-away Grid Engine cluster on this machine for tests (Debian's gridengine-master,
# gridengine-exec and gridengine-client, 8.1.9): sge_qmaster on this host and N sge_execd "nodes",
# each in its own network namespace behind a bridge the script makes, with a queue of SLOTS slots
# per node and a parallel environment `trainrun` whose slaves may be started with `qrsh -inherit`.
# Everything lives in DIR and in a cell of its own under $SGE_ROOT; the machine's own Grid Engine
# cell and configuration are never read or written. Needs root.
#
#   tests/sge/cluster.sh start DIR [NODES [SLOTS]]   # prints `export` lines: SGE_ROOT, SGE_CELL,
#                                                    # SGE_QMASTER_PORT, SGE_EXECD_PORT, TRAINRUN_SGE_*
#   tests/sge/cluster.sh stop DIR                    # kills everything start made; safe to repeat
#   tests/sge/cluster.sh run [NODES [SLOTS]] -- COMMAND...   # start, run COMMAND (as the master
#                                                    # host, so qsub and qdel work), stop
#   tests/sge/cluster.sh check                       # exit 0 when this machine can run a cluster
#
# Layout: bridge trg<K>br at 10.216.<K>.1/24 in this namespace; the qmaster runs here under the
# name trg<K>m (a UTS namespace of its own, and a /etc/hosts line for that address); node i is trg<K>n<i> in network namespace trg<K>n<i> at 10.216.<K>.<10+i>, with
# that hostname (its own UTS namespace) and a /etc/hosts line.
#
# Facts that shaped it (gridengine 8.1.9): host names must resolve both ways, hence the /etc/hosts
# lines; the default configuration's min_uid 1000 refuses root's jobs, so the cell's configuration
# says 0; commlib ports come from SGE_QMASTER_PORT and SGE_EXECD_PORT (free ports, so clusters do
# not collide); the cell's spool is berkeleydb in DIR; a PE needs control_slaves TRUE for
# `qrsh -inherit`.
set -euo pipefail

export SGE_ROOT=/var/lib/gridengine
hosts_lock=/tmp/trainrun-sge-test.hosts.lock

die() {
  echo "sge cluster: $*" >&2
  exit 1
}

check() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root"; return 1; }
  local program
  for program in /usr/sbin/sge_qmaster /usr/sbin/sge_execd qconf qsub qrsh qdel qstat ip nsenter \
                 unshare; do
    command -v "$program" >/dev/null ||
      { echo "needs $program (scripts/setup.sh installs gridengine-master, -exec, -client)"; return 1; }
  done
}

# as_master NAME COMMAND...: COMMAND with this host's name NAME (its own UTS namespace), as the
# qmaster and Grid Engine's clients (qsub, qconf, qdel) must run here.
as_master() {
  local name=$1
  shift
  unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

start() {
  local dir=$1 nodes=${2:-2} slots=${3:-2}
  local why
  why=$(check) || die "$why"
  [[ $nodes =~ ^[1-9]$ ]] || die "NODES must be 1 to 9, not '$nodes'"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [[ ! -e $dir/cluster.env ]] || die "$dir already holds a cluster (stop it first)"

  local k prefix bridge
  for k in $(shuf -i 1-250); do
    prefix=trg$k
    bridge=${prefix}br
    ip link show "$bridge" >/dev/null 2>&1 && continue
    [[ -e $SGE_ROOT/$prefix ]] && continue
    ip link add "$bridge" type bridge 2>/dev/null && break
    k=""
  done
  [[ -n $k ]] || die "no free bridge name trg<K>br (K in 1..250)"
  local master_addr=10.216.$k.1 master=${prefix}m
  {
    echo "prefix=$prefix"
    echo "bridge=$bridge"
    echo "cell=$SGE_ROOT/$prefix"
  } >"$dir/cluster.env"
  ip addr add "$master_addr/24" dev "$bridge"
  ip link set "$bridge" up

  local hosts_lines="$master_addr $master # trainrun-sge-test $prefix"$'\n' node_names=() i
  for ((i = 1; i <= nodes; i++)); do
    local name=${prefix}n$i addr=10.216.$k.$((10 + i))
    ip netns add "$name"
    echo "netns=$name" >>"$dir/cluster.env"
    ip link add "${name}v" type veth peer name eth0 netns "$name"
    ip link set "${name}v" master "$bridge" up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$addr/24" dev eth0
    ip -n "$name" link set eth0 up
    ip -n "$name" route add default via "$master_addr"
    hosts_lines+="$addr $name # trainrun-sge-test $prefix"$'\n'
    node_names+=("$name")
  done
  (
    flock 9
    printf '%s' "$hosts_lines" >>/etc/hosts
  ) 9>"$hosts_lock"

  # The cell: bootstrap, the qmaster's name, a spool and a configuration of its own.
  export SGE_CELL=$prefix
  local cell=$SGE_ROOT/$SGE_CELL
  mkdir -p "$cell/common" "$dir/spool/qmaster/job_scripts" "$dir/spool/execd" "$dir/log"
  sed -e "s|^spooling_params .*|spooling_params $dir/spool/spooldb|" \
      -e "s|^qmaster_spool_dir .*|qmaster_spool_dir $dir/spool/qmaster|" \
      -e "s|^admin_user .*|admin_user root|" \
      /usr/share/gridengine/default-bootstrap >"$cell/common/bootstrap"
  echo "$master" >"$cell/common/act_qmaster"
  echo "$prefix" >"$cell/common/cluster_name"
  sed -e "s|^execd_spool_dir .*|execd_spool_dir $dir/spool/execd|" \
      -e "s|^min_uid .*|min_uid 0|" -e "s|^min_gid .*|min_gid 0|" \
      -e "s|^load_report_time .*|load_report_time 00:00:02|" \
      -e "s|^max_unheard .*|max_unheard 00:00:20|" \
      -e "s|^mailer .*|mailer /bin/true|" \
      /usr/share/gridengine/default-configuration >"$dir/configuration"
  mkdir -p "$dir/spool/spooldb"
  /usr/lib/gridengine/spoolinit berkeleydb libspoolb "$dir/spool/spooldb" init >"$dir/log/init" 2>&1
  /usr/lib/gridengine/spooldefaults configuration "$dir/configuration" >>"$dir/log/init" 2>&1
  /usr/lib/gridengine/spooldefaults complexes /usr/share/gridengine/util/resources/centry \
    >>"$dir/log/init" 2>&1
  /usr/lib/gridengine/spooldefaults usersets /usr/share/gridengine/util/resources/usersets \
    >>"$dir/log/init" 2>&1
  /usr/lib/gridengine/spooldefaults managers root >>"$dir/log/init" 2>&1
  /usr/lib/gridengine/spooldefaults adminhosts "$master" >>"$dir/log/init" 2>&1 || true

  export SGE_QMASTER_PORT SGE_EXECD_PORT
  SGE_QMASTER_PORT=$(free_port)
  SGE_EXECD_PORT=$(free_port)
  {
    echo "export SGE_ROOT=$SGE_ROOT"
    echo "export SGE_CELL=$SGE_CELL"
    echo "export SGE_QMASTER_PORT=$SGE_QMASTER_PORT"
    echo "export SGE_EXECD_PORT=$SGE_EXECD_PORT"
  } >"$dir/env.sh"
  # The qmaster and every client run under the master's name (a UTS namespace of their own):
  # commlib checks that a peer's name resolves to the address it connects from.
  as_master "$master" /usr/lib/gridengine/sge_qmaster
  local deadline=$((SECONDS + 30))
  until as_master "$master" qconf -sh >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "the qmaster did not answer within 30 s: $(tail -5 "$dir/spool/qmaster/messages" 2>/dev/null)"
    sleep 0.2
  done
  echo "pidfile=$dir/spool/qmaster/qmaster.pid" >>"$dir/cluster.env"
  as_master "$master" qconf -as "$master" >/dev/null 2>>"$dir/log/init"
  for name in "${node_names[@]}"; do
    as_master "$master" qconf -ah "$name" >/dev/null 2>>"$dir/log/init"
    as_master "$master" qconf -as "$name" >/dev/null 2>>"$dir/log/init"
  done
  # Exec hosts, the queue and the PE.
  for name in "${node_names[@]}"; do
    printf 'hostname %s\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n' \
      "$name" >"$dir/host.$name"
    as_master "$master" qconf -Ae "$dir/host.$name" >/dev/null 2>>"$dir/log/init"
  done
  cat >"$dir/pe" <<PE
pe_name            trainrun
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    \$fill_up
control_slaves     TRUE
job_is_first_task  FALSE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
PE
  as_master "$master" qconf -Ap "$dir/pe" >/dev/null 2>>"$dir/log/init"
  as_master "$master" qconf -sq all.q >/dev/null 2>&1 && as_master "$master" qconf -dq all.q >/dev/null 2>>"$dir/log/init"
  as_master "$master" qconf -sq >"$dir/queue" 2>/dev/null || true
  sed -e "s|^qname .*|qname all.q|" -e "s|^hostlist .*|hostlist ${node_names[*]}|" \
      -e "s|^slots .*|slots $slots|" -e "s|^pe_list .*|pe_list trainrun|" \
      -e "s|^shell .*|shell /bin/sh|" -e "s|^tmpdir .*|tmpdir /tmp|" \
      -e "s|^load_thresholds .*|load_thresholds NONE|" "$dir/queue" >"$dir/queue.all"
  as_master "$master" qconf -Aq "$dir/queue.all" >/dev/null 2>>"$dir/log/init"
  # Schedule at once, not every 15 s (the default), so a job starts within a second or two.
  as_master "$master" qconf -ssconf |
    sed -e "s|^schedule_interval .*|schedule_interval 0:0:1|" \
        -e "s|^flush_submit_sec .*|flush_submit_sec 1|" -e "s|^flush_finish_sec .*|flush_finish_sec 1|" \
        >"$dir/sched"
  as_master "$master" qconf -Msconf "$dir/sched" >/dev/null 2>>"$dir/log/init"

  for name in "${node_names[@]}"; do
    nsenter --net="/run/netns/$name" unshare --uts \
      sh -c "hostname $name && exec /usr/lib/gridengine/sge_execd"
  done
  # Up when every node reports a load.
  deadline=$((SECONDS + 60))
  local up=0
  while ((SECONDS < deadline)); do
    up=$(as_master "$master" qhost 2>/dev/null | awk -v p="$prefix" '$1 ~ "^"p"n" && $4 != "-" {n++} END {print n+0}')
    ((up == nodes)) && break
    sleep 0.5
  done
  if ((up != nodes)); then
    as_master "$master" qhost >&2 || true
    tail -n 20 "$dir/spool/qmaster/messages" "$dir/spool/execd/"*/messages >&2 2>/dev/null || true
    die "only $up of $nodes execd nodes reported within 60 s"
  fi
  cat "$dir/env.sh"
  echo "export TRAINRUN_SGE_MASTER=$master"
  echo "export TRAINRUN_SGE_NODES=$(IFS=,; echo "${node_names[*]}")"
  echo "export TRAINRUN_SGE_DIR=$dir"
}

stop() {
  local dir=$1
  [[ -e $dir/cluster.env ]] || return 0
  local prefix="" bridge="" cell="" line pid
  local -a netns=() pidfiles=()
  while IFS= read -r line; do
    case $line in
      prefix=*) prefix=${line#prefix=} ;;
      bridge=*) bridge=${line#bridge=} ;;
      cell=*) cell=${line#cell=} ;;
      netns=*) netns+=("${line#netns=}") ;;
      pidfile=*) pidfiles+=("${line#pidfile=}") ;;
    esac
  done <"$dir/cluster.env"
  # Clients (every process with this cell in its environment), the qmaster, then whatever runs in
  # a node's namespace (execd, shepherds, the jobs).
  local -a pids=()
  local environ
  if [[ -n $prefix ]]; then
    for environ in $(grep -lzxF "SGE_CELL=$prefix" /proc/[0-9]*/environ 2>/dev/null); do
      pid=${environ#/proc/}
      pid=${pid%/environ}
      [[ $pid -ne $$ && $pid -ne $BASHPID ]] && pids+=("$pid")
    done
  fi
  for line in "${pidfiles[@]}"; do
    [[ -s $line ]] && pids+=("$(<"$line")")
  done
  local deadline=$((SECONDS + 10))
  while :; do
    for ns in "${netns[@]}"; do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do pids+=("$pid"); done
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    local left=""
    for ns in "${netns[@]}"; do left+=$(ip netns pids "$ns" 2>/dev/null); done
    for pid in "${pids[@]}"; do
      [[ -e /proc/$pid && $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] && left+=" $pid"
    done
    [[ -z ${left// /} ]] && break
    ((SECONDS < deadline)) || break
    sleep 0.05
  done
  for ns in "${netns[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  [[ -n $bridge ]] && ip link del "$bridge" 2>/dev/null || true
  [[ -n $cell && $cell == /var/lib/gridengine/trg* ]] && rm -rf "$cell"
  if [[ -n $prefix ]]; then
    (
      flock 9
      local kept
      kept=$(grep -v "# trainrun-sge-test $prefix\$" /etc/hosts || true)
      printf '%s\n' "$kept" >/etc/hosts
    ) 9>"$hosts_lock"
  fi
  rm -f "$dir/cluster.env"
}

run() {
  local nodes=2 slots=2
  if [[ ${1:-} != -- ]]; then nodes=$1; shift; fi
  if [[ ${1:-} != -- ]]; then slots=$1; shift; fi
  [[ ${1:-} == -- ]] || die "usage: cluster.sh run [NODES [SLOTS]] -- COMMAND..."
  shift
  run_dir=$(mktemp -d /tmp/trainrun-sge.XXXXXX)
  trap 'stop "$run_dir"; rm -rf "$run_dir"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local exports
  exports=$(start "$run_dir" "$nodes" "$slots")
  eval "$exports"
  local status=0
  as_master "$TRAINRUN_SGE_MASTER" "$@" || status=$?
  exit "$status"
}

case ${1:-} in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  run) shift; run "$@" ;;
  check) check ;;
  *) die "usage: cluster.sh start DIR [NODES [SLOTS]] | stop DIR | run [NODES [SLOTS]] -- COMMAND... | check" ;;
esac
