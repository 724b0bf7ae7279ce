#!/usr/bin/env bash
# Issue 16's H200 session in device calls that follow one another while the machine stays warm (30 s idle):
#   bash .device/a/stage1.sh; bash .device/b/stage2.sh     (the bundle: TVM, pycuda and the wheels)
#   bash bench/h200_network.sh start TRIALS [SLEEP] [SHARDS]
#                                              export ResNet-18 (torchvision, BN folded), start tuning it as one
#                                              network in the background (setsid: it outlives the call); SHARDS
#                                              processes side by side, each claiming the next op nobody has
#                                              (bench_tune --join; until session 10 ops were dealt out: --shard)
#     (BATCH=N: candidates per search round, default 64; MetaSchedule's search costs the same per round;
#      POPULATION=N: the evolutionary search's population, default kdb's 256: core.tuning.job;
#      MAX_PER_OP=N: no op planned more than N trials, default 256: issue 16's target counts at most 256 per op)
#   bash bench/h200_network.sh wait SECONDS    follow the tuning up to SECONDS; results to $OUT (state.tgz: the
#                                              tuning records; carry it as .netrun/state.tgz and `start` resumes);
#                                              prints the trials measured since `start` per minute, finished or not,
#                                              and the host's CPU by kind of process (bench/host_load.py)
#   bash bench/h200_network.sh items DB DIR    the DB's rows as kernel JSON under DIR (for `reinject`)
#   bash bench/h200_network.sh reinject ITEMS...  kernel JSON (exported rows) injected again into $R/reinjected.db,
#                                              with today's checks (launch bounds), verified and timed
#   bash bench/h200_network.sh network NNFUSION FALLBACK_DB [DB]
#                                              NNFusion with the tuned DB (best + efficient, best only, and without
#                                              BlockFusion), the empty DB and PyTorch, one timing method
#                                              (bench_network.py); DB defaults to the tuning's
#     (CONTENDERS="tuned-best empty" limits the NNFusion contenders, a label with -no-blockfusion appended compiles
#      that DB with -fblockfusion_level=0, one with -checked with -fblockfusion_check_correctness=true, one with -fit a copy whose rows fused into a kernel that cannot launch
#      are made standalone first (kdb nnfusion --fit-launches); every contender gets the launch check; NO_PYTORCH=1 skips PyTorch, RUNS=5 times
#      each contender in 5 processes and keeps the median run)
#   bash bench/h200_network.sh ops [DB]        each op's rows (their profile from injection) against cuDNN timed now, in
#                                              PICKS processes (default 3; each op counts cuDNN's fastest pick);
#                                              REPROFILE=1 first times every row again in a quiet process (kdb gpu
#                                              profile --all): the rows' own figures, not their injection's
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
  (cd "$R" && tar czf "$OUT/results.tgz" --ignore-failed-read $(ls tune*.log tune*.json progress*.jsonl summary.txt reprofile.json \
    verify.log verify.json reinject.jsonl ops.log load.jsonl net/*.json net/*.log \
    net/nnfusion-*/nnfusion_rt/cuda_codegen/nnfusion_rt.cu 2>/dev/null))
  # the tuning records (MetaSchedule's JSON work dirs): carried back as .netrun/state.tgz, a later session
  # resumes them instead of measuring again
  [ -d "$R/state/tuning" ] && tar czf "$OUT/state.tgz" -C "$R" --exclude='tuned.db*' --exclude='*.lock' state/tuning
  [ -f "$R/state/tuned.db" ] && python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); \
d=sqlite3.connect(sys.argv[2]); s.backup(d)" "$R/state/tuned.db" "$OUT/tuned.db"
  return 0
}

