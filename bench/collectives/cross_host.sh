#!/usr/bin/env bash
# Allreduce across hosts: N network-namespace "hosts" on this machine, each behind its own link to
# a router namespace, every link shaped like a NIC by tc (tbf at a rate; netem with a rate and a
# delay when a delay is asked for and the kernel has netem), and
# trainrun beside Open MPI over TCP and torch.distributed on gloo over the same hosts, alternating
# (ours, Open MPI, gloo, ours, ...). Prints per layout (hosts x ranks per host) and size the
# medians over the rounds in nccl-tests' columns, the link bound, and the ratios.
#
#   bench/collectives/cross_host.sh [-r ROUNDS] [-l "2x1 2x2 4x1"] [-b MIN] [-e MAX] [-R MBIT]
#                                   [-d US] [-p "ours mpi gloo"] [-n ITERS] [-w WARMUP] [-T MS]
#                                   [-B BUILD_DIR] [-x NAME=VALUE]... [-P PREFIX] [-k]
#
# -r rounds (default 3), -l layouts HxL (H hosts, L ranks on each; default "2x1 2x2 4x1"),
# -b/-e smallest/largest size in bytes, K/M suffixes (default 4K and 64M, doubling),
# -R link rate in Mbit/s each way (default 3000), -d added one-way latency host to host in µs
# (default 0; with netem half of it on each link's egress, both ways; on a kernel without netem,
# such as this machine's, the router holds every packet it forwards that long in user space,
# bench/collectives/peers/nfq_delay.c through an iptables NFQUEUE rule, and the script prints the
# one-way latency that adds, measured: the set delay plus ~13 µs for the trip through user space), -p which to run (default "ours mpi
# gloo"), -n/-w timed and warm-up iterations per size (default 5 and 2), -T at least this many ms
# timed per size (default 200), -B the build directory with bin/trainrun and bin/allreduce_perf
# (default build/), -x NAME=VALUE an environment variable for our ranks (repeatable; e.g.
# -x TRAINRUN_SOCKETS_PER_PEER=2), -P a command prefix for each of our ranks (words; e.g.
# "/usr/bin/time -f %U+%S" for their CPU seconds on stderr, which the run keeps with -k), -k keep
# the namespaces and work files after the run (`cross_host.sh -c PREFIX` removes the namespaces).
#
# Why 3 Gbit/s: on this 2-core machine the CPUs, not the shaping, are the limit above ~4-5 Gbit/s
# each way (iperf3 --bidir between two such hosts: 4.8 Gbit/s each way on a 10 Gbit/s shaping), so
# a faster link would measure the CPUs. The bound printed is the algbw of a perfect allreduce that
# sends each byte across the slowest link as often as an allreduce must: each host sends and
# receives 2(H-1)/H of the buffer, so bound = rate * H / (2(H-1)) (the rate itself at 2 hosts). A
# TCP stream carries at most 1448 payload bytes per 1514-byte frame: 95.6% of the rate. With
# iperf3, each layout's hosts also send to the next at once (a ring's traffic) for 2 s, and the
# slowest host's goodput gives the machine's bound, %mach (ours algbw / that bound): on these 2
# cores, which forward every packet through the router namespace, it is what limits 4 hosts.
#
# trainrun runs in per-node mode (one `trainrun --nnodes H --node-rank i` per namespace, node 0's
# address as the rendezvous endpoint; no sshd needed). Open MPI's mpirun runs in the router
# namespace with `--mca btl tcp,self --mca pml ob1`, reaching the hosts through a small
# `ip netns exec` wrapper as its rsh agent. torch.distributed: one python per rank, started in its
# host's namespace with MASTER_ADDR = host 1. All three run float32 sum, same sizes and iterations;
# time is the mean per operation on the slowest rank, in µs.
#
# Needs root, iproute2 (ip, tc; for -d netem, or iptables and cc), Open MPI (mpicc, mpirun:
# ../shared/bench/peers.sh setup, or apt-get install openmpi-bin libopenmpi-dev), /usr/bin/python3
# with torch (python3-torch). iperf3 (apt-get install iperf3), when present, measures each layout's
# TCP goodput between host 1 and host 2 once, for reference. Every namespace and process it made is
# removed at the end, also on Ctrl-C or an error.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rounds=3 layouts="2x1 2x2 4x1" min=4K max=64M rate=3000 delay=0 peers="ours mpi gloo"
iters=5 warmup=2 min_ms=200 build=$root/build keep=0 ours_env=() rank_prefix=

die() {
  echo "cross_host.sh: $*" >&2
  exit 2
}

