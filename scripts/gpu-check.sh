#!/usr/bin/env bash
# The whole GPU check in one call of the device machine (one GPU, Python 3.12, PyTorch with CUDA,
# CuPy, JAX, pybind11, the nvidia-nccl wheel; no Debian development packages, no network).
#
#   scripts/gpu-check.sh [BUILD_DIR]     # here, on Debian: builds and packs what must travel
#                                        # (BUILD_DIR/gpucheck.tar.gz, under 64 MiB) and prints
#                                        # the exact device call to make
#   scripts/gpu-check.sh --remote        # there (what the device call runs): unpacks, builds the
#                                        # Python extension, runs every check within 8 minutes,
#                                        # writes $OUT/table.md and $OUT/logs/
#
# What travels, and why: the working tree travels by itself; of the build only `trainrun`
# (gRPC, Protobuf and Abseil linked statically), libtrainrun_collectives.so with the Debian shared
# libraries it needs (gRPC, Protobuf, Abseil, c-ares, RE2, OpenSSL, zlib: copied from this machine,
# found through an RPATH of $ORIGIN) and Abseil's headers. The Python extension (python/src) is
# compiled there against that library and the machine's own pybind11 and Python 3.12, which this
# Debian (3.11) cannot target; it takes about half a minute. CUDA and NCCL are not carried: trainrun
# opens the machine's (PyTorch's CUDA runtime, the nvidia-nccl wheel) at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [[ ${1:-} != --remote ]]; then
  build=${1:-build}
  export CCACHE_DIR=${CCACHE_DIR:-/work/ccache}
  cmake --build "$build" -j2 --target trainrun trainrun_collectives_shared >/dev/null
  stage=$build/gpucheck
  rm -rf "$stage" "$build/gpucheck.tar.gz"
  mkdir -p "$stage/bin" "$stage/lib" "$stage/include"
  cp "$build/bin/trainrun" "$stage/bin/"
  cp -P "$build"/lib/libtrainrun_collectives.so* "$stage/lib/"
  # Every shared library of trainrun and the bundle outside glibc and the compiler's runtime.
  ldd "$build/bin/trainrun" "$build/lib/libtrainrun_collectives.so.0" |
    awk '/=>/ {print $3}' |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    sort -u | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  cp -r /usr/include/absl "$stage/include/"
  tar -C "$build" -czf "$build/gpucheck.tar.gz" gpucheck
  size=$(stat -c %s "$build/gpucheck.tar.gz")
  # What travels: the working tree as git sees it (tracked, and untracked files it does not
  # ignore) and the tarball; one call carries 64 MiB in all.
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  total=$((size + tree))
  if ((total > 64 * 1024 * 1024)); then
    echo "gpu-check: the working tree ($((tree >> 20)) MiB) and $build/gpucheck.tar.gz" \
         "($((size >> 20)) MiB) are $((total >> 20)) MiB, over the 64 MiB one call carries" >&2
    exit 1
  fi
  echo "gpu-check: packed $((size >> 20)) MiB into $build/gpucheck.tar.gz; with the working tree" \
       "$((total >> 20)) MiB travel (64 MiB allowed). Make this device call:"
  echo "  command:   bash scripts/gpu-check.sh --remote"
  echo "  carry:     [\"$build/gpucheck.tar.gz\"]"
  echo "  timeout_s: 540"
  exit 0
fi

# --- On the GPU machine ---------------------------------------------------------------------------
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out/logs"
start=$(date +%s)
deadline=$((start + 470))  # the checks end by 8 minutes, whatever is left is reported as not run
table=$out/table.md
py=$(command -v python3)
tarball=$(ls build*/gpucheck.tar.gz | head -1)
stage=$root/$(dirname "$tarball")/gpucheck
tar -C "$(dirname "$tarball")" -xzf "$tarball"
export PATH=$stage/bin:$PATH
export LD_LIBRARY_PATH=$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$stage/python:$root/tests/gpu
export PYTHONDONTWRITEBYTECODE=1 TRAINRUN_TIMEOUT=60 XLA_PYTHON_CLIENT_PREALLOCATE=false

note() { echo "$*" | tee -a "$table"; }
left() { echo $((deadline - $(date +%s))); }
# step NAME SECONDS COMMAND...: runs it with its log in logs/NAME.log unless time is out.
step() {
  local name=$1 limit=$2
  shift 2
  if (($(left) < 20)); then
    echo "not run (out of time)" >"$out/logs/$name.log"
    return 99
  fi
  ((limit > $(left))) && limit=$(left)
  local status=0
  timeout -k 5 "$limit" "$@" >"$out/logs/$name.log" 2>&1 || status=$?
  return $status
}
# counts LOG: pytest's summary line of every rank.
counts() { grep -aE '[0-9]+ (passed|failed|skipped|error)' "$1" | sed 's/\x1b\[[0-9;]*m//g' | tr '\n' ' '; }

: >"$table"
note "# trainrun GPU check ($(date -u +%FT%TZ))"
note ""
note "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1); python $($py -c 'import sys; print(sys.version.split()[0])'); torch $($py -c 'import torch; print(torch.__version__)' 2>/dev/null)"
note ""

# 1. The Python extension, built here against the carried library.
mkdir -p "$stage/python"
rm -rf "$stage/python/trainrun"
cp -r python/trainrun "$stage/python/"
suffix=$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
# pybind11's pip package says where its headers are; else they are with the interpreter's.
includes=$($py -m pybind11 --includes 2>/dev/null ||
  $py -c 'import sysconfig; print("-I" + sysconfig.get_paths()["include"])')