recorded() {  # trials in MetaSchedule's records under the state dir (whole lines)
  cat "$R"/state/tuning/*/database_tuning_record.json 2>/dev/null | wc -l
}

case "$step" in
start)
  python3 bench/bench_network.py export --out "$R/net" || exit 1
  if [ -f .netrun/state.tgz ]; then tar xzf .netrun/state.tgz -C "$R" && echo "resuming the records of .netrun/state.tgz"; fi
  echo "$(date +%s) $(recorded)" >"$R/started.txt"  # the pace count of `wait` starts here
  pkill -f "[h]ost_load.py sample"; rm -f "$R/load.jsonl"
  setsid nohup python3 bench/host_load.py sample --out "$R/load.jsonl" --every 5 >/dev/null 2>&1 </dev/null &
  shards=${4:-1}; run="run-$(date +%s)"  # the processes claim the ops one at a time (core/tuning/claims.py)
  for k in $(seq 1 "$shards"); do
    setsid nohup python3 bench/bench_tune.py --target cuda --model "$R/net/resnet18.onnx" --trials "${2:?trials}" \
      --batch "${BATCH:-64}" ${POPULATION:+--population "$POPULATION"} --state "$R/state" --progress "$R/progress-$k.jsonl" --out "$R/tune-$k.json" \
      --join "$run" --max-per-op "${MAX_PER_OP:-256}" --workers $(( $(nproc) / shards )) >"$R/tune-$k.log" 2>&1 </dev/null &
    echo "tuning shard $k/$shards started (pid $!)"
  done
  sleep "${3:-0}"
  tail -q -n 5 "$R"/progress-*.jsonl 2>/dev/null | cut -c1-300
  copy_out ;;
wait)
  end=$((SECONDS + ${2:?seconds}))
  finished() { for f in "$R"/tune-*.log; do grep -q "^ratio:" "$f" || return 1; done; }
  alive() { pgrep -f "[b]ench_tune.py" >/dev/null; }  # a crashed tuning never writes its ratio: stop waiting
  while [ $SECONDS -lt $end ] && ! finished && alive; do sleep 5; done
  tail -q -n 4 "$R"/progress-*.jsonl | cut -c1-300
  for f in "$R"/tune-*.log; do grep -q "^ratio:" "$f" && grep -v "^\s*$" "$f" | tail -n 45; done
  read -r t0 n0 <"$R/started.txt"
  n=$(recorded); dt=$(( $(date +%s) - t0 ))
  echo "pace: $((n - n0)) trials recorded in ${dt} s since start = $(( (n - n0) * 60 / (dt > 0 ? dt : 1) )) trials/min (all processes, set-up included)"
  python3 bench/host_load.py summary "$R/load.jsonl" --trials $((n - n0 > 0 ? n - n0 : 1))  # where the host's CPU went
  finished && python3 - "$R"/tune-*.json <<'PY'
import json, sys
runs = [json.load(open(p)) for p in sys.argv[1:]]
trials, wall = sum(r["trials"] for r in runs), max(r["wall_s"] for r in runs)
print(f"combined: {trials} trials in {wall:.1f} s over {len(runs)} processes side by side: {trials / wall * 60:.1f} trials/min")
PY
  copy_out ;;
items)
  mkdir -p "${3:?folder}"
  python3 -c "import sys; from pathlib import Path; from core.db.kernel_db import KernelDB
from core.kernels.export import write_kernel_json
with KernelDB.open(sys.argv[1]) as db: print(write_kernel_json(db.iter_rows(), Path(sys.argv[2]) / 'rows.json'), 'kernels to', sys.argv[2])" \
    "$(realpath "${2:?db}")" "$3" ;;
reinject)
  rm -f "$R/reinjected.db"*
  python3 -m console.entry inject --db "$R/reinjected.db" --arch sm_90 --verify --profile --workers "$(nproc)" --jsonl \
    "${@:2}" >"$R/reinject.jsonl" 2>&1
  tail -n 3 "$R/reinject.jsonl" | cut -c1-600
  copy_out ;;
ops)
  db=$(realpath "${2:-$R/state/tuned.db}")
  if [ -n "${REPROFILE:-}" ]; then  # every row timed again now, in a quiet process: its profile is replaced
    python3 -m console.entry gpu profile --all --db "$db" --json >"$R/reprofile.json" 2>&1 || echo "reprofile failed"
  fi
  python3 bench/bench_network.py ops --out "$R/net" --db "$db" --picks "${PICKS:-3}" 2>&1 | tee "$R/ops.log"
  copy_out ;;
network)
  nnf=$(realpath "${2:?nnfusion binary}"); fallback=$(realpath "${3:?fallback db}")
  tuned=$(realpath "${4:-$R/state/tuned.db}")
  pkill -f "[b]ench_tune.py" && sleep 2  # a tuning still running would share the GPU
  rm -f "$R"/net/nnfusion-*.json  # this DB's table only
  {
    python3 bench/bench_network.py dbs --out "$R/net" --db "$tuned" --fallback "$fallback"
    python3 -c "import sys; from core.db.kernel_db import KernelDB; KernelDB.open(sys.argv[1], create=True).close()" \
      "$R/net/empty.db"
    [ -n "${NO_PYTORCH:-}" ] || python3 bench/bench_network.py pytorch --out "$R/net"
    for label in ${CONTENDERS:-tuned-all empty tuned-best}; do  # each result is copied out as soon as it is there
      db=${label%-no-blockfusion}; off=()  # "<db>-no-blockfusion": that DB compiled with BlockFusion off
      [ "$db" != "$label" ] && off=(--flag=-fblockfusion_level=0)
      if [ "${label%-checked}" != "$label" ]; then  # "<db>-checked": NNFusion runs each BlockFusion group on the
        db=${label%-checked}; off=(--flag=-fblockfusion_check_correctness=true)  # GPU and drops one that fails
      fi
      if [ "${label%-fit}" != "$label" ]; then  # "<db>-fit": a copy of that DB whose rows fused into a kernel that
        cp "$R/net/${label%-fit}.db" "$R/net/$label.db"  # cannot launch are made standalone (kdb nnfusion --fit-launches)
        db=$label
        python3 -m console.entry nnfusion "$R/net/resnet18.onnx" --db "$R/net/$db.db" --nnfusion "$nnf" \
          --product-name "$(python3 -c 'import torch; print(torch.cuda.get_device_name(0))')" --fit-launches \
          --out "$R/net/fit-compile" --json >"$R/net/$label-kdb.json" 2>&1 || echo "$label: kdb nnfusion exit $?"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('made standalone:', r['made_standalone'], \
          'launch failures left:', r['launch_failures'])" "$R/net/$label-kdb.json" || true
      fi
      timeout 240 python3 bench/bench_network.py nnfusion --out "$R/net" --db "$R/net/$db.db" --nnfusion "$nnf" \
        --label "$label" "${off[@]}" --trace-steps --runs "${RUNS:-1}"
      copy_out
    done
    [ -n "${CONTENDERS:-}" ] || timeout 240 python3 bench/bench_network.py nnfusion --out "$R/net" \
      --db "$R/net/tuned-all.db" --nnfusion "$nnf" --label tuned-all-no-blockfusion --flag=-fblockfusion_level=0 --trace-steps
    python3 bench/bench_network.py summary --out "$R/net" | tee "$R/summary.txt"
  } 2>&1 | tee "$OUT/network.log"
  copy_out ;;
verify)
  python3 bench/bench_verify.py --kernels "${2:?kernel folder}" --workers "$(nproc)" --out "$R/verify.json" \
    2>&1 | tee "$R/verify.log"
  copy_out ;;
esac
