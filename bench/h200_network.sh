#!/usr/bin/env bash
# Issue 16's H200 session in device calls that follow one another while the machine stays warm (30 s idle):
#   bash .device/a/stage1.sh; bash .device/b/stage2.sh     (the bundle: TVM, pycuda and the wheels)
#   bash bench/h200_network.sh start TRIALS    export ResNet-18 (torchvision, BN folded), start tuning it as one
#                                              network in the background (setsid: it outlives the call)
#   bash bench/h200_network.sh wait SECONDS    follow the tuning up to SECONDS; results to $OUT
#   bash bench/h200_network.sh network NNFUSION FALLBACK_DB
#                                              NNFusion with the tuned DB (best + efficient, best only), the empty
#                                              DB and PyTorch, one timing method (bench_network.py)
#   bash bench/h200_network.sh verify KERNELS  kdb inject --verify --profile pace, before/after (bench_verify.py)
# Everything lands in /tmp/kdb-run on the machine; each step leaves results.tgz (and tuned.db) in $OUT.
set -uo pipefail
R=/tmp/kdb-run
# shellcheck disable=SC1091
source /tmp/kdb-device/env.sh
export PYTHONUNBUFFERED=1
mkdir -p "$R/state" "$R/net"
step=${1:?start|wait|network|verify}

copy_out() {  # $OUT takes 8 files at most: the small results go as one archive, rewritten each time
  (cd "$R" && tar czf "$OUT/results.tgz" --ignore-failed-read $(ls tune.log tune.json progress.jsonl summary.txt \
    verify.log verify.json net/*.json net/*.log 2>/dev/null))
  [ -f "$R/state/tuned.db" ] && python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); \
d=sqlite3.connect(sys.argv[2]); s.backup(d)" "$R/state/tuned.db" "$OUT/tuned.db"
  return 0
}

case "$step" in
start)
  python3 bench/bench_network.py export --out "$R/net" || exit 1
  setsid nohup python3 bench/bench_tune.py --target cuda --model "$R/net/resnet18.onnx" --trials "${2:?trials}" \
    --batch 64 --state "$R/state" --progress "$R/progress.jsonl" --out "$R/tune.json" \
    >"$R/tune.log" 2>&1 </dev/null &
  echo "tuning started (pid $!)"
  sleep "${3:-0}"
  tail -n 20 "$R/progress.jsonl" 2>/dev/null | cut -c1-300
  copy_out ;;
wait)
  end=$((SECONDS + ${2:?seconds}))
  while [ $SECONDS -lt $end ] && ! grep -q "^ratio:" "$R/tune.log"; do sleep 5; done
  tail -n 12 "$R/progress.jsonl" | cut -c1-300
  grep -q "^ratio:" "$R/tune.log" && cat "$R/tune.log" | grep -v "^\s*$" | tail -n 60
  copy_out ;;
network)
  nnf=$(realpath "${2:?nnfusion binary}"); fallback=$(realpath "${3:?fallback db}")
  pkill -f "[b]ench_tune.py" && sleep 2  # a tuning still running would share the GPU
  {
    python3 bench/bench_network.py dbs --out "$R/net" --db "$R/state/tuned.db" --fallback "$fallback"
    python3 -c "import sys; from core.db.kernel_db import KernelDB; KernelDB.open(sys.argv[1], create=True).close()" \
      "$R/net/empty.db"
    python3 bench/bench_network.py pytorch --out "$R/net"
    for label in tuned-all empty tuned-best; do  # each result is copied out as soon as it is there
      timeout 240 python3 bench/bench_network.py nnfusion --out "$R/net" --db "$R/net/$label.db" --nnfusion "$nnf" \
        --label "$label"
      copy_out
    done
    python3 bench/bench_network.py summary --out "$R/net" | tee "$R/summary.txt"
  } 2>&1 | tee "$OUT/network.log"
  copy_out ;;
verify)
  python3 bench/bench_verify.py --kernels "${2:?kernel folder}" --workers "$(nproc)" --out "$R/verify.json" \
    2>&1 | tee "$R/verify.log"
  copy_out ;;
esac