# One compiler per source at once, then the link.
compile_extension() {
  local objects=() pids=() status=0
  for source in python/src/*.cc; do
    objects+=("$stage/$(basename "$source" .cc).o")
    c++ -O2 -std=c++17 -fPIC -fvisibility=hidden $includes -Icollectives/include \
      -Irendezvous/include -I"$stage/include" -c "$source" -o "${objects[-1]}" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  ((status == 0)) || return 1
  c++ -shared -o "$stage/python/trainrun/_core$suffix" "${objects[@]}" -L"$stage/lib" \
    -l:libtrainrun_collectives.so.0 -Wl,-rpath,"$stage/lib"
}
build_status=0
compile_extension >"$out/logs/build_extension.log" 2>&1 || build_status=$?
note "| check | result |"
note "| --- | --- |"
note "| Python extension built here | $([[ $build_status == 0 ]] && echo "yes, in $(($(date +%s) - start)) s" || echo "FAILED ($build_status): logs/build_extension.log") |"
if [[ $build_status != 0 ]]; then exit 1; fi

# 2. What each side finds.
step dry_run 30 trainrun --dry-run -np 2 true || true
note "| trainrun --dry-run | $(grep -a 'GPUs here' "$out/logs/dry_run.log" | head -1) |"
step gpu_info 60 trainrun -np 1 "$py" -c 'import trainrun, torch; trainrun.init(); x = torch.ones(4, device="cuda"); trainrun.allreduce_(x); print(trainrun.gpu_info())' || true
note "| trainrun.gpu_info() at 1 rank | $(grep -a "'cuda'" "$out/logs/gpu_info.log" | tail -1 | sed 's/|/\//g') |"

# 3. The gpu-labelled tests: NCCL at 1 rank, host-staged at 2 ranks sharing the GPU.
for np in 1 2; do
  status=0
  step "test_gpu_cuda_np$np" 120 trainrun -np $np --verbose "$py" -m pytest -q -rs -p no:cacheprovider \
    tests/gpu/test_gpu_cuda.py || status=$?
  note "| tests/gpu/test_gpu_cuda.py, $np rank(s) (status $status) | $(counts "$out/logs/test_gpu_cuda_np$np.log") |"
done

# 4. The digits MLP on the GPU under two ranks, beside the CPU run.
for device in cuda cpu; do
  status=0
  step "train_$device" 90 trainrun -np 2 "$py" examples/train.py --device $device || status=$?
  note "| examples/train.py --device $device, 2 ranks (status $status) | $(grep -a 'final test accuracy' "$out/logs/train_$device.log" | sed 's/^\[[0-9]*\]<stdout>://') |"
done

# 5. Horovod's test_torch.py (its tests that need a GPU per rank skip themselves).
if [[ -f tests/horovod/parallel/test_torch.py ]]; then
  status=0
  (cd tests/horovod && step horovod_test_torch 150 trainrun -np 2 "$py" -m pytest -q -rs \
    -p no:cacheprovider parallel/test_torch.py) || status=$?
  note "| Horovod test_torch.py, 2 ranks (status $status) | $(counts "$out/logs/horovod_test_torch.log") |"
else
  note "| Horovod test_torch.py | not run: tests/horovod/parallel/test_torch.py is absent |"
fi

# 6. Performance: trainrun.torch.allreduce of CUDA tensors beside torch.distributed.
bench() {
  local name=$1 np=$2
  shift 2
  step "bench_$name" 75 trainrun -np "$np" "$py" bench/python/gpu_allreduce.py --rounds 3 "$@" || true
  grep -a '"bytes"' "$out/logs/bench_$name.log" | sed 's/^\[[0-9]*\]<stdout>://' >"$out/bench_$name.jsonl" || true
}
bench trainrun_nccl_np1 1 --impl trainrun
bench torch_nccl_np1 1 --impl torch --backend nccl
TRAINRUN_GPU_PATH=staged bench trainrun_staged_np2 2 --impl trainrun
bench torch_gloo_np2 2 --impl torch --backend gloo
"$py" - "$out" >>"$table" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, f"bench_{name}.jsonl")
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    return {r["bytes"]: r for r in rows}
a, b = load("trainrun_nccl_np1"), load("torch_nccl_np1")
c, d = load("trainrun_staged_np2"), load("torch_gloo_np2")
print("\n| bytes | trainrun NCCL 1 rank (us) | torch.distributed NCCL 1 rank (us) | ratio | "
      "trainrun staged 2 ranks busbw (GB/s) | DDP gloo CUDA 2 ranks busbw (GB/s) | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for size in sorted(set(a) | set(b) | set(c) | set(d)):
    def cell(t, k):
        return str(t[size][k]) if size in t else "-"
    r1 = f"{a[size]['us'] / b[size]['us']:.2f}" if size in a and size in b else "-"
    r2 = (f"{c[size]['busbw_gbs'] / d[size]['busbw_gbs']:.2f}"
          if size in c and size in d and d[size]["busbw_gbs"] else "-")
    print(f"| {size} | {cell(a, 'us')} | {cell(b, 'us')} | {r1} | {cell(c, 'busbw_gbs')} | "
          f"{cell(d, 'busbw_gbs')} | {r2} |")
EOF
note ""
note "whole check: $(($(date +%s) - start)) s"
cat "$table"
