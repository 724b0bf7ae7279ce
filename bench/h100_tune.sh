#!/usr/bin/env bash
# Issue 38's tuned target on one GPU: tensor-core rows tuned by kdb's engine (MetaSchedule over the mma.sync design
# space, 128 trials an op: the target allows 256) against cuDNN/cuBLAS fp16, on the ops the untuned default loses most on
# (bench/results/h100/session25/1-val-table.txt: BERT's Dots, the ViT Dot, ResNet-50's 3x3 convolutions).
#   calls 1, 2: bash bench/device_tvm.sh 1, then 2                       (carry .device/a1, then .device/a2)
#   call 3: bash .device/b/stage2.sh && bash bench/h100_tune.sh          (carry .device/b; ~560 s)
# Three processes, one op list each, their build workers sharing the 16 cores; each stops at LIMIT s and its table is
# taken from the rows it injected by then. $OUT: each process's log, table and rows JSON, one tgz.
set -uo pipefail
. /tmp/kdb-device/env.sh
export PYTHONUNBUFFERED=1
T=${TRIALS:-128}; LIMIT=${LIMIT:-400}  # (128: three ops a process fit one call)
mkdir -p /tmp/tune
# session 31: the ops still above 1.0x cuDNN/cuBLAS fp16 after 128 trials, resumed to 256 from their records (SEED,
# a folder of work dirs per part, e.g. .device/seed/conv1/<op>-<hash>/: `kdb tune` goes on from a work dir's records;
# `python3 bench/device_seed.py` makes it from the earlier sessions' results)
bash bench/tune_parts.sh /tmp/tune
for part in bert conv1 conv2; do
  [[ -d ${SEED:-/nonexistent}/$part ]] && mkdir -p /tmp/tune/$part/state/tuning && cp -r $SEED/$part/. /tmp/tune/$part/state/tuning/
done
wc -l /tmp/tune/*.txt
for part in bert conv1 conv2; do  # each: tune until LIMIT, then (cut off) the table of the rows it injected
  ( export KDB_STATE_DIR=/tmp/tune/$part/state
    timeout $LIMIT python3 bench/bench_tensorcore.py tune /tmp/tune/$part.txt --trials $([ $part = bert ] && echo ${BERT_TRIALS:-256} || echo $T) --workers 6 \
      --out /tmp/tune/$part > /tmp/tune/$part.log 2>&1
    grep -q "^ratio:" /tmp/tune/$part.log || timeout 90 python3 bench/bench_tensorcore.py table \
      /tmp/tune/$part/tune.db --out /tmp/tune/$part >> /tmp/tune/$part.log 2>&1 ) &
done
wait
for part in bert conv1 conv2; do
  echo "== $part"; grep -E "trials in|^tuned " /tmp/tune/$part.log | tail -4
  sed -n '/^op  /,/^ratio:/p' /tmp/tune/$part.log
done
(cd /tmp && tar czf $OUT/tune.tgz tune/*.log tune/*.txt tune/*/tune.json tune/*/state 2>/dev/null)
