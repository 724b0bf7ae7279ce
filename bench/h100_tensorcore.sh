#!/usr/bin/env bash
# Issue 38 on one GPU: fp16 networks end to end with kdb's tensor-core rows, and what a user runs instead.
#   first, here on the CPU: bash bench/h100_tensorcore.sh prep   (each network's DB through the README's commands,
#                                                      current code: fp16 and TF32 rows, into .netrun/carry)
#   call 1: bash bench/h100_tensorcore.sh baselines   (PyTorch's CUDA graph: ResNet-18/50, MobileNetV2, BERT 2 and 12
#                                                      layers, fp16 / fp32 as shipped / fp32 TF32 off; then fp16 BERT-2
#                                                      through the README's commands)
#   call 2: bash bench/h100_tensorcore.sh resnet50    (fp16)
#   call 3: bash bench/h100_tensorcore.sh more        (fp16 BERT-12 with BERT-2's DB: the same ops; fp16 MobileNetV2)
#   call 4: bash bench/h100_tensorcore.sh tf32        (TF32 rows against PyTorch's TF32; the fp32 networks with them)
#   call 6: bash bench/h100_tensorcore.sh graph       (fp16 BERT-2 and MobileNetV2 with --cuda-graph, PyTorch's fp16
#                                                      CUDA graph of BERT-2/12 and MobileNetV2 in the same call)
#   call 5: NET=bert2 bash bench/h100_tensorcore.sh neverslower   (then NET=resnet50: op times propose, the network
#                                                      decides)
# Carry .device/n (.device/b's wheels less TVM's and the tuner's: pycuda and the core's; TVM is not needed: the DBs
# come made), .device/s23w (sqlmodel, sqlalchemy, pydantic for cp312: the state file's) and .netrun/carry (the
# compiler, the DBs `prep` wrote, onnxconverter-common's wheel).
# Each network is built here from tests/zoo.py (full ResNet-50: 3, 4, 6, 3 blocks; full MobileNetV2), made fp16 with
# `kdb model fp16`, run with the DB (`kdb nnfusion --run`: against ONNX Runtime, next to the empty DB), then each op
# timed alone (--op-times), the rows the library beats left to it, and run again. $OUT: the logs and JSON.
set -uo pipefail
NETS="resnet50full bert2 bert12 mnv2full"  # (bench/zoo_onnx.py: full ResNet-50, full MobileNetV2)
onnx_of() { local n=${1%-tuned}; n=${n%-tf32}; case $n in resnet50|mnv2) echo ${n}full ;; *) echo $n ;; esac; }  # a DB's name
# (NAME-tuned, NAME-tf32: the same network, its DB with tuned or TF32 rows) -> its network's
if [ "${1:-}" = prep ]; then  # on the CPU: kdb's README commands, the DBs the device calls carry
  cd "$(dirname "$0")/.." || exit 1
  K=".venv/bin/python -m console.entry"; w=/tmp/tc-prep; mkdir -p $w
  .venv/bin/python bench/zoo_onnx.py $w $NETS || exit 3
  for net in resnet50 bert2 mnv2; do
    for math in fp16 tf32; do
      [ $net = mnv2 ] && [ $math = tf32 ] && continue
      db=$net; [ $math = tf32 ] && db=$net-tf32
      export KDB_STATE_DIR=$w/$db KDB_CONFIG=$w/$db/settings.toml
      rm -rf $w/$db .netrun/carry/$db.db*; mkdir -p $w/$db
      $K settings archs=sm_90 "nnfusion_path=${NNFUSION:-../shared/nnfusion/bin/nnfusion}" > /dev/null
      model=$w/$(onnx_of $net).onnx
      if [ $math = fp16 ]; then $K model fp16 $model $w/${net}16.onnx > /dev/null; model=$w/${net}16.onnx; fi
      $K opconfig extract $model -o $w/$db/ops.txt > $w/$db/extract.log 2>&1
      start=$SECONDS
      $K codegen $w/$db/ops.txt --math $([ $math = tf32 ] && echo tf32 || echo fp32) --inject \
        --db .netrun/carry/$db.db > $w/$db/codegen.log 2>&1 || echo "$db: codegen exit $?"
      echo "$db: $((SECONDS - start)) s, $(grep -c . $w/$db/ops.txt) op configs"; tail -1 $w/$db/codegen.log
    done
  done
  # the TF32 rows of session 19's ops (bench/tensorcore-ops.txt in fp32): the default tiling and 3 sampled each
  sed 's/_op_half|/_op_float|/' bench/tensorcore-ops.txt > $w/tf32-ops.txt
  .venv/bin/python bench/bench_tensorcore.py sample $w/tf32-ops.txt .netrun/carry/tf32.json --per-op 3 --math tf32 \
    > $w/tf32-sample.log 2>&1; echo "tf32 samples: exit $?"; tail -1 $w/tf32-sample.log
  exit 0
