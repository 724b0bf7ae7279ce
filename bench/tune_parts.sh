#!/usr/bin/env bash
# The op lists bench/h100_tune.sh tunes, one per process, written to DIR/{bert,conv1,conv2}.txt (bench/device_seed.py
# seeds the same lists). Session 31: the five ops still above 1.0x cuDNN/cuBLAS fp16 after 128 trials.
set -euo pipefail
DIR=$1; OPS=$(dirname "$0")/tensorcore-ops.txt
mkdir -p "$DIR"
grep -E 'a\+1_128_768\|b\+768_768\||i\+1_512_7_7\|w\+512_512_3_3' "$OPS" > "$DIR/bert.txt"
grep -E 'i\+1_256_14_14\|w\+256_256_3_3|i\+1_64_56_56\|w\+256_64_1_1' "$OPS" > "$DIR/conv1.txt"
grep -E 'i\+1_256_28_28\|w\+256_256_3_3' "$OPS" > "$DIR/conv2.txt"