bytes() {  # 4K -> 4096
  local v=$1
  case "$v" in
    *[kK]) echo $((${v%?} << 10)) ;;
    *[mM]) echo $((${v%?} << 20)) ;;
    *[gG]) echo $((${v%?} << 30)) ;;
    *) echo "$v" ;;
  esac
}

# Deletes the namespaces named PREFIX* (the router's deletion takes every veth with it) after
# killing what runs in them.
remove_namespaces() {
  local prefix=$1 ns pids
  for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -TERM $pids 2>/dev/null || true
  done
  sleep 0.2
  for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

while getopts "r:l:b:e:R:d:p:n:w:T:B:x:P:kc:h" opt; do
  case "$opt" in
    r) rounds=$OPTARG ;;
    l) layouts=$OPTARG ;;
    b) min=$OPTARG ;;
    e) max=$OPTARG ;;
    R) rate=$OPTARG ;;
    d) delay=$OPTARG ;;
    p) peers=$OPTARG ;;
    n) iters=$OPTARG ;;
    w) warmup=$OPTARG ;;
    T) min_ms=$OPTARG ;;
    B) build=$(cd "$OPTARG" && pwd) ;;
    x) [[ $OPTARG == *=* ]] || die "-x wants NAME=VALUE, not '$OPTARG'"; ours_env+=("$OPTARG") ;;
    P) rank_prefix=$OPTARG ;;
    k) keep=1 ;;
    c) remove_namespaces "$OPTARG"; exit 0 ;;
    *) sed -n '2,42p' "$0"; exit 2 ;;
  esac
done
min=$(bytes "$min") max=$(bytes "$max")
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, tc)"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "-r wants a positive number of rounds, not '$rounds'"
[[ $rate =~ ^[1-9][0-9]*$ ]] || die "-R wants the link rate in Mbit/s, not '$rate'"
[[ $delay =~ ^[0-9]+$ ]] || die "-d wants the added latency in whole µs, not '$delay'"
[[ $min =~ ^[0-9]+$ && $max =~ ^[0-9]+$ && $min -ge 4 && $max -ge $min ]] ||
  die "-b/-e want sizes from 4 bytes up, smallest first"
max_hosts=0
for l in $layouts; do
  [[ $l =~ ^([2-9])x([1-8])$ ]] || die "layout '$l' is not HxL with H in 2..9 hosts and L in 1..8 ranks"
  ((BASH_REMATCH[1] > max_hosts)) && max_hosts=${BASH_REMATCH[1]}
done
for p in $peers; do
  [[ $p == ours || $p == mpi || $p == gloo ]] || die "unknown peer '$p' (ours, mpi, gloo)"
done
for program in ip tc; do command -v $program >/dev/null || die "needs $program (iproute2)"; done
if [[ " $peers " == *" ours "* ]]; then
  for f in "$build/bin/trainrun" "$build/bin/allreduce_perf"; do
    [[ -x $f ]] || die "$f is missing; build it (cmake --build build --target trainrun allreduce_perf)"
  done
fi
if [[ " $peers " == *" mpi "* ]]; then
  command -v mpicc >/dev/null && command -v mpirun >/dev/null ||
    die "Open MPI is not installed (../shared/bench/peers.sh setup, or apt-get install openmpi-bin libopenmpi-dev)"
fi
if [[ " $peers " == *" gloo "* ]]; then
  /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || die "/usr/bin/python3 has no torch (apt-get install python3-torch)"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/cross-host-XXXXXX)
# A prefix no other run uses: xh<K>, K free among 1..250 (`ip netns add` of the router fails
# when another run took it meanwhile).
prefix=
for k in $(shuf -i 1-250); do
  ip netns add "xh${k}r" 2>/dev/null || continue
  prefix=xh$k net=10.215.$k
  break
