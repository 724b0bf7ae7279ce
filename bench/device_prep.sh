#!/usr/bin/env bash
# On the CPU, before bench/device_run.sh: each network's DB through the README's commands (fp16 where the name ends
# in 16), and the tensor-core kernels to verify and time, all into .devrun/s23 (git-excluded; the device call carries
# it). NETS="a b" limits the networks. Models go to /tmp/s23/onnx (too big to carry: the device builds its own).
set -euo pipefail
cd "$(dirname "$0")/.."
K=".venv/bin/python -m console.entry"
D=.devrun/s23
.venv/bin/python bench/zoo_onnx.py /tmp/s23/onnx bert2 gpt vit gru dense se tcn mnv2 convnext towers unetb unet resbn
for n in bert2 gpt; do $K model fp16 /tmp/s23/onnx/$n.onnx /tmp/s23/onnx/${n}16.onnx; done
for n in ${NETS:-bert216 gpt16 gpt vit gru dense se tcn towers unetb unet resbn}; do
  export KDB_STATE_DIR=/tmp/s23/$n KDB_CONFIG=/tmp/s23/$n/settings.toml
  rm -rf /tmp/s23/$n; mkdir -p /tmp/s23/$n; rm -f $D/$n.db*
  $K settings archs=sm_90 "nnfusion_path=${NNFUSION:-../shared/nnfusion/bin/nnfusion}" > /dev/null
  $K opconfig extract /tmp/s23/onnx/$n.onnx -o /tmp/s23/$n/ops.txt > /tmp/s23/$n/extract.log 2>&1
  start=$SECONDS
  $K codegen /tmp/s23/$n/ops.txt --inject --db $D/$n.db > /tmp/s23/$n/codegen.log 2>&1 || echo "$n codegen exit $?"
  echo "$n: $((SECONDS-start)) s, $(grep -c . /tmp/s23/$n/ops.txt) ops"; tail -2 /tmp/s23/$n/codegen.log
done
[ -n "${NETS:-}" ] && exit 0
# BatchMatMuls (BERT's, a ViT's, odd sizes) fp16 and TF32; session 19's 33 fp16 ops (.devrun/validate.txt) again
printf '%s\n' cublas_batch_matmul_op_half\|a+1_12_128_64\|b+1_12_64_128\|o+1_12_128_128 \
  cublas_batch_matmul_op_half\|a+1_12_128_128\|b+1_12_128_64\|o+1_12_128_64 \
  cublas_batch_matmul_op_half\|a+6_197_64\|b+6_64_197\|o+6_197_197 cublas_batch_matmul_op_half\|a+6_197_197\|b+6_197_64\|o+6_197_64 \
  cublas_batch_matmul_op_half\|a+2_3_40_24\|b+2_3_24_36\|o+2_3_40_36 cublas_batch_matmul_op_half\|a+1_4_64_64\|b+1_4_64_64\|o+1_4_64_64 \
  > $D/bmm.txt
sed 's/_half/_float/' $D/bmm.txt > $D/bmm32.txt
.venv/bin/python bench/bench_tensorcore.py sample $D/bmm.txt $D/bmm16.json --per-op 6
.venv/bin/python bench/bench_tensorcore.py sample $D/bmm32.txt $D/bmm32.json --per-op 3 --math tf32
.venv/bin/python bench/bench_tensorcore.py sample bench/tensorcore-ops.txt $D/val.json --per-op 3  # (session 19 timed these)
