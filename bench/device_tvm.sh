#!/usr/bin/env bash
# TVM on the device in calls that fit the 64 MiB a call carries beside the tracked files (about 20 MiB of them):
# ../shared/device/bundle.sh's .device/a (the compiler library, 57 MiB xz) is split in two halves.
#   here:    bash bench/device_tvm.sh split                  (after bundle.sh: .device/a1, .device/a2)
#   call 1:  bash bench/device_tvm.sh 1                      (carry .device/a1)
#   call 2:  bash bench/device_tvm.sh 2                      (carry .device/a2: the library unpacked, as stage1 does)
#   call 3:  bash .device/b/stage2.sh && YOUR COMMAND        (carry .device/b), e.g. bash bench/h100_tune.sh
set -euo pipefail
d=/tmp/kdb-device
case "${1:-}" in
  split) cd "$(dirname "$0")/.."; rm -rf .device/a1 .device/a2; mkdir -p .device/a1 .device/a2
         split -b 29M .device/a/libtvm_compiler.so.xz .device/a1/part.
         mv .device/a1/part.ab .device/a2/; du -sh .device/a1 .device/a2 ;;
  1) mkdir -p $d && cp .device/a1/part.aa $d/ && nvidia-smi --query-gpu=name --format=csv,noheader ;;
  2) mkdir -p $d/tvmlib && cat $d/part.aa .device/a2/part.ab | xz -d > $d/tvmlib/libtvm_compiler.so && rm $d/part.aa
     echo "TVM's compiler library unpacked: call stage2 now, before the machine goes back (30 s idle)" ;;
  *) echo "usage: $0 split|1|2" >&2; exit 2 ;;
esac