fi
. bench/device_env.sh
nnf=$PWD/.netrun/carry/nnfusion/bin/nnfusion
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 bench/zoo_onnx.py /tmp/net $NETS || exit 3
network() {  # NAME [DB [--fp16]]: the zoo run of one network with its DB from .netrun/carry, leave-to-library
  db=${2:-$1}; set -- "$(onnx_of "$1")" "${@:2}"
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
  graph)  # the fp16 networks with kernel_entry in a CUDA graph (--cuda-graph), PyTorch's fp16 CUDA graph in the call
    timeout 150 python3 bench/bench_torch_baselines.py --out $OUT --nets ${TORCH_NETS:-bert2 bert12 mobilenet_v2} \
      > $OUT/torch.log 2>&1; echo "torch: exit $?"; grep -E "fp16|fp32" $OUT/torch.log
    for db in ${GRAPH_NETS:-bert2 mnv2}; do
      n=$(onnx_of $db)
      cp .netrun/carry/$db.db /tmp/g-$db.db
      # TUNED=/tmp/tune (h100_tune.sh's work dirs, on this warm machine): each op's newest best kernel into a -tuned DB
      # of its kind (Dots: BERT's; convolutions: ResNet-50's), replacing the row of its key
      for k in $( [[ $db == *-tuned && -d ${TUNED:-/nonexistent} ]] && ls -d $TUNED/*/state/tuning/*/ ); do
        case "$(basename $k)" in dot-*) [[ $db == bert* ]] ;; *) [[ $db == resnet50* ]] ;; esac || continue
        j=$(ls -t $k/kernels-*.json 2>/dev/null | head -1); [ -n "$j" ] || continue
        python3 -m console.entry inject "$j" --replace --db /tmp/g-$db.db 2>&1 | tail -1 | sed "s|^|  $db <- $(basename $k): |"
      done
      m=/tmp/net/$n.onnx  # (a -tf32 DB's network stays fp32)
      if [[ $db != *-tf32 ]]; then python3 -m console.entry model fp16 $m /tmp/net/${n}16.onnx > /dev/null; m=/tmp/net/${n}16.onnx; fi
      timeout ${NET_TIMEOUT:-200} python3 -m console.entry nnfusion $m --db /tmp/g-$db.db \
        --nnfusion "$nnf" --product-name "$gpu" --run --cuda-graph --rounds 3 --iterations 300 --out /tmp/g-$db \
        > $OUT/graph-$db.log 2>&1
      echo "== $db --cuda-graph: exit $?"; grep -v "^ *$" $OUT/graph-$db.log | tail -12
    done ;;
  mnv2) network mnv2 mnv2 --fp16 ;;  # (half of `more`, for a call with little device time left)
  more) NET_TIMEOUT=300 network bert12 bert2 --fp16; NET_TIMEOUT=280 network mnv2 mnv2 --fp16 ;;
  tf32)  # TF32 rows (kdb codegen --math tf32) verified and timed against PyTorch's TF32 calls; the fp32 networks
    export KDB_STATE_DIR=/tmp/kdb-st
    timeout 200 python3 bench/bench_tensorcore.py rows .netrun/carry/tf32.json --out /tmp/o/tf32 > $OUT/tf32-rows.log 2>&1
    echo "tf32 rows: exit $?"; grep -v "^  FAILED" $OUT/tf32-rows.log | tail -36; grep -c FAILED $OUT/tf32-rows.log
    cp /tmp/o/tf32/rows.json $OUT/tf32-rows.json 2>/dev/null
    unset KDB_STATE_DIR
    network resnet50 resnet50-tf32
    network bert2 bert2-tf32 ;;
  neverslower)  # issue 39: each op timed alone proposes, the network decides (--run --never-slower); NET=bert2|resnet50;
    # GRAPH=1: the network timed in a CUDA graph (--cuda-graph)
    net=${NET:-bert2}
    python3 -m console.entry model fp16 /tmp/net/$(onnx_of $net).onnx /tmp/net/${net}16.onnx > $OUT/ns-$net.log 2>&1
    cp .netrun/carry/$net.db /tmp/ns-$net.db
    common=(--db /tmp/ns-$net.db --nnfusion "$nnf" --product-name "$gpu")
    timeout 240 python3 -m console.entry nnfusion /tmp/net/${net}16.onnx "${common[@]}" --op-times /tmp/ns-$net.json \
      --out /tmp/ns-$net-ops >> $OUT/ns-$net.log 2>&1; echo "op-times: exit $?"
    cp /tmp/ns-$net.json $OUT/ 2>/dev/null
    timeout ${NS_TIMEOUT:-330} python3 -m console.entry nnfusion /tmp/net/${net}16.onnx "${common[@]}" --run --never-slower \
      /tmp/ns-$net.json ${GRAPH:+--cuda-graph} --rounds 5 --iterations 300 --out /tmp/ns-$net-run > $OUT/ns-$net-run.log 2>&1
    echo "never-slower: exit $?"; tail -30 $OUT/ns-$net-run.log ;;
  *) echo "usage: $0 prep|baselines|resnet50|mnv2|more|tf32|neverslower"; exit 2 ;;
esac