done
[[ -n $prefix ]] || die "no free namespace prefix xh<K>r (K in 1..250)"
cleanup() {
  trap - EXIT INT TERM
  if ((keep)); then
    echo "# kept namespaces ${prefix}r, ${prefix}h1.. (remove: $0 -c $prefix); work files in $work" >&2
  else
    remove_namespaces "$prefix"
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'echo "cross_host.sh: interrupted" >&2; exit 130' INT TERM

# Host i (1-based): namespace ${prefix}h<i>, eth0 at $net.(4i+2)/30; the router's end r<i> at
# $net.(4i+1), the host's default route. Each end's egress is shaped: rate, and half the delay.
router=${prefix}r
ip netns exec "$router" sysctl -q -w net.ipv4.ip_forward=1
ip -n "$router" link set lo up
# The delay: netem on every link where the kernel has it; else (this machine's kernel has no
# sch_netem) every packet the router forwards is held by nfq_delay (an iptables NFQUEUE rule in the
# router's FORWARD chain), and the latency it adds is measured, as it is the set delay plus the
# queue's own trip through user space.
delay_how=
if ((delay > 0)); then
  ip -n "$router" link add probe0 type veth peer name probe1
  if ip netns exec "$router" tc qdisc add dev probe0 root netem delay 1us 2>/dev/null; then
    delay_how=netem
  else
    command -v iptables >/dev/null ||
      die "-d needs tc's netem qdisc, which this kernel lacks (no sch_netem), or iptables for the NFQUEUE delayer (apt-get install iptables)"
    cc -O2 "$here/peers/nfq_delay.c" -o "$work/nfq_delay"
    delay_how=nfqueue
  fi
  ip -n "$router" link del probe0
fi
shape() {  # NS DEV
  if [[ $delay_how == netem ]]; then
    ip netns exec "$1" tc qdisc add dev "$2" root netem rate "${rate}mbit" delay "$((delay / 2))us" limit 100000
  else
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${rate}mbit" burst 128kb latency 10ms
  fi
}
host_addr() { echo "$net.$((4 * $1 + 2))"; }
for ((i = 1; i <= max_hosts; i++)); do
  ns=${prefix}h$i
  ip netns add "$ns"
  ip link add "r$i" netns "$router" type veth peer name eth0 netns "$ns"
  ip -n "$router" addr add "$net.$((4 * i + 1))/30" dev "r$i"
  ip -n "$router" link set "r$i" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$(host_addr "$i")/30" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via "$net.$((4 * i + 1))"
  shape "$router" "r$i"
  shape "$ns" eth0
done

# udp_rtt: the median round trip of 2000 one-byte UDP pings from host 1 to host 2, in µs.
udp_rtt() {
  ip netns exec "${prefix}h2" /usr/bin/python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 9799))
for _ in range(2100):
    d, a = s.recvfrom(64); s.sendto(d, a)' &
  local server=$!
  sleep 0.3
  ip netns exec "${prefix}h1" /usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); r = []
for i in range(2100):
    t = time.perf_counter(); s.sendto(b"x", (sys.argv[1], 9799)); s.recvfrom(64)
    r.append(time.perf_counter() - t)
