#!/usr/bin/env bash
# The host-staged GPU path's extra cost over a CPU-array allreduce, A/B of two builds: alternating
# rounds (A then B, B then A, ...) of bench/python/gpu_allreduce.py at 2 ranks with host arrays
# (--device cpu) and with the tests' fake GPU arrays (--device fake: the staged path over the CPU
# fake of a GPU runtime), 1 KiB to 64 MiB; prints per build and device nccl-tests' columns, then per
# size both builds' extra (staged / host - 1) and B's staged time over A's, with the load seen.
#
#   bench/staged_ab.sh BUILD_A BUILD_B
#
# BUILD_A, BUILD_B: build directories with bin/trainrun, python/ (target trainrun_python) and
# tests/gpu/_fake_gpu*.so (target trainrun_fake_gpu_module); each build's own source tree (its
# CMakeCache's CMAKE_HOME_DIRECTORY) gives gpu_allreduce.py and fake_cuda.py.
# Environment: AB_ROUNDS=3 (rounds per build), AB_NP=2, AB_MAX=64M, AB_PYTHON=/usr/bin/python3,
# AB_PRIORITY=1 to run each round in a session whose autogroup has nice -20 (as bench/ab.sh; needs
# root or CAP_SYS_NICE): on a machine shared with other work, the closest to a quiet one.
# Medians are over the rounds (each round's figure is already gpu_allreduce.py's median of 3).
set -euo pipefail

if (($# != 2)); then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
rounds=${AB_ROUNDS:-3}
np=${AB_NP:-2}
max=${AB_MAX:-64M}
py=${AB_PYTHON:-/usr/bin/python3}
priority=${AB_PRIORITY:-0}
out=$(mktemp -d /tmp/staged-ab-XXXXXX)

check_build() {
  local b=$1
  local missing=()
  [[ -x $b/bin/trainrun ]] || missing+=(bin/trainrun)
  [[ -d $b/python/trainrun ]] || missing+=("python/ (target trainrun_python)")
  compgen -G "$b/tests/gpu/_fake_gpu*.so" >/dev/null ||
    missing+=("tests/gpu/_fake_gpu*.so (target trainrun_fake_gpu_module)")
  if ((${#missing[@]})); then
    echo "staged_ab.sh: $b lacks ${missing[*]}; build those targets there" >&2
    exit 2
  fi
}
prio() {
  if ((priority)); then
    setsid bash -c 'echo -20 > /proc/$$/autogroup && exec nice -n -20 "$@"' prio "$@"
  else
    "$@"
  fi
}
source_of() { sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt"; }

A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
check_build "$A"
check_build "$B"

# run NAME BUILD DEVICE ROUND: one gpu_allreduce.py run, its JSON lines tagged into $out/runs.jsonl.
run() {
  local name=$1 build=$2 device=$3 round=$4 src
  src=$(source_of "$build")
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  PYTHONPATH=$build/python:$build/tests/gpu:$src/tests/gpu TRAINRUN_TIMEOUT=120 \
    prio "$build/bin/trainrun" -np "$np" "$py" "$src/bench/python/gpu_allreduce.py" \
    --device "$device" --min-bytes 1024 --max-bytes "$(numfmt --from=iec "$max")" --step 4 \
    --rounds 3 \
    2>"$out/$name.$device.$round.err" |
    sed 's/^\[[0-9]*\]<stdout>://' | grep '"bytes"' |
    "$py" -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r.update(build=sys.argv[1], round=int(sys.argv[2]), load=float(sys.argv[3]))
    print(json.dumps(r))' "$name" "$round" "$load" >>"$out/runs.jsonl"
}

echo "staged_ab: A=$A B=$B, $np ranks, $rounds rounds, 1 KiB..$max, priority $priority;" \
  "raw runs in $out" >&2
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2 == 1)); then
    order=("A $A cpu" "A $A fake" "B $B cpu" "B $B fake")
  else
    order=("B $B fake" "B $B cpu" "A $A fake" "A $A cpu")
  fi
  for item in "${order[@]}"; do
    read -r name build device <<<"$item"
    echo "  round $r: $name $device (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    run "$name" "$build" "$device" "$r"
  done
done

"$py" - "$out/runs.jsonl" "$np" <<'PYEOF'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
np = int(sys.argv[2])
times = collections.defaultdict(list)
for r in rows:
    times[(r["build"], r["device"], r["bytes"])].append(r["us"])
sizes = sorted({r["bytes"] for r in rows})
loads = [r["load"] for r in rows]
med = {k: statistics.median(v) for k, v in times.items()}
bus = 2 * (np - 1) / np
fmt = "{:>10} {:>10} {:>6} {:>6} {:>9} {:>7} {:>7}"
for build in ("A", "B"):
    for device, what in (("cpu", "host arrays"), ("fake", "fake GPU arrays, staged")):
        n = len(times[(build, device, sizes[0])])
        print(f"\n# build {build}, {what}: {np} ranks, medians of {n} rounds")
        print("# " + fmt.format("size", "count", "type", "redop", "time", "algbw", "busbw"))
        print("# " + fmt.format("(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)"))
        for s in sizes:
            t = med.get((build, device, s))
            if t is None:
                continue
            algbw = s / t / 1e3
            print("  " + fmt.format(s, s // 4, "float", "sum", f"{t:.1f}", f"{algbw:.2f}",
                                    f"{algbw * bus:.2f}"))
print("\n# extra = staged / host - 1 (medians); B/A = B's staged time over A's; "
      f"load {min(loads):.1f}-{max(loads):.1f}")
print("| bytes | A host (us) | A staged (us) | A extra | B host (us) | B staged (us) | B extra "
      "| staged B/A |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for s in sizes:
    try:
        ah, af = med[("A", "cpu", s)], med[("A", "fake", s)]
        bh, bf = med[("B", "cpu", s)], med[("B", "fake", s)]
    except KeyError:
        continue
    print(f"| {s} | {ah:.0f} | {af:.0f} | {af / ah - 1:+.0%} | {bh:.0f} | {bf:.0f} "
          f"| {bf / bh - 1:+.0%} | {bf / af:.2f} |")
PYEOF
