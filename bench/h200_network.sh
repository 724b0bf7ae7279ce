#!/usr/bin/env bash
# Issue 16's and 31's H200 sessions in device calls that follow one another while the machine stays warm (30 s idle):
#   bash .device/a/stage1.sh; bash .device/b/stage2.sh     (the bundle: TVM, pycuda and the wheels)
#   NET=resnet50 picks the network of every step below (default resnet18); its files live in $R/$NET
#   bash bench/h200_network.sh export          ResNet-18 and ResNet-50 (torchvision, BN folded) as ONNX, with input
#                                              and float64 reference, and the machine's description (machine.txt);
#                                              needs PyTorch only (runs before stage2)
#   bash bench/h200_network.sh warm-compile    torch.compile(mode="max-autotune") of both networks once each, so
#                                              Inductor's cache holds their code and autotuning choices before
#                                              the `network` steps time them (export first; needs PyTorch only)
#   bash bench/h200_network.sh start TRIALS [SLEEP] [SHARDS]
#                                              export NET if not there, start tuning it as one network in the
#                                              background (setsid: it outlives the call); SHARDS processes side by
#                                              side, each claiming the next op nobody has (bench_tune --join)
#     (BATCH=N: candidates per search round, default 64; MetaSchedule's search costs the same per round;
#      POPULATION=N: the evolutionary search's population, default kdb's 256: core.tuning.job;
#      MAX_PER_OP=N: no op planned more than N trials, default 256: issue 16's target counts at most 256 per op;
#      MINUTES=M: a time budget per process (kdb tune --minutes): the op in flight keeps its best, the rest wait)
#   bash bench/h200_network.sh wait SECONDS    follow the tuning up to SECONDS; results to $OUT (state.tgz: the
#                                              tuning records; carry it as .netrun/state.tgz and `start` resumes);
#                                              prints the trials measured since `start` per minute, finished or not,
#                                              and the host's CPU by kind of process (bench/host_load.py)
#   bash bench/h200_network.sh items DB DIR    the DB's rows as kernel JSON under DIR (for `reinject`)
#   bash bench/h200_network.sh reinject ITEMS...  kernel JSON (exported rows) injected again into $R/reinjected.db,
#                                              with today's checks (launch bounds), verified and timed
#   bash bench/h200_network.sh network NNFUSION [FALLBACK_DB|-] [DB]
#                                              NET through NNFusion with the tuned DB's variants and the empty DB,
#                                              and PyTorch (eager, CUDA graph, torch.compile max-autotune), one
#                                              timing method (bench_network.py), then one table; DB defaults to the
#                                              tuning's; "-" or nothing: no fallback rows (the library runs the ops
#                                              the tuned DB lacks)
#     (CONTENDERS="tuned-best empty" limits the NNFusion contenders, a label with -no-blockfusion appended compiles
#      that DB with -fblockfusion_level=0, one with -checked with -fblockfusion_check_correctness=true, one with -fit a
#      copy whose rows fused into a kernel that cannot launch are made standalone first (kdb nnfusion --fit-launches);
#      tuned-lib: tuned-best without the rows the library beats, by $R/$NET/ops.json (the `ops` step) or OPS_TABLE=file;
#      every contender gets the launch check; NO_PYTORCH=1 skips PyTorch, PYTORCH_MODES=eager,graph picks its modes;
#      RUNS=3 times each contender in 3 processes and keeps the median run; TF32_OFF_RUNS=N (default RUNS) runs a
#      network that calls cuDNN/cuBLAS N more times with NVIDIA_TF32_OVERRIDE=0; the GPU's clocks are logged)
#   bash bench/h200_network.sh ops [DB]        each op's rows (their profile from injection) against cuDNN timed now, in
#                                              PICKS processes (default 3; each op counts cuDNN's fastest pick);
#                                              REPROFILE=1 first times every row again in a quiet process (kdb gpu
#                                              profile --all): the rows' own figures, not their injection's
#   bash bench/h200_network.sh verify KERNELS  kdb inject --verify --profile pace, before/after (bench_verify.py)
# Everything lands in /tmp/kdb-run on the machine; each step leaves results.tgz (and tuned.db) in $OUT.
set -uo pipefail
R=/tmp/kdb-run
NET=${NET:-resnet18}
case "$NET" in resnet18|resnet50) ;; *) echo "NET=$NET: resnet18 or resnet50" >&2; exit 2 ;; esac
N=$R/$NET  # the network's files: NET.onnx, input.bin, reference64.bin, and every step's results for it
# shellcheck disable=SC1091
[ -f /tmp/kdb-device/env.sh ] && source /tmp/kdb-device/env.sh  # TVM and pycuda (stage2); export needs neither
export PYTHONUNBUFFERED=1
mkdir -p "$R/state" "$N"
step=${1:?export|warm-compile|start|wait|items|reinject|network|ops|verify}

