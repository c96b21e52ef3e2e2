#!/usr/bin/env bash
# not_linked.sh FILE...: each ELF file (a program or shared library that contains trainrun's NCCL
# backend) neither needs libnccl nor CUDA's libraries (no DT_NEEDED entry) nor leaves an NCCL or
# CUDA runtime symbol for the dynamic linker to find: they are opened with dlopen at run time.
set -euo pipefail
status=0
for file in "$@"; do
  needed=$(readelf -d "$file" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')
  if bad=$(grep -E '^lib(nccl|cudart|cuda)\.' <<<"$needed"); then
    echo "not_linked: $file needs $(tr '\n' ' ' <<<"$bad")(readelf -d)" >&2
    status=1
  fi
  if bad=$(nm -D --undefined-only "$file" | awk '{print $NF}' | grep -E '^(nccl|cuda)[A-Z]'); then
    echo "not_linked: $file leaves $(head -3 <<<"$bad" | tr '\n' ' ')to the dynamic linker" >&2
    status=1
  fi
  # The backend is really in it: its calls are looked up by name.
  if ! grep -aq ncclCommInitRankConfig "$file"; then
    echo "not_linked: $file does not contain the NCCL backend" >&2
    status=1
  fi
  echo "$file: NEEDED $(tr '\n' ' ' <<<"$needed")"
done
exit $status
