"""kdb model: convert an ONNX model (fp32 -> fp16, by onnxconverter-common's converter)."""

from __future__ import annotations

import argparse
from pathlib import Path

from console.cli.output import out, print_json
from core.opconfigs.fp16_model import convert_to_fp16


def main(args: argparse.Namespace) -> int:
    done = convert_to_fp16(Path(args.source), Path(args.output), keep_io_types=args.keep_io_types)
    if args.json:
        print_json(done.as_dict())
        return 0
    kept = f", {done.float_initializers} left float" if done.float_initializers else ""
    kept += (f"; {done.clamped:,} weight values clamped to half's range (onnxconverter-common: 0 < |x| < 1e-7 to "
             "1e-7, |x| > 1e4 to 1e4)" if done.clamped else "")
    out.print(f"written: {done.output} (fp16: {done.half_initializers} initializers in half{kept}; {done.nodes} "
              f"nodes, {done.casts_added} Casts added; inputs and outputs {done.io_types})",
              markup=False, highlight=False, soft_wrap=True)
    if done.kept_float:
        out.print(f"kept in float: {len(done.kept_float)} depthwise convolution(s) ({', '.join(done.kept_float[:5])}"
                  f"{', ...' if len(done.kept_float) > 5 else ''}), with Casts around them: NNFusion's own half "
                  "depthwise kernel does not compile (core/kernels/cuda_gpu/kernels/depthwise_conv2d.cpp writes "
                  "`float *input = input0;`)", markup=False, highlight=False, soft_wrap=True)
    out.print(f"next: kdb opconfig extract {done.output} -o ops.txt   (half op configs: cublas_dot_op_half|...)",
              markup=False, highlight=False, soft_wrap=True)
    return 0
