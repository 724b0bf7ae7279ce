#!/usr/bin/env bash
# One device call (session 16's call 2), after stage1 and `h200_network.sh export` (call 1) on the same warm machine:
#   1. stage2 (TVM, pycuda);
#   2. issue 30: every compilable zoo network through the README's commands, then `kdb nnfusion --run` (codegen rows,
#      untuned: right or not, timed against the empty DB), and the exported ResNet-18 with session 14's tuned DB;
#   3. issue 31: ResNet-18 end to end (session 14's tuned DB without the rows cuDNN beats, fitted; the empty DB as built
#      and with TF32 off; PyTorch eager, CUDA graph, torch.compile max-autotune from call 1's cache).
# Usage: bash bench/h200_zoo_and_resnet18.sh (carry .device/b and .netrun/carry). $OUT: zoo.out, zoo.tgz, results.tgz.
set -uo pipefail
[ -f /tmp/kdb-device/env.sh ] || bash .device/b/stage2.sh || exit 3
# shellcheck disable=SC1091
. /tmp/kdb-device/env.sh
export PYTHONUNBUFFERED=1
nnf=.netrun/carry/nnfusion/bin/nnfusion
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
gunzip -c bench/results/h200/session14/3-tuned.db.gz >/tmp/s14.db
mkdir -p /tmp/s14 && tar xzf bench/results/h200/session14/3-wait-ops-results.tgz -C /tmp/s14 net/ops.json
models=()
[ -f /tmp/kdb-run/resnet18/resnet18.onnx ] && models=(--model resnet18-tuned /tmp/kdb-run/resnet18/resnet18.onnx /tmp/s14.db)
# LEAVE_TO_LIBRARY=1: each network's rows that lose to cuDNN/cuBLAS alone are candidates (--op-times, then
# `kdb nnfusion --run --never-slower`), as the README tells a user: the run then measures "never slower"
timeout "${ZOO_TIMEOUT:-300}" python3 bench/bench_zoo_run.py --nnfusion "$nnf" --out /tmp/zoo --jobs "${ZOO_JOBS:-7}" \
  --product "$gpu" ${LEAVE_TO_LIBRARY:+--leave-to-library} "${models[@]}" >/tmp/zoo.out 2>&1
echo "zoo exit $?"; cat /tmp/zoo.out
cp /tmp/zoo.out "$OUT/zoo.out"
(cd /tmp && find zoo -maxdepth 2 \( -name '*.json' -o -name '*.txt' -o -name '*.log' \) | tar czf "$OUT/zoo.tgz" -T -)
[ "${SKIP_RESNET18:-0}" = 1 ] && exit 0
NET=resnet18 RUNS=3 OPS_TABLE=/tmp/s14/net/ops.json CONTENDERS="tuned-lib-fit empty" \
  bash bench/h200_network.sh network "$nnf" - /tmp/s14.db
