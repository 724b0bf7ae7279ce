#!/usr/bin/env bash
# Remakes, on the CPU, the git-excluded folders the device scripts carry when a checkout starts without them:
#   .device/n      pycuda (../shared/device/wheels) and the console's pure-Python needs the GPU image lacks
#   .device/s23w   sqlmodel, sqlalchemy, pydantic (cp312): the state file's
#   .netrun/carry  the NNFusion compiler (../shared/nnfusion) and onnxconverter-common's wheel (`kdb model fp16`)
# The DBs come after, from `bash bench/h100_tensorcore.sh prep` and `bash bench/device_prep.sh`.
# The image's own packages (numpy, onnx, rich, psutil, cuda-bindings: see the device tool's KINDS.md) are not carried.
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /.device/ /.netrun/ /.devrun/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
rm -rf .device/n .device/s23w .netrun/carry/whl .netrun/carry/nnfusion
mkdir -p .device/n/wheels .device/s23w .netrun/carry/whl
cp ../shared/device/wheels/pycuda-*-cp312-*.whl .device/n/wheels/
python3 -m pip download -q "${plat[@]}" -d .device/n/wheels pytools mako textual tomli-w platformdirs uc-micro-py
rm -f .device/n/wheels/{rich,pygments,markdown_it_py,mdurl,typing_extensions,markupsafe,MarkupSafe}-*.whl
python3 -m pip download -q "${plat[@]}" -d .device/s23w sqlmodel
rm -f .device/s23w/typing_extensions-*.whl
python3 -m pip download -q --no-deps -d .netrun/carry/whl onnxconverter-common==1.16.0
cp -r ../shared/nnfusion .netrun/carry/nnfusion
du -sh .device/n .device/s23w .netrun/carry
