#!/usr/bin/env bash
# Issue 40 on one H100 or H200: ResNet-50 in fp16 tuned from nothing as one network inside a time budget, on the
# tensor cores, then every contender of the table on the same warm machine:
#   call 1: bash .device/a/stage1.sh                    (carry .device/a; bench/results moved aside: 64 MiB a call)
#   call 2: MINUTES=12 bash bench/h100_resnet50_fp16.sh tune       (carry .device/b .netrun/carry/whl)
#     stage2; the zoo's ResNet-50 (tests/zoo.py: torchvision's shapes, BN folded) made fp16 by `kdb model fp16`;
#     tuned by 4 processes side by side (h200_network.sh start: claims, 4 build workers each), each stopping at
#     MINUTES (bench_tune --minutes, kdb tune's time budget: the op in flight injects its best so far)
#   call 3: bash bench/h100_resnet50_fp16.sh table
#     (carry .netrun/carry/nnfusion .netrun/carry/resnet50.db .netrun/carry/resnet18-fp16.db .netrun/carry/whl)
#     the tuning followed to its end; each op's row against cuDNN/cuBLAS fp16 timed now in one quiet process
#     (bench_tune --report-only); tuned-best.db = the tuned rows + session 19's untuned rows (.netrun/carry/resnet50.db)
#     for the ops the budget left; ResNet-50 (that DB) and ResNet-18 (untuned codegen rows) in fp16 through
#     `kdb nnfusion --run` (ONNX Runtime's output, NNFusion's empty DB beside), then --op-times, leave-to-library
#     and --run again (bench_zoo_run)
#   call 4: bash bench/h100_resnet50_fp16.sh baselines  (carry .devrun/defaults)
#     PyTorch's CUDA graph (ResNet-18, ResNet-50, two BERT layers; fp16, fp32 as shipped, fp32 TF32 off), and issue
#     39's untuned default schedules against the library (bench_default_schedules.py time)
# $OUT: results.tgz / state.tgz / tuned.db (h200_network.sh's), table.tgz (every log and JSON of calls 3-4).
set -uo pipefail
R=/tmp/kdb-run
site=/tmp/kdb-device/site
export PYTHONUNBUFFERED=1
nnf=$PWD/.netrun/carry/nnfusion/bin/nnfusion
pack() {  # the logs and JSON only ($OUT takes 8 files of 16 MiB at most)
  (cd /tmp/kdb-table && find . -maxdepth 4 \( -name '*.json' -o -name '*.txt' -o -name '*.log' -o -name '*.out' \) \
    -size -4M | tar czf "$OUT/table.tgz" -T -)
}
mkdir -p /tmp/kdb-table /tmp/net
case "${1:-}" in
  tune)
    bash .device/b/stage2.sh || exit 3
    python3 -m pip install -q --no-index --no-deps --no-compile --target $site .netrun/carry/whl/*.whl || exit 3
    # shellcheck disable=SC1091
    . /tmp/kdb-device/env.sh
    python3 - <<'PY'
import sys; sys.path.insert(0, "tests")
import onnx, zoo
from onnx_models import resnet
for name, model in (("resnet50", zoo.resnet50(blocks=(3, 4, 6, 3))), ("resnet18", resnet(blocks=(2, 2, 2, 2)))):
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, f"/tmp/net/{name}.onnx")
PY
    mkdir -p $R/resnet50
    python3 -m console.entry model fp16 /tmp/net/resnet50.onnx $R/resnet50/resnet50.onnx || exit 4
    NET=resnet50 BATCH=${BATCH:-64} MAX_PER_OP=256 MINUTES=${MINUTES:?minutes of tuning} \
      bash bench/h200_network.sh start "${TRIALS:-96}" 5 4
    NET=resnet50 bash bench/h200_network.sh wait $((${TUNE_WAIT:-570} - SECONDS)) ;;
  table)
    # shellcheck disable=SC1091
    . /tmp/kdb-device/env.sh
    NET=resnet50 bash bench/h200_network.sh wait $((${WAIT:-330} - SECONDS))
    timeout 120 python3 bench/bench_tune.py --target cuda --model $R/resnet50/resnet50.onnx --state $R/state \
      --report-only --out /tmp/kdb-table/ops.json 2>&1 | tee /tmp/kdb-table/ops.log | grep -v "^no library"
    python3 - <<'PY' 2>&1 | tee /tmp/kdb-table/dbs.log
import sys; from pathlib import Path; sys.path.insert(0, "bench")
from bench_network import part_dbs
part_dbs(Path("/tmp/kdb-run/resnet50"), Path("/tmp/kdb-run/state/tuned.db"), Path(".netrun/carry/resnet50.db"))
PY
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    r18=(--model resnet18 /tmp/net/resnet18.onnx .netrun/carry/resnet18-fp16.db); [ -n "${NO_RESNET18:-}" ] && r18=()
    timeout 380 python3 bench/bench_zoo_run.py --nnfusion "$nnf" --out /tmp/kdb-table/zoo --jobs 1 --product "$gpu" \
      --fp16 --leave-to-library --nets --model resnet50 /tmp/net/resnet50.onnx $R/resnet50/tuned-best.db \
      "${r18[@]}" > /tmp/kdb-table/zoo.out 2>&1
    echo "zoo: exit $?"; cat /tmp/kdb-table/zoo.out
    pack ;;
  baselines)
    # shellcheck disable=SC1091
    . /tmp/kdb-device/env.sh
    [ -n "${NO_DEFAULTS:-}" ] || timeout 120 python3 bench/bench_default_schedules.py time .devrun/defaults > /tmp/kdb-table/defaults.log 2>&1
    echo "defaults: exit $?"; cat /tmp/kdb-table/defaults.log
    timeout 300 python3 bench/bench_torch_baselines.py --out /tmp/kdb-table > /tmp/kdb-table/torch.log 2>&1
    echo "torch: exit $?"; tail -9 /tmp/kdb-table/torch.log
    pack ;;
  *) echo "usage: $0 tune|table|baselines"; exit 2 ;;
esac
