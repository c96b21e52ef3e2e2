#!/usr/bin/env bash
# Every spelling of trainrun's compatibility table (`trainrun --help`'s Compatibility block,
# cli/src/foreign_flags.cc) runs a real job here and shows its meaning, or is refused in one line
# with exit 2; a spelling without a case below fails the test. Then: no single-dash word prints
# help or exits 0 unless it is a flag trainrun knows; two names of this machine are one host; a
# host that cannot be reached exits 2.
# Usage: spellings_test.sh TRAINRUN
set -uo pipefail
trainrun=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/trainrun-spellings.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
printf 'localhost slots=2\n' >hosts.txt
mkdir -p mod && printf 'import os\nprint("module rank", os.environ["TRAINRUN_RANK"])\n' >mod/hello_mod.py
# The worker: says what it was given.
W=(sh -c 'echo "rank=$TRAINRUN_RANK size=$TRAINRUN_SIZE wd=$(pwd) timeout=${TRAINRUN_TIMEOUT-}"')

declare -A tested=()
prefix=()  # a command trainrun runs under (taskset)
# job SPELLING PATTERN ARGS...: a job with ARGS exits 0 and its output (stdout and stderr) matches
# the extended regex PATTERN.
job() {
  local spelling=$1 pattern=$2
  shift 2
  tested[$spelling]=1
  local out rc
  out=$(timeout 60 "${prefix[@]}" "$trainrun" "$@" 2>&1)
  rc=$?
  if ((rc != 0)); then
    fail "$spelling: trainrun $* exited $rc: $out"
  elif ! grep -Ezq -- "$pattern" <<<"$out"; then  # -z: the pattern may span lines
    fail "$spelling: trainrun $* printed no /$pattern/: $out"
  fi
}
# refused SPELLING PATTERN ARGS...: trainrun with ARGS exits 2 with one line matching PATTERN.
refused() {
  local spelling=$1 pattern=$2
  shift 2
  tested[$spelling]=1
  local out rc
  out=$(timeout 60 "$trainrun" "$@" 2>&1)
  rc=$?
  if ((rc != 2)); then
    fail "$spelling: trainrun $* exited $rc, not 2: $out"
  elif [[ $(wc -l <<<"$out") -ne 1 ]] || ! grep -Eq -- "$pattern" <<<"$out"; then
    fail "$spelling: trainrun $* did not refuse in one line matching /$pattern/: $out"
  fi
}
two='rank=1 size=2'

# mpirun
job -np "$two" -np 2 "${W[@]}"
job --np "$two" --np 2 "${W[@]}"
job -c "$two" -c 2 "${W[@]}"
for s in -host --host -hosts; do job "$s" "$two" "$s" localhost:2 "${W[@]}"; done
for s in -hostfile -machinefile --machinefile --default-hostfile; do
  job "$s" "$two" "$s" hosts.txt "${W[@]}"
