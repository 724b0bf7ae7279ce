#!/usr/bin/env bash
# Issues 38 and 39 on one GPU, after bench/device_prep.sh on the CPU. Carry .device/n (pycuda and the console's
# wheels), .device/s23w (sqlmodel, sqlalchemy, pydantic for cp312: the state file's), .netrun/carry (the compiler,
# onnxconverter-common) and .devrun. Call: bash bench/device_run.sh a|b|c|d (see the case below); $OUT gets the logs.
set -uo pipefail
. bench/device_env.sh
export KDB_STATE_DIR=/tmp/kdb-st
nnf=$PWD/.netrun/carry/nnfusion/bin/nnfusion
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
D=.devrun/s23; N=/tmp/net; mkdir -p $N
missing=()  # (each network made once; another script's calls may have made some in /tmp/net already)
for n in bert2 gpt vit gru dense se tcn mnv2 convnext towers unetb unet resbn; do [ -f $N/$n.onnx ] || missing+=($n); done
[ ${#missing[@]} = 0 ] || python3 bench/zoo_onnx.py $N "${missing[@]}" || exit 3
for n in bert2 gpt; do
  [ -f $N/${n}16.onnx ] || python3 -m console.entry model fp16 $N/$n.onnx $N/${n}16.onnx > /dev/null
done
mkdir -p /tmp/db; for f in $D/*.db; do [ -f /tmp/db/$(basename $f) ] || cp $f /tmp/db/; done
run() {  # NET [extra...]: kdb nnfusion --run, rounds
  n=$1; shift
  timeout ${T:-100} python3 -m console.entry nnfusion $N/$n.onnx --db /tmp/db/$n.db --nnfusion "$nnf" --product-name "$gpu" --run --rounds 5 --iterations 300 \
    --out /tmp/r-$n "$@" > $OUT/run-$n.log 2>&1
  echo "== $n --run: exit $?"; grep -v "^ *$" $OUT/run-$n.log | tail -${TAILN:-14}
}
never() {  # NET: op times propose, the network decides
  n=$1
  timeout 200 python3 -m console.entry nnfusion $N/$n.onnx --db /tmp/db/$n.db --nnfusion "$nnf" --product-name "$gpu" --op-times /tmp/ops-$n.json --out /tmp/o-$n \
    > $OUT/ops-$n.log 2>&1; echo "== $n --op-times: exit $?"; tail -14 $OUT/ops-$n.log; cp /tmp/ops-$n.json $OUT/ 2>/dev/null
  timeout ${T:-240} python3 -m console.entry nnfusion $N/$n.onnx --db /tmp/db/$n.db --nnfusion "$nnf" --product-name "$gpu" --run --never-slower /tmp/ops-$n.json \
    --rounds 5 --iterations 300 --out /tmp/ns-$n > $OUT/ns-$n.log 2>&1
  echo "== $n never-slower: exit $?"; grep -v "^ *$" $OUT/ns-$n.log | tail -30
}
case "${1:-}" in
  a)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    T=90 run mnv2
    for b in bmm16 val bmm32; do
      timeout 100 python3 bench/bench_tensorcore.py rows $D/$b.json --out /tmp/o/$b > $OUT/$b.log 2>&1
      echo "== $b rows: exit $?"; grep -v "^  FAILED" $OUT/$b.log | tail -40; grep -c FAILED $OUT/$b.log
      grep FAILED $OUT/$b.log | head -5; cp /tmp/o/$b/*.json $OUT/ 2>/dev/null
    done
    T=70 run convnext
    # Session 23's defaults.so never loaded there (why was not recorded): say why, and build it there from the carried
    # defaults.cu with the device's own nvcc when it does not load.
    dd=$PWD/.devrun/defaults; ls -la $dd
    python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" $dd/defaults.so || { mkdir -p /tmp/defaults; cp $dd/cases.json \
      $dd/defaults.cu /tmp/defaults/; nvcc -O3 -shared -Xcompiler -fPIC -cudart static -gencode arch=compute_90,code=sm_90 \
      -o /tmp/defaults/defaults.so /tmp/defaults/defaults.cu && dd=/tmp/defaults; }
    timeout 60 python3 bench/bench_default_schedules.py time "$dd" > $OUT/defaults.log 2>&1
    echo "== defaults: exit $?"; cat $OUT/defaults.log | tail -24
    python3 -c 'import sqlite3; sqlite3.connect("/tmp/db/empty.db").close()'
    cp /tmp/db/empty.db /tmp/db/dense-aa.db; cp $N/dense.onnx $N/dense-aa.onnx
    T=80 run dense-aa ;;  # A/A: the empty DB against the empty DB
  d|rows)  # the least: depthwise numbers against ONNX Runtime, BatchMatMul tensor-core rows, the gathered patches' speed
    [ "$1" = d ] && T=80 run mnv2
    for b in ${ROWS:-bmm16 val}; do
      timeout 150 python3 bench/bench_tensorcore.py rows $D/$b.json --out /tmp/o/$b > $OUT/$b.log 2>&1
      echo "== $b rows: exit $?"; grep -v "^  FAILED" $OUT/$b.log | tail -40; grep -c FAILED $OUT/$b.log
      grep FAILED $OUT/$b.log | head -5; cp /tmp/o/$b/*.json $OUT/ 2>/dev/null
    done ;;
  b) for n in ${NETS:-bert216 gru}; do never $n; done ;;
  c) for n in ${NETS:-unetb unet towers vit dense se tcn gpt resbn}; do run $n; done ;;  # Resize, ConvTranspose, Concat rows first
  *) echo "usage: $0 a|b|c|d|rows (ROWS=, NETS= pick)"; exit 2 ;;
esac
