#!/usr/bin/env bash
# trainrun through a remote shell (--rsh-agent, mpirun's -mca plm_rsh_agent, TRAINRUN_RSH_AGENT),
# with no sshd anywhere: two network-namespace "pods" reached by a kubectl-exec-style wrapper that
# enters the pod's namespace (`agent POD CMD...` runs CMD there). Checks a checked allreduce on
# 2 pods x 2 slots, a rank killed on pod 2 ending the job with the usual summary and nothing left,
# each spelling of the remote shell, and a pod the wrapper cannot reach (one line naming it).
# Usage: rsh_netns_test.sh TRAINRUN ALLREDUCE_PERF      (root; exit 77 without it)
set -uo pipefail
trainrun=$1 perf=$2
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 (network namespaces)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/trainrun-rsh.XXXXXX")
p=trr$$
client=$p-c
pods=("$p-p1" "$p-p2")
addr=(10.215.1.11 10.215.1.12)
cleanup() {
  for ns in "${pods[@]}" "$client"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

ip netns add "$client"
ip -n "$client" link set lo up
ip -n "$client" link add br0 type bridge
ip -n "$client" addr add 10.215.1.1/24 dev br0
ip -n "$client" link set br0 up
for i in 0 1; do
  ns=${pods[$i]}
  ip netns add "$ns"
  ip -n "$client" link add "vp$i" type veth peer name eth0 netns "$ns"
  ip -n "$client" link set "vp$i" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "${addr[$i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
done
# The wrapper: `agent POD CMD...`, as `kubectl exec -i POD -- CMD...`.
cat >"$work/agent" <<AGENT
#!/bin/sh
pod=\$1; shift
case \$pod in
  ${addr[0]}) ns=${pods[0]} ;;
  ${addr[1]}) ns=${pods[1]} ;;
  *) echo "error: pods \"\$pod\" not found" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" "\$@"
AGENT
chmod +x "$work/agent"
in_client() { timeout 60 ip netns exec "$client" "$@"; }
hosts="${addr[0]}:2,${addr[1]}:2"
pods_empty() {  # no process left in either pod within 5 s
  for _ in $(seq 50); do
    [[ -z $(ip netns pids "${pods[0]}")$(ip netns pids "${pods[1]}") ]] && return 0
    sleep 0.1
  done
  return 1
}

echo "== a checked allreduce on 2 pods x 2 slots, through --rsh-agent"
start=$(date +%s.%N)
out=$(in_client "$trainrun" -H "$hosts" -np 4 --rsh-agent "$work/agent" "$perf" -b 1M -e 1M -n 5 -c 1 2>&1)
rc=$?
echo "$out" | tail -3
((rc == 0)) || fail "the allreduce job exited $rc: $out"
grep -Eq '^\[0\]<stdout>: +1048576 .* 0$' <<<"$out" || fail "no checked 1 MiB row with 0 wrong: $out"
grep -q '4 ranks on 2 hosts started' <<<"$out" || fail "no start line for 4 ranks on 2 hosts: $out"
printf 'took %.2f s\n' "$(echo "$(date +%s.%N) - $start" | bc)"
pods_empty || fail "processes left in the pods: $(ip netns pids "${pods[0]}") $(ip netns pids "${pods[1]}")"

echo "== the same through -mca plm_rsh_agent and TRAINRUN_RSH_AGENT"
W=(sh -c 'echo "rank $TRAINRUN_RANK of $TRAINRUN_SIZE on $(hostname -I | tr -d " ")"')
out=$(in_client "$trainrun" -H "$hosts" -np 4 -mca plm_rsh_agent "$work/agent" "${W[@]}" 2>&1) ||
  fail "-mca plm_rsh_agent: exited $?: $out"
grep -q "rank 3 of 4 on ${addr[1]}" <<<"$out" || fail "-mca plm_rsh_agent: rank 3 not on pod 2: $out"
out=$(in_client env TRAINRUN_RSH_AGENT="$work/agent" "$trainrun" -H "$hosts" -np 4 "${W[@]}" 2>&1) ||
  fail "TRAINRUN_RSH_AGENT: exited $?: $out"
grep -q "rank 2 of 4 on ${addr[1]}" <<<"$out" || fail "TRAINRUN_RSH_AGENT: rank 2 not on pod 2: $out"
out=$(in_client "$trainrun" --dry-run -H "$hosts" --rsh-agent "$work/agent" /bin/true 2>&1)
grep -q "$work/agent ${addr[1]} (remote shell)" <<<"$out" || fail "--dry-run does not say how: $out"

echo "== --sync-dst-dir copies through the remote shell, and the ranks run in the copy"
mkdir -p "$work/src/conf" && echo "lr=0.1" >"$work/src/conf/job.cfg"
# The pods share this machine's disk: both copies land in one DIR (temporary names, then renames).
out=$(in_client "$trainrun" -H "$hosts" -np 4 --rsh-agent "$work/agent" --sync-src-dir "$work/src" \
  --sync-dst-dir "$work/copy" sh -c 'echo "in $(pwd): $(cat conf/job.cfg)"' 2>&1) ||
  fail "--sync-dst-dir: exited $?: $out"
grep -q "\[3\]<stdout>:in $work/copy: lr=0.1" <<<"$out" || fail "--sync-dst-dir: rank 3 not in the copy: $out"
grep -q "synced $work/src to $work/copy on 2 hosts" <<<"$out" || fail "--sync-dst-dir: no summary line: $out"

echo "== a rank killed on pod 2 ends the job with the summary"
start=$(date +%s)
out=$(in_client "$trainrun" -H "$hosts" -np 4 --rsh-agent "$work/agent" \
  sh -c 'if [ "$TRAINRUN_RANK" = 3 ]; then sleep 1; kill -9 $$; fi; exec sleep 60' 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out" | grep -v '^\[' | tail -4
((rc == 137)) || fail "a SIGKILLed rank: exit $rc, not 137: $out"
grep -Eq "rank 3 .*${addr[1]}.*(SIGKILL|signal 9)" <<<"$out" || fail "the summary does not name rank 3 on pod 2: $out"
((took < 15)) || fail "the job took $took s to end"
pods_empty || fail "processes left in the pods after the failure"

echo "== a pod the wrapper cannot reach"
out=$(in_client "$trainrun" -H "${addr[0]}:1,10.215.1.99:1" -np 2 --rsh-agent "$work/agent" /bin/true 2>&1)
rc=$?
echo "$out" | tail -2
((rc == 2)) || fail "an unreachable pod: exit $rc, not 2 (a bad host)"
grep -q '10.215.1.99' <<<"$out" || fail "the error does not name the pod: $out"
grep -q 'pods "10.215.1.99" not found' <<<"$out" || fail "the error does not quote the wrapper: $out"
pods_empty || fail "processes left in the pods after the unreachable pod"

echo "rsh: $failures failures"
((failures == 0))