done
job -tag-output '\[1\]<stdout>:rank=1' -np 2 -tag-output "${W[@]}"
job -timestamp-output '[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8}.*rank=0' -np 1 -timestamp-output "${W[@]}"
job -prefix-timestamp '[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8}.*rank=0' -np 1 -prefix-timestamp "${W[@]}"
tested[-quiet]=1
out=$("$trainrun" -np 2 -quiet "${W[@]}" 2>&1) || fail "-quiet: exited $?: $out"
grep -q 'started in' <<<"$out" && fail "-quiet: the start line was printed: $out"
job -verbose 'trainrun: debug:' -np 1 -verbose "${W[@]}"
for s in -wdir -wd --wd; do job "$s" 'rank=0 .*wd=/tmp ' "$s" /tmp -np 1 "${W[@]}"; done
job -bind-to 'rank 0 on .* bound to core' -np 1 -bind-to core --report-bindings "${W[@]}"
job -report-bindings 'rank 0 on .* bound to core' -np 1 --bind-to core -report-bindings "${W[@]}"
job -map-by "$two" -np 2 -map-by slot "${W[@]}"
job -byslot "$two" -np 2 -byslot "${W[@]}"
job -display-map 'localhost.*(.|\n)*rank=1 size=2' -np 2 -display-map "${W[@]}"
tested[-oversubscribe]=1
out=$("$trainrun" -np 64 -oversubscribe /bin/true 2>&1) || fail "-oversubscribe: exited $?: $out"
grep -q 'oversubscribe' <<<"$out" && fail "-oversubscribe: still warned: $out"
job -output-filename "$two" -np 2 -output-filename out "${W[@]}"
[[ -s out/rank.1/stdout ]] || fail "-output-filename: out/rank.1/stdout was not written"
for s in --allow-run-as-root -allow-run-as-root; do job "$s" "$two" "$s" -np 2 "${W[@]}"; done
cat >agent.sh <<'AGENT'
#!/bin/sh
exit 3
AGENT
chmod +x agent.sh
for s in -mca --mca -gmca --gmca; do
  job "$s" "./agent.sh farhost \(remote shell\)" "$s" plm_rsh_agent ./agent.sh --dry-run -H farhost:1 "${W[@]}"
done
job -mca "$two" -mca btl_tcp_if_include lo -np 2 "${W[@]}"
job -mca "Open MPI's parameter changes nothing(.|\n)*$two" -mca pml ob1 -np 2 "${W[@]}"
refused -npernode 'mpirun.*-H host1:N' -npernode 2 "${W[@]}"
refused --npernode 'mpirun.*-H host1:N' --npernode 2 "${W[@]}"
refused -N 'mpirun.*-H host1:N' -N 2 "${W[@]}"
refused -nolocal 'leave this host out' -nolocal "${W[@]}"
refused --nolocal 'leave this host out' --nolocal "${W[@]}"
refused -bynode 'round-robin' -bynode "${W[@]}"
refused -prefix 'remote-trainrun' -prefix /opt/openmpi "${W[@]}"
refused --prefix 'remote-trainrun' --prefix /opt/openmpi "${W[@]}"

# torchrun
job --standalone "$two" --standalone --nproc-per-node 2 "${W[@]}"
refused --standalone 'one-node job' --standalone --nnodes 2 --node-rank 0 "${W[@]}"
job -m '\]<stdout>:module rank 1' -m --nproc-per-node 2 -x PYTHONPATH=mod hello_mod
job --module '\]<stdout>:module rank 1' --module -np 2 -x PYTHONPATH=mod hello_mod
job --nproc-per-node "$two" --nproc-per-node 2 "${W[@]}"
job --nproc_per_node "$two" --nproc_per_node 2 "${W[@]}"
if [[ ! -e /dev/nvidia0 ]]; then  # one usable CPU and no GPU: cpu, auto -> 1; gpu is refused
  prefix=(taskset -c 0)
  job --nproc-per-node 'cpu: 1 .*(.|\n)*rank=0 size=1' --nproc-per-node cpu "${W[@]}"
  job --nproc-per-node 'auto: 1 .*(.|\n)*rank=0 size=1' --nproc-per-node auto "${W[@]}"
  prefix=()
  refused --nproc-per-node 'gpu: this host has no NVIDIA GPU' --nproc-per-node gpu "${W[@]}"
fi
for s in --rdzv-conf --rdzv_conf --monitor-interval --monitor_interval --start-method \
         --start_method --role --local-addr --local_addr; do
  job "$s" "changes nothing(.|\n)*$two" "$s" x -np 2 "${W[@]}"
done
for s in --run-path --run_path; do refused "$s" 'process' "$s" -np 2 "${W[@]}"; done
refused --local-ranks-filter 'log-dir' --local-ranks-filter 0 -np 2 "${W[@]}"

