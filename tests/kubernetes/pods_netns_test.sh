#!/usr/bin/env bash
# A Kubeflow PyTorchJob's pods, faked: two network namespaces, each running `trainrun COMMAND` with
# no flags and only the variables the training operator gives a pod (torchrun's PET_* in one run,
# the older MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK in the other), in a clean environment.
# Each run is a checked allreduce across both pods, and both pods end with status 0. Then: pods
# with unequal PET_NPROC_PER_NODE (2 and 1: 3 ranks, numbered by pod), whose ranks see
# PET_MASTER_PORT as MASTER_PORT and rank 0 can listen there (PyTorch's TCPStore does). An elastic
# PyTorchJob's PET_NNODES=1:2: both pods start at once; one pod alone starts after the last call.
# Usage: pods_netns_test.sh TRAINRUN ALLREDUCE_PERF      (root; exit 77 without it)
set -uo pipefail
trainrun=$1 perf=$2
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 (network namespaces)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/trainrun-pods.XXXXXX")
p=trk$$
pods=("$p-p0" "$p-p1")
addr=(10.217.1.10 10.217.1.11)
cleanup() {
  for ns in "${pods[@]}" "$p-br"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

ip netns add "$p-br"
ip -n "$p-br" link add br0 type bridge
ip -n "$p-br" link set br0 up
for i in 0 1; do
  ns=${pods[$i]}
  ip netns add "$ns"
  ip -n "$p-br" link add "vp$i" type veth peer name eth0 netns "$ns"
  ip -n "$p-br" link set "vp$i" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "${addr[$i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
done

# pods NAME VARIABLES-OF-POD-0 -- VARIABLES-OF-POD-1: both pods at once, each `trainrun perf ...`
# (or `trainrun "${pod_command[@]}"` when that is set) in `env -i` with only PATH, HOME and its
# variables; their outputs in NAME.0 and NAME.1.
pod_command=()
pods() {
  local name=$1
  shift
  local -a vars0=() vars1=()
  while [[ $1 != -- ]]; do vars0+=("$1"); shift; done
  shift
  vars1=("$@")
  local -a pids=()
  for i in 0 1; do
    local -n vars=vars$i
    local -a command=("$perf" -b 1M -e 1M -n 5 -c 1)
    ((${#pod_command[@]})) && command=("${pod_command[@]}")
    timeout 90 ip netns exec "${pods[$i]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
      "${vars[@]}" "$trainrun" "${command[@]}" >"$work/$name.$i" 2>&1 &
    pids+=($!)
  done
  local status=0
  for i in 0 1; do
    wait "${pids[$i]}" || { status=$?; fail "$name: pod $i exited $status: $(cat "$work/$name.$i")"; }
  done
  if ((${#pod_command[@]} == 0)); then
    grep -Eq '^\[0\]<stdout>: +1048576 .* 0$' "$work/$name.0" ||
      fail "$name: pod 0 printed no checked 1 MiB row with 0 wrong: $(cat "$work/$name.0")"
  fi
  tail -2 "$work/$name.0"
}

echo "== torchrun's PET_* variables (a PyTorchJob today): 2 pods x 2 ranks"
pods pet PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=0 PET_MASTER_ADDR="${addr[0]}" \
  PET_MASTER_PORT=23456 -- \
  PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=1 PET_MASTER_ADDR="${addr[0]}" PET_MASTER_PORT=23456
grep -q '4 ranks on 2 hosts' "$work/pet.0" || fail "PET_*: not 4 ranks on 2 hosts: $(cat "$work/pet.0")"

echo "== the operator's MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK: 2 pods x 1 rank"
pods operator MASTER_ADDR="${addr[0]}" MASTER_PORT=23457 WORLD_SIZE=2 RANK=0 -- \
  MASTER_ADDR="${addr[0]}" MASTER_PORT=23457 WORLD_SIZE=2 RANK=1
grep -q '2 ranks on 2 hosts' "$work/operator.0" ||
  fail "operator variables: not 2 ranks on 2 hosts: $(cat "$work/operator.0")"

echo "== unequal PET_NPROC_PER_NODE: pod 0 runs 2 ranks, pod 1 runs 1"
pods unequal PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=0 PET_MASTER_ADDR="${addr[0]}" \
  PET_MASTER_PORT=23458 -- \
  PET_NNODES=2 PET_NPROC_PER_NODE=1 PET_NODE_RANK=1 PET_MASTER_ADDR="${addr[0]}" PET_MASTER_PORT=23458
grep -q '3 ranks on 2 hosts' "$work/unequal.0" ||
  fail "unequal: not 3 ranks on 2 hosts: $(cat "$work/unequal.0")"

echo "== MASTER_PORT is PET_MASTER_PORT, rank 0 listens there; ranks numbered across unequal pods"
# Each rank says its place and MASTER_PORT; rank 0 first listens on MASTER_PORT at MASTER_ADDR
# with SO_REUSEADDR, as PyTorch's TCPStore does (node 0's join port must have made way for it).
pod_command=(python3 -c '
import os, socket
e = os.environ
if e["RANK"] == "0":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((e["MASTER_ADDR"], int(e["MASTER_PORT"])))
    s.listen()
print("rank", e["RANK"], "local", e["LOCAL_RANK"], "of", e["LOCAL_WORLD_SIZE"], "world",
      e["WORLD_SIZE"], "node", e["GROUP_RANK"], "port", e["MASTER_PORT"])
')
pods port PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=0 PET_MASTER_ADDR="${addr[0]}" \
  PET_MASTER_PORT=23459 -- \
  PET_NNODES=2 PET_NPROC_PER_NODE=1 PET_NODE_RANK=1 PET_MASTER_ADDR="${addr[0]}" PET_MASTER_PORT=23459
for line in '[0]<stdout>:rank 0 local 0 of 2 world 3 node 0 port 23459' \
            '[1]<stdout>:rank 1 local 1 of 2 world 3 node 0 port 23459' \
            '[2]<stdout>:rank 2 local 0 of 1 world 3 node 1 port 23459'; do
  grep -qxF "$line" "$work/port.0" || fail "port: no line '$line': $(cat "$work/port.0")"
done
pod_command=()

echo "== an elastic PyTorchJob (PET_NNODES=1:2): both pods join, so the job starts at once"
start=$(date +%s.%N)
pods elastic PET_NNODES=1:2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=0 PET_MASTER_ADDR="${addr[0]}" \
  PET_MASTER_PORT=23460 -- \
  PET_NNODES=1:2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=1 PET_MASTER_ADDR="${addr[0]}" PET_MASTER_PORT=23460
grep -q '4 ranks on 2 hosts' "$work/elastic.0" ||
  fail "PET_NNODES=1:2: not 4 ranks on 2 hosts: $(cat "$work/elastic.0")"
# Its last call (30 s by default) is not waited for once every node has joined.
awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { exit !(e - s < 20) }' ||
  fail "PET_NNODES=1:2 with both pods waited for the last call"

echo "== PET_NNODES=1:2 with one pod: it starts alone after --rdzv-last-call, rank 0 gets the port"
# The join port was also MASTER_PORT: node 0 closed it when it started without pod 1.
timeout 60 ip netns exec "${pods[0]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  PET_NNODES=1:2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=0 PET_MASTER_ADDR="${addr[0]}" \
  PET_MASTER_PORT=23461 "$trainrun" --rdzv-last-call 1 python3 -c '
import os, socket
e = os.environ
if e["RANK"] == "0":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((e["MASTER_ADDR"], int(e["MASTER_PORT"])))
    s.listen()
print("rank", e["RANK"], "world", e["WORLD_SIZE"], "port", e["MASTER_PORT"])
' >"$work/alone.0" 2>&1 || fail "PET_NNODES=1:2 alone exited $?: $(cat "$work/alone.0")"
for line in '[0]<stdout>:rank 0 world 2 port 23461' '[1]<stdout>:rank 1 world 2 port 23461'; do
  grep -qxF "$line" "$work/alone.0" || fail "alone: no line '$line': $(cat "$work/alone.0")"
done
grep -qF '1 of --nnodes 1:2 nodes joined; starting the job with them' "$work/alone.0" ||
  fail "alone: no line saying it started with 1 node: $(cat "$work/alone.0")"
tail -2 "$work/alone.0"

echo "pods: $failures failures"
((failures == 0))
