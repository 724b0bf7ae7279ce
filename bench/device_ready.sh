#!/usr/bin/env bash
# Everything the next device session's plan (docs/BENCHMARKS.md, "Next device session") carries, made on the CPU in a
# fresh checkout with ../shared beside it, in one command. A checkout starts without .device/, .devrun/ and .netrun/
# (git-excluded); each step below remakes one part of them:
#   bash bench/device_ready.sh          (the codegen of the networks' DBs is most of its time)
set -euo pipefail
cd "$(dirname "$0")/.."
make .venv/.installed .venv/.run-extra
bash bench/device_carry.sh                   # .device/n, .device/s23w, .netrun/carry (the compiler, wheels)
bash ../shared/device/bundle.sh              # .device/a, .device/b: TVM and pycuda for the device
bash bench/device_tvm.sh split               # .device/a1, .device/a2: the TVM library in two calls
bash bench/h100_tensorcore.sh prep           # .netrun/carry: the fp16 and TF32 DBs, tf32.json
bash bench/device_prep.sh                    # .devrun/s23: the zoo's DBs (device_run.sh's never-slower)
NETS="mnv2 convnext" bash bench/device_prep.sh   # ... and the plan's step 2 (not in device_prep's default list)
.venv/bin/python bench/device_seed.py --tuned-dbs   # .device/seed; .netrun/carry/*-tuned.db
du -sh .device/* .devrun/* .netrun/carry