copy_out() {  # $OUT takes 8 files at most: the small results go as one archive, rewritten each time
  # shellcheck disable=SC2046  # the names are ours (no spaces); ls drops the patterns that match nothing
  (cd "$R" && tar czf "$OUT/results.tgz" --ignore-failed-read $(ls machine.txt tune*.log tune*.json progress*.jsonl \
    load.jsonl verify.log verify.json reinject.jsonl ./*/summary.txt ./*/table.txt ./*/reprofile.json ./*/ops.log \
    ./*/*.json ./*/*.log ./*/clocks.csv ./*/nnfusion-*/nnfusion_rt/cuda_codegen/nnfusion_rt.cu 2>/dev/null))
  # the tuning records (MetaSchedule's JSON work dirs): carried back as .netrun/state.tgz, a later session
  # resumes them instead of measuring again
  [ -d "$R/state/tuning" ] && tar czf "$OUT/state.tgz" -C "$R" --exclude='tuned.db*' --exclude='*.lock' state/tuning
  [ -f "$R/state/tuned.db" ] && python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); \
d=sqlite3.connect(sys.argv[2]); s.backup(d)" "$R/state/tuned.db" "$OUT/tuned.db"
  return 0
}

stop_pids() {  # ends the process groups whose leaders' ids the file holds (ours: `start` runs each under setsid,
  local pid alive=1  # so a tuning's build workers go with it); true if one was alive
  while read -r pid; do kill -- "-$pid" 2>/dev/null && alive=0; done < <(cat "$1" 2>/dev/null)
  return $alive
}

stop_tuning() {  # timing beside a tuning that still measures would share the GPU
  if stop_pids "$R/tune.pids"; then
    echo "stopped the tuning still running (an op in flight is not injected)"; sleep 2
  fi
}

