"""kdb model: convert an ONNX model (fp32 -> fp16, by onnxconverter-common's converter; ops NNFusion cannot import
written out as ONNX's own definitions of them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from console.cli.output import out, print_json
from core.opconfigs.expand_functions import expand_functions
from core.opconfigs.fp16_model import convert_to_fp16


def main(args: argparse.Namespace) -> int:
    status = 0
    if args.model_command == "expand":
        expansion = expand_functions(Path(args.source), Path(args.output), dict(args.dim))
        # what NNFusion still cannot compile, or compiles into another network, is a finding
        done, status = expansion, 1 if expansion.blocked or expansion.miscompiled else 0
        next_step = (f"next: kdb coverage {done.output}   (it says why each node named above cannot compile, or "
                     "compiles into another network: change the model there first)" if status else
                     f"next: kdb coverage {done.output}   (then the README's steps with it)")
    else:
        done = convert_to_fp16(Path(args.source), Path(args.output), keep_io_types=args.keep_io_types)
        next_step = f"next: kdb opconfig extract {done.output} -o ops.txt   (half op configs: cublas_dot_op_half|...)"
        if done.expand_helps:  # (what NNFusion cannot compile as written: expand rewrites what it can)
            expanded = done.output.with_name(f"{done.output.stem}x{done.output.suffix}")
            dims = "".join(f" --dim {name}=1" for name in done.dynamic_dims)
            sizes = "; each --dim the size to compile for: 1, or yours" if dims else ""
            next_step = (f"next: kdb model expand {done.output} {expanded}{dims}   (then the README's steps with "
                         f"it{sizes})")
        elif done.left_by_expand:  # a finding, as expand's exit says of the same nodes
            status, next_step = 1, f"next: kdb coverage {done.output}   (it says why each cannot compile)"
    if args.json:
        print_json(done.as_dict())
        return status
    for line in [*done.report_lines(), next_step]:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    return status
