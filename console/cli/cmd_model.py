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
    for line in done.report_lines():
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print(f"next: kdb opconfig extract {done.output} -o ops.txt   (half op configs: cublas_dot_op_half|...)",
              markup=False, highlight=False, soft_wrap=True)
    return 0