# horovodrun
job --min-num-proc "$two" -np 2 --min-num-proc 1 "${W[@]}"
job --max-num-proc "$two" -np 2 --min-np 1 --max-num-proc 2 "${W[@]}"
job --gloo-timeout-seconds 'rank=1 .*timeout=77' -np 2 --gloo-timeout-seconds 77 "${W[@]}"
for s in --stall-check --no-autotune --no-timeline-mark-cycles --no-mpi-threads-disable \
         --no-log-hide-timestamp --log-with-timestamp --gloo; do
  job "$s" "$two" "$s" -np 2 "${W[@]}"
done
for s in --disable-cache --hierarchical-allreduce --no-hierarchical-allreduce \
         --hierarchical-allgather --no-hierarchical-allgather --autotune --timeline-mark-cycles \
         --mpi-threads-disable --log-hide-timestamp --log-without-timestamp; do
  job "$s" "changes nothing(.|\n)*$two" "$s" -np 2 "${W[@]}"
done
for s in --cycle-time-ms --cache-capacity --autotune-log-file --autotune-warmup-samples \
         --autotune-steps-per-sample --autotune-bayes-opt-max-samples \
         --autotune-gaussian-process-noise --num-nccl-streams --thread-affinity; do
  job "$s" "changes nothing(.|\n)*$two" "$s" 3 -np 2 "${W[@]}"
done
for s in -cb --check-build; do refused "$s" 'one build' "$s" -np 2 "${W[@]}"; done
refused --binding-args 'bind-to' --binding-args x -np 2 "${W[@]}"
for s in --mpi --jsrun; do refused "$s" 'needs no MPI' "$s" -np 2 "${W[@]}"; done
refused --mpi-args 'needs no MPI' --mpi-args x -np 2 "${W[@]}"

# Every spelling of the table has a case above.
mapfile -t table < <("$trainrun" --help | sed -n '/^Compatibility:/,$p' | awk '/^  [a-zA-Z]+ +-/ {print $2}')
((${#table[@]} > 50)) || fail "found only ${#table[@]} spellings in trainrun --help"
for s in "${table[@]}"; do
  [[ -n ${tested[$s]-} ]] || fail "spelling $s of the compatibility table has no case here"
done

# No single-dash word prints help or exits 0 unless trainrun knows it; each is one line, exit 2.
for word in -hots -hosts_ -hostx -verbosex -version2 -tag -quietly -nolocalx -hx -vx -qv -n4 \
            -xFOO -H2 -abc -zz; do
  out=$("$trainrun" "$word" 2 /bin/true 2>&1)
  rc=$?
  if ((rc != 2)) || grep -q 'Usage:' <<<"$out" || [[ $(wc -l <<<"$out") -ne 1 ]] ||
     ! grep -q -- "'${word}'" <<<"$out"; then
    fail "'$word' did not give one line naming it with exit 2 (exit $rc): $out"
  fi
done
# Hosts: two names of this machine are one host (local ranks numbered across them, one line says
# so); a host that cannot be reached exits 2, as any bad host, naming it.
out=$("$trainrun" -H localhost:1,127.0.0.1:1 -np 2 sh -c 'echo "local $TRAINRUN_LOCAL_RANK of $TRAINRUN_LOCAL_SIZE"' 2>&1) ||
  fail "-H localhost:1,127.0.0.1:1: exited $?: $out"
grep -q 'local 1 of 2' <<<"$out" || fail "-H localhost:1,127.0.0.1:1: local ranks not numbered across: $out"
grep -q 'localhost, 127.0.0.1 all name this machine: one host with 2 slots' <<<"$out" ||
  fail "-H localhost:1,127.0.0.1:1: no line saying they are one host: $out"
out=$(timeout 60 "$trainrun" -H nosuchhost.invalid:2 -np 2 /bin/true 2>&1)
rc=$?
((rc == 2)) || fail "-H nosuchhost.invalid:2 exited $rc, not 2: $out"
grep -q 'nosuchhost.invalid' <<<"$out" || fail "-H nosuchhost.invalid:2: the error does not name it: $out"

echo "spellings: ${#table[@]} spellings checked, $failures failures"
((failures == 0))
