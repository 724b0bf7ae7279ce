#!/usr/bin/env bash
# Issue 38 on one GPU: fp16 networks end to end with kdb's tensor-core rows, and what a user runs instead.
#   call 1: bash bench/h100_tensorcore.sh baselines   (PyTorch: ResNet-50 and two BERT layers, fp16 / fp32 as shipped /
#                                                      fp32 TF32 off; then BERT through the README's commands)
#   call 2: bash bench/h100_tensorcore.sh resnet50
#   call 3: bash bench/h100_tensorcore.sh tf32      (TF32 rows against PyTorch's TF32; the fp32 networks with them)
#   call 4: NET=bert2 bash bench/h100_tensorcore.sh neverslower   (then NET=resnet50: op times propose, the network
#                                                      decides; not yet run on a GPU)
# Carry .device/n (.device/b's wheels less TVM's and the tuner's: pycuda and the core's; TVM is not needed: the DBs come made) and .netrun/carry (the
# compiler, the DBs kdb codegen wrote on the CPU for each network's fp16 op configs, onnxconverter-common's wheel).
# Each network is built here from tests/zoo.py (full ResNet-50: 3, 4, 6, 3 blocks), made fp16 with `kdb model fp16`,
# run with the DB (`kdb nnfusion --run`: against ONNX Runtime, next to the empty DB), then each op timed alone
# (--op-times), the rows the library beats left to it, and run again. $OUT: the logs and JSON.
set -uo pipefail
site=/tmp/kdb-device/site
if [ ! -f /tmp/kdb-device/env.sh ]; then
  mkdir -p $site
  python3 -m pip install -q --no-index --no-deps --no-compile --target $site .device/n/wheels/*.whl .netrun/carry/whl/*.whl || exit 3
  echo "export PYTHONPATH=$site:\$PWD\${PYTHONPATH:+:\$PYTHONPATH}" > /tmp/kdb-device/env.sh
fi
# shellcheck disable=SC1091
. /tmp/kdb-device/env.sh
export PYTHONUNBUFFERED=1
nnf=$PWD/.netrun/carry/nnfusion/bin/nnfusion
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
mkdir -p /tmp/net
python3 - <<'PY'
import sys; sys.path.insert(0, "tests")
import onnx, zoo
for name, model in (("resnet50", zoo.resnet50(blocks=(3, 4, 6, 3))), ("bert2", zoo.bert_encoder())):
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, f"/tmp/net/{name}.onnx")
PY
network() {  # NAME [DB [--fp16]]: the zoo run of one network with its DB from .netrun/carry, leave-to-library
  db=${2:-$1}
  timeout "${NET_TIMEOUT:-540}" python3 bench/bench_zoo_run.py --nnfusion "$nnf" --out /tmp/zoo-$db --jobs 1 \
    --product "$gpu" ${3:-} --leave-to-library --nets --model "$1" /tmp/net/$1.onnx .netrun/carry/$db.db \
    > $OUT/$db.out 2>&1
  echo "$db: exit $?"; cat $OUT/$db.out
  (cd /tmp && find zoo-$db -maxdepth 2 \( -name '*.json' -o -name '*.txt' -o -name '*.log' \) | tar czf $OUT/$db.tgz -T -)
}
case "${1:-}" in
  baselines)
    timeout 200 python3 bench/bench_torch_baselines.py --out $OUT > $OUT/torch.log 2>&1; echo "torch: exit $?"
    cat $OUT/torch.log | tail -8
    network bert2 bert2 --fp16 ;;
  resnet50) network resnet50 resnet50 --fp16 ;;
  tf32)  # TF32 rows (kdb codegen --math tf32) verified and timed against PyTorch's TF32 calls; the fp32 networks
    export KDB_STATE_DIR=/tmp/kdb-st
    timeout 200 python3 bench/bench_tensorcore.py rows .netrun/carry/tf32.json --out /tmp/o/tf32 > $OUT/tf32-rows.log 2>&1
    echo "tf32 rows: exit $?"; grep -v "^  FAILED" $OUT/tf32-rows.log | tail -36; grep -c FAILED $OUT/tf32-rows.log
    cp /tmp/o/tf32/rows.json $OUT/tf32-rows.json 2>/dev/null
    unset KDB_STATE_DIR
    network resnet50 resnet50-tf32
    network bert2 bert2-tf32 ;;
  neverslower)  # issue 39: each op timed alone proposes, the network decides (--run --never-slower); NET=bert2|resnet50
    net=${NET:-bert2}
    python3 -m console.entry model fp16 /tmp/net/$net.onnx /tmp/net/${net}16.onnx > $OUT/ns-$net.log 2>&1
    cp .netrun/carry/$net.db /tmp/ns-$net.db
    common=(--db /tmp/ns-$net.db --nnfusion "$nnf" --product-name "$gpu")
    timeout 240 python3 -m console.entry nnfusion /tmp/net/${net}16.onnx "${common[@]}" --op-times /tmp/ns-$net.json \
      --out /tmp/ns-$net-ops >> $OUT/ns-$net.log 2>&1; echo "op-times: exit $?"
    cp /tmp/ns-$net.json $OUT/ 2>/dev/null
    timeout 330 python3 -m console.entry nnfusion /tmp/net/${net}16.onnx "${common[@]}" --run --never-slower \
      /tmp/ns-$net.json --rounds 5 --iterations 300 --out /tmp/ns-$net-run > $OUT/ns-$net-run.log 2>&1
    echo "never-slower: exit $?"; tail -30 $OUT/ns-$net-run.log ;;
  *) echo "usage: $0 baselines|resnet50|tf32|neverslower"; exit 2 ;;
esac