recorded() {  # trials in MetaSchedule's records under the state dir (whole lines)
  cat "$R"/state/tuning/*/database_tuning_record.json 2>/dev/null | wc -l
}

machine() {  # what the figures depend on beside the code: the host, the GPU's state, the libraries
  { date -u; uname -r; nproc; grep -m1 "model name" /proc/cpuinfo; free -g | head -2
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,pstate \
      --format=csv
    python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, \
'cudnn', torch.backends.cudnn.version())"; } >>"$R/machine.txt" 2>&1
}

case "$step" in
export)
  machine
  for net in resnet18 resnet50; do
    [ -f "$R/$net/$net.onnx" ] || python3 bench/bench_network.py export --net "$net" --out "$R/$net" || exit 1
  done
  copy_out ;;
warm-compile)
  for net in resnet18 resnet50; do  # one process each: its figures are kept apart from the network step's
    timeout "${COMPILE_TIMEOUT:-300}" python3 bench/bench_network.py pytorch-one --net "$net" --out "$R/$net" \
      --modes compile --pick-out "$R/$net/warm-compile.json" || echo "warm-compile $net: exit $?"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['compile']; print(sys.argv[2], 'torch.compile \
max-autotune: set-up %.0f s, %.4f ms, max rel err %.1e' % (r['setup_s'], r['median_ms'], r['error']))" \
      "$R/$net/warm-compile.json" "$net" || true
  done
  copy_out ;;
start)
  [ -n "${2:-}" ] || { echo "start TRIALS [SLEEP] [SHARDS]: trials per op on average" >&2; exit 2; }
  [ -f "$N/$NET.onnx" ] || python3 bench/bench_network.py export --net "$NET" --out "$N" || exit 1
  if [ -f .netrun/state.tgz ]; then tar xzf .netrun/state.tgz -C "$R" && echo "resuming the records of .netrun/state.tgz"; fi
  echo "$(date +%s) $(recorded)" >"$R/started.txt"  # the pace count of `wait` starts here
  stop_pids "$R/sampler.pid"; rm -f "$R/load.jsonl"
  setsid nohup python3 bench/host_load.py sample --out "$R/load.jsonl" --every 5 >/dev/null 2>&1 </dev/null &
  echo $! >"$R/sampler.pid"
  : >"$R/tune.pids"
  shards=${4:-1}; run="run-$(date +%s)"  # the processes claim the ops one at a time (core/tuning/claims.py)
  for k in $(seq 1 "$shards"); do
    setsid nohup python3 bench/bench_tune.py --target cuda --model "$N/$NET.onnx" --trials "${2:?trials}" \
      --batch "${BATCH:-64}" ${POPULATION:+--population "$POPULATION"} ${MINUTES:+--minutes "$MINUTES"} --state "$R/state" --progress "$R/progress-$k.jsonl" --out "$R/tune-$k.json" \
      --join "$run" --max-per-op "${MAX_PER_OP:-256}" --workers $(( $(nproc) / shards )) >"$R/tune-$k.log" 2>&1 </dev/null &
    echo $! >>"$R/tune.pids"
    echo "tuning shard $k/$shards started (pid $!)"
  done
  sleep "${3:-0}"
  tail -q -n 5 "$R"/progress-*.jsonl 2>/dev/null | cut -c1-300
  copy_out ;;
wait)
  end=$((SECONDS + ${2:?seconds}))
  finished() { for f in "$R"/tune-*.log; do grep -q "^ratio:" "$f" || return 1; done; }
  alive() {  # a crashed tuning never writes its ratio: stop waiting
    local pid
    while read -r pid; do kill -0 "$pid" 2>/dev/null && return 0; done < <(cat "$R/tune.pids" 2>/dev/null)
    return 1
  }
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
  stop_tuning
  if [ -n "${REPROFILE:-}" ]; then  # every row timed again now, in a quiet process: its profile is replaced
    python3 -m console.entry gpu profile --all --db "$db" --json >"$N/reprofile.json" 2>&1 || echo "reprofile failed"
  fi
  python3 bench/bench_network.py ops --net "$NET" --out "$N" --db "$db" --picks "${PICKS:-3}" 2>&1 | tee "$N/ops.log"
  copy_out ;;
network)
  [ -x "${2:-}" ] || { echo "network NNFUSION [FALLBACK_DB|-] [DB]: no nnfusion binary at '${2:-}'" >&2; exit 2; }
  nnf=$(realpath "$2")
  fallback=(); [ "${3:--}" != "-" ] && fallback=(--fallback "$(realpath "$3")")
  tuned=$(realpath "${4:-$R/state/tuned.db}")
  ops_table=${OPS_TABLE:-$N/ops.json}; table_arg=(); [ -f "$ops_table" ] && table_arg=(--ops-table "$ops_table")
  runs=${RUNS:-1}
  stop_tuning
  rm -f "$N"/nnfusion-*.json "$N/pytorch.json"  # this call's table only
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 500 >"$N/clocks.csv" 2>&1 &
  clocks=$!
  {
    machine
    python3 bench/bench_network.py dbs --net "$NET" --out "$N" --db "$tuned" "${fallback[@]}" "${table_arg[@]}"
    python3 -c "import sys; from core.db.kernel_db import KernelDB; KernelDB.open(sys.argv[1], create=True).close()" \
      "$N/empty.db"
    [ -n "${NO_PYTORCH:-}" ] || python3 bench/bench_network.py pytorch --net "$NET" --out "$N" --runs "$runs" \
      --modes "${PYTORCH_MODES:-eager,graph,compile}" --timeout "${COMPILE_TIMEOUT:-300}"
    for label in ${CONTENDERS:-tuned-all empty tuned-best}; do  # each result is copied out as soon as it is there
      db=${label%-no-blockfusion}; off=()  # "<db>-no-blockfusion": that DB compiled with BlockFusion off
      [ "$db" != "$label" ] && off=(--flag=-fblockfusion_level=0)
      if [ "${label%-checked}" != "$label" ]; then  # "<db>-checked": NNFusion runs each BlockFusion group on the
        db=${label%-checked}; off=(--flag=-fblockfusion_check_correctness=true)  # GPU and drops one that fails
      fi
      [ -f "$N/${db%-fit}.db" ] || { echo "$label: no $N/${db%-fit}.db (tuned-lib needs an ops table: the ops step)"
                                     continue; }
      if [ "${label%-fit}" != "$label" ]; then  # "<db>-fit": a copy of that DB whose rows fused into a kernel that
        cp "$N/${label%-fit}.db" "$N/$label.db"  # cannot launch are made standalone (kdb nnfusion --fit-launches)
        db=$label
        python3 -m console.entry nnfusion "$N/$NET.onnx" --db "$N/$db.db" --nnfusion "$nnf" \
          --product-name "$(python3 -c 'import torch; print(torch.cuda.get_device_name(0))')" --fit-launches \
          --out "$N/fit-compile-$label" --json >"$N/$label-kdb.json" 2>&1 || echo "$label: kdb nnfusion exit $?"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('made standalone:', r['made_standalone'], \
          'launch failures left:', r['launch_failures'])" "$N/$label-kdb.json" || true
      fi
      timeout 300 python3 bench/bench_network.py nnfusion --net "$NET" --out "$N" --db "$N/$db.db" --nnfusion "$nnf" \
        --label "$label" "${off[@]}" --trace-steps --runs "$runs" --tf32-off-runs "${TF32_OFF_RUNS:-$runs}"
      copy_out
    done
    [ -n "${CONTENDERS:-}" ] || timeout 300 python3 bench/bench_network.py nnfusion --net "$NET" --out "$N" \
      --db "$N/tuned-all.db" --nnfusion "$nnf" --label tuned-all-no-blockfusion --flag=-fblockfusion_level=0 --trace-steps
    python3 bench/bench_network.py summary --out "$N" | tee "$N/summary.txt"
    python3 bench/bench_network.py table --net "$NET" --out "$N" | tee "$N/table.txt"
  } 2>&1 | tee "$OUT/network-$NET.log"
  kill "$clocks" 2>/dev/null
  copy_out ;;
verify)
  python3 bench/bench_verify.py --kernels "${2:?kernel folder}" --workers "$(nproc)" --out "$R/verify.json" \
    2>&1 | tee "$R/verify.log"
  copy_out ;;
esac