r = sorted(r[100:]); print("%.1f" % (r[len(r) // 2] * 1e6))' "$(host_addr 2)"
  wait "$server" 2>/dev/null || true
}
delay_note=
if [[ $delay_how == nfqueue ]]; then
  rtt0=$(udp_rtt)
  ip netns exec "$router" iptables -A FORWARD -j NFQUEUE --queue-num 7 --queue-bypass
  ip netns exec "$router" "$work/nfq_delay" 7 "$delay" 2>"$work/nfq_delay.log" &
  delay_pid=$!
  sleep 0.3
  rtt1=$(udp_rtt)
  delay_note="nfq_delay holding each forwarded packet ${delay} µs: UDP round trip host 1 to 2 ${rtt0} µs without, ${rtt1} µs with, so +$(awk -v a="$rtt0" -v b="$rtt1" 'BEGIN { printf "%.1f", (b - a) / 2 }') µs one-way"
fi

# Open MPI: the probe, and an rsh agent that enters the namespace of the host (an address) named.
if [[ " $peers " == *" mpi "* ]]; then
  mpicc -O2 "$here/peers/mpi_allreduce_sizes.c" -o "$work/mpi_allreduce_sizes"
  cat >"$work/netns_agent" <<EOF
#!/bin/sh
# mpirun's rsh agent for cross_host.sh: netns_agent HOST COMMAND... runs COMMAND in HOST's namespace.
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
ns=${prefix}h\$(( (\${host##*.} - 2) / 4 ))
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
  chmod +x "$work/netns_agent"
fi

token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=29500
# run ours|mpi|gloo H L OUTFILE: one table, data rows only (size count type redop time algbw busbw
# #wrong). Every process it starts ends before it returns.
run() {
  local peer=$1 hosts=$2 per=$3 out=$4 i j pids=() status=0
  local head log=$out.log
  head=$(host_addr 1)
  port=$((port + 1))
  : >"$log"
  case "$peer" in
    ours)
      for ((i = hosts; i >= 1; i--)); do
        local cmd=(ip netns exec "${prefix}h$i" env TRAINRUN_NETWORK_INTERFACE=eth0 "${ours_env[@]}"
          "$build/bin/trainrun" -q --nnodes "$hosts" --node-rank "$((i - 1))"
          --rdzv-endpoint "$head:$port" --nproc-per-node "$per" --rdzv-token "$token" --no-tag-output
          $rank_prefix "$build/bin/allreduce_perf" -b "$min" -e "$max" -f 2 -n "$iters" -w "$warmup" -T "$min_ms" -c 1)
        if ((i == 1)); then
          "${cmd[@]}" >"$out.raw" 2>>"$log" || status=$?
        else
          "${cmd[@]}" >/dev/null 2>>"$log" &
          pids+=($!)
        fi
      done ;;
    mpi)
      local hostfile=$work/hosts.$hosts
      : >"$hostfile"
      for ((i = 1; i <= hosts; i++)); do echo "$(host_addr "$i") slots=$per" >>"$hostfile"; done
      ip netns exec "$router" mpirun -np $((hosts * per)) --hostfile "$hostfile" --bind-to none \
        --mca plm_rsh_agent "$work/netns_agent" --mca plm_rsh_no_tree_spawn 1 \
        --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include "$net.0/24" \
        --mca oob_tcp_if_include "$net.0/24" \
        "$work/mpi_allreduce_sizes" "$min" "$max" 2 "$iters" "$warmup" "$min_ms" \
        >"$out.raw" 2>>"$log" || status=$? ;;
    gloo)
      for ((i = hosts; i >= 1; i--)); do
        for ((j = per - 1; j >= 0; j--)); do
          local rank=$(((i - 1) * per + j))
          local cmd=(ip netns exec "${prefix}h$i" env MASTER_ADDR="$head" MASTER_PORT="$port"
            RANK="$rank" WORLD_SIZE="$((hosts * per))" GLOO_SOCKET_IFNAME=eth0
            /usr/bin/python3 "$here/peers/torch_allreduce_sizes.py" "$min" "$max" 2 "$iters" "$warmup" "$min_ms")
          if ((rank == 0)); then
            "${cmd[@]}" >"$out.raw" 2>>"$log" || status=$?
          else
            "${cmd[@]}" >/dev/null 2>>"$log" &
            pids+=($!)
          fi
        done
      done ;;
  esac
  for i in "${pids[@]}"; do wait "$i" || status=$?; done
  grep -v '^ *#' "$out.raw" | awk 'NF == 8' >"$out"
  if ((status != 0)) || [[ ! -s $out ]]; then
    echo "cross_host.sh: $peer at ${hosts}x$per failed (status $status); its output:" >&2
    cat "$out.raw" "$log" >&2
    exit 1
  fi
  grep -q '^# trainrun collectives over' "$out.raw" && grep '^# trainrun collectives over' "$out.raw" >"$out.transport"
  return 0
}

echo "# $(date -u +%FT%TZ) $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg);" \
  "links ${rate} Mbit/s each way ($( [[ $delay_how == netem ]] && echo "netem rate, +${delay} µs one-way host to host" || echo "tbf, burst 128 KiB"))"
[[ -n $delay_note ]] && echo "# added latency: $delay_note"
echo "# the CPUs of this machine, not the shaping, limit above ~4-5 Gbit/s each way: hence ${rate} Mbit/s"
echo "# $rounds alternating rounds ($peers), $iters iterations (+$warmup warm-up) per size and at least $min_ms ms"
echo "# ours: trainrun per-node mode, one trainrun per namespace${ours_env[*]:+, with ${ours_env[*]}}"
if command -v iperf3 >/dev/null; then
  ip netns exec "${prefix}h2" iperf3 -s -1 -D -p 5201 >/dev/null 2>&1 && sleep 0.3
  gbit=$(ip netns exec "${prefix}h1" iperf3 -c "$(host_addr 2)" -p 5201 -t 2 --bidir -J 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; e=json.load(sys.stdin)["end"]; print("%.2f / %.2f" % (e["sum_sent"]["bits_per_second"]/1e9, e["sum_received_bidir_reverse"]["bits_per_second"]/1e9))' 2>/dev/null || echo "?")
  echo "# iperf3 --bidir host 1 <-> host 2: $gbit Gbit/s each way (TCP goodput)"
fi
# ring_goodput H: every one of hosts 1..H sends to the next (H to 1) at once for 2 s, the traffic
# pattern of a ring allreduce; prints the smallest host's goodput in Gbit/s. This is what the links
# and this machine's CPUs (which forward every packet through the router namespace) carry together:
# the machine's bound for the layout, beside the links' own.
declare -A ring_gbit=()
ring_goodput() {
  local h=$1 i next pids=() min=
  for ((i = 1; i <= h; i++)); do
    ip netns exec "${prefix}h$i" iperf3 -s -1 -D -p $((5300 + i)) >/dev/null 2>&1
  done
  sleep 0.3
  for ((i = 1; i <= h; i++)); do
    next=$((i % h + 1))
    ip netns exec "${prefix}h$i" iperf3 -c "$(host_addr "$next")" -p $((5300 + next)) -t 2 -J \
      >"$work/ring.$h.$i.json" 2>/dev/null &
    pids+=($!)
  done
  wait "${pids[@]}" 2>/dev/null || true
  for ((i = 1; i <= h; i++)); do
    /usr/bin/python3 -c 'import json,sys; print("%.2f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/1e9))' \
      "$work/ring.$h.$i.json" 2>/dev/null
  done | sort -n | head -1
}
if command -v iperf3 >/dev/null; then
  for l in $layouts; do
    h=${l%x*}
    [[ -n ${ring_gbit[$h]:-} ]] && continue
    ring_gbit[$h]=$(ring_goodput "$h")
    echo "# iperf3, $h hosts each sending to the next at once (a ring's pattern): ${ring_gbit[$h]:-?} Gbit/s per host (the slowest)"
  done
fi
for ((r = 1; r <= rounds; r++)); do
  for l in $layouts; do
    for p in $peers; do
      run "$p" "${l%x*}" "${l#*x}" "$work/$p.$l.$r"
    done
  done
done

# Median of the times per size; algbw and busbw from the median time; #wrong the largest.
for l in $layouts; do
  hosts=${l%x*} per=${l#*x}
  echo
  echo "# ${hosts} hosts x ${per} ranks ($((hosts * per)) ranks), links ${rate} Mbit/s$( ((delay > 0)) && echo " +${delay} µs"):" \
    "median of $rounds rounds; time in µs, algbw/busbw in GB/s;" \
    "bound = algbw of a perfect allreduce over these links; %bound = ours algbw / bound"
  if [[ -n ${ring_gbit[$hosts]:-} ]]; then
    echo "# machine bound: the same allreduce at the ring goodput measured above (${ring_gbit[$hosts]} Gbit/s per host):" \
      "$(awk -v g="${ring_gbit[$hosts]}" -v h="$hosts" 'BEGIN { printf "%.3f GB/s algbw", g / 8 * h / (2 * (h - 1)) }')"
  fi
  [[ -f $work/ours.$l.1.transport ]] && sed 's/^# /#   /' "$work/ours.$l.1.transport"
  printf "# %10s |" size
  for p in $peers; do printf " %-5s %10s %7s %7s %6s |" "$p" time algbw busbw '#wrong'; done
  printf " %7s %6s %6s" bound '%bound' '%mach'
  for p in $peers; do [[ $p != ours ]] && printf " %9s" "ours/$p"; done
  echo
  for p in $peers; do cat "$work/$p.$l".[0-9]* 2>/dev/null | sed "s|^|$p |"; done | grep -v '^[a-z]* *$' |
    awk -v hosts="$hosts" -v n="$((hosts * per))" -v rate="$rate" -v peers="$peers" -v ring="${ring_gbit[$hosts]:-0}" '
      function median(list,   a, k, t, i, j) {
        k = split(list, a, " ")
        for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
      }
      NF == 9 {
        key = $1 SUBSEP $2
        times[key] = times[key] " " $6
        if ($9 > wrong[key]) wrong[key] = $9
        if (!($2 in seen)) { seen[$2] = 1; order[++m] = $2 }
      }
      END {
        np = split(peers, p, " ")
        bound = rate * 1e6 / 8 / 1e9 * hosts / (2 * (hosts - 1))
        for (i = 1; i <= m; i++) {
          s = order[i]
          printf "%12d |", s
          for (q = 1; q <= np; q++) {
            t[q] = median(times[p[q] SUBSEP s]); a = s / t[q] / 1e3
            printf " %-5s %10.1f %7.3f %7.3f %6d |", "", t[q], a, a * 2 * (n - 1) / n, wrong[p[q] SUBSEP s]
          }
          if (p[1] == "ours") {
            printf " %7.3f %5.1f%%", bound, 100 * s / t[1] / 1e3 / bound
            mach = ring / 8 * hosts / (2 * (hosts - 1))
            if (mach > 0) printf " %5.0f%%", 100 * s / t[1] / 1e3 / mach; else printf " %6s", "-"
            for (q = 2; q <= np; q++) printf " %9.2f", t[1] / t[q]
          } else {
            printf " %7.3f %6s %6s", bound, "-", "-"
          }
          printf "\n"
        }
      }'
done
if [[ $delay_how == nfqueue ]]; then
  kill -TERM "$delay_pid" 2>/dev/null || true
  sleep 0.3
  echo "# $(tail -1 "$work/nfq_delay.log")"
fi
