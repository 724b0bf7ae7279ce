"""The zoo (tests/zoo.py) through the README's commands, each network as a user types them, in its own folder:

    kdb settings archs=sm_90 "product_name=NVIDIA H200" nnfusion_path=<the compiler>
    kdb opconfig extract model.onnx -o ops.txt
    kdb codegen ops.txt -o kernels.json --arch sm_90
    kdb inject kernels.json
    kdb nnfusion model.onnx --nnfusion <the compiler>

(with `--db kernel_cache.db`, a fresh DB per network). The compiler must run exactly the DB rows coverage promised,
every launch of its code must fit (the launch check ran), and the generated nnfusion_rt.cu must compile with nvcc for
sm_90: with the real cuDNN/cuBLAS headers where the `run` extra is installed (`make test` installs it), else (when no
library call is left) with empty stand-ins for the two headers it includes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from shared_data import shared_path

pytest.importorskip("onnx")
pytest.importorskip("tvm")

from conftest import run_kdb
from onnx_models import write
from zoo import ZOO

from core.cuda.nvcc import find_nvcc
from core.errors import ToolError
from core.nnfusion.build import find_cuda_libraries

COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", shared_path("nnfusion/bin/nnfusion")))
pytestmark = [
    pytest.mark.tvm,
    pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                       "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone"),
]
PRODUCT = "NVIDIA H200"
DB = "kernel_cache.db"
LIBRARY_HEADERS = ("cudnn.h", "cublas_v2.h")  # what nnfusion_rt.cu includes besides CUDA's own

# Networks NNFusion main itself cannot compile, whatever the DB holds (seen with ../shared/nnfusion, and read in its
# sources): `kdb coverage` must name these nodes as blockers and exit 1 before any compiler runs, and the compiler
# must then stop with exactly this. The day it does not, the network joins the others.
COMPILER_FAULTS = {
    # onnx_import/op/conv.cpp checks `n_filters_channels & groups == 0` (& for %): false for every grouped conv that
    # is not depthwise, so ResNeXt's group-32 3x3 aborts the import.
    "resnext_blocks": (("b0_conv2", "b1_conv2"), "n_filters_channels & groups == 0"),
    # The importer's AveragePool drops the pads: NASNet's 3x3 stride-1 pad-1 average comes out 26x26 of a 28x28 input
    # (a MaxPool of the same attributes 28x28), and the Add that joins it to another branch aborts (the b3 pools'
    # Add would pass, and the Concat after it abort).
    "nasnet_cell": (("b2_avg", "b3_avg_a", "b3_avg_b"),
                    "Auto-broadcast not possible for these input shapes: shape1=[1, 44, 26, 26] shape2=[1, 44, 28, 28]"),
    # The ViT block with torch's packed in-projection: a Split along axis -1, its sizes an input, and no split
    # attribute; onnx_import/op/split.cpp reads the axis' length at the raw axis -1 (std::out_of_range).
    "attention_packed": (("qkv",), "unknown attribute 'split'"),
}
# The blockers where NNFusion's ONNX Runtime pre-pass rewrote the model: it merges the two identical b3 pools of one
# input into one (b3_avg_b) and puts it first.
BLOCKERS_REWRITTEN = {"nasnet_cell": ("b3_avg_b", "b2_avg")}

ATTENTION_BMM = ("BatchMatMul6,197,64;6,64,197;6,197,197floatfloatfloat",
                 "BatchMatMul6,197,197;6,197,64;6,197,64floatfloatfloat", "Softmax6,197,197;6,197,197floatfloat")
# Ops each network must run from the DB, beyond "some" (an identifier as the compiler looks it up).
MUST_RUN_FROM_DB = {
    "bert_encoder": ("Dot1,128,768;768,768;1,128,768floatfloatfloat", "Dot1,128,768;768,3072;1,128,3072floatfloatfloat",
                     "Dot1,128,3072;3072,768;1,128,768floatfloatfloat", "Softmax1,12,128,128;1,12,128,128floatfloat"),
    "lstm": ("Dot1,256;256,1024;1,1024floatfloatfloat",),
    "gpt_decoder": ("Softmax1,4,64,64;1,4,64,64floatfloat", "Softmax1,64,1000;1,64,1000floatfloat",
                    "BatchMatMul1,4,64,64;1,4,64,64;1,4,64,64floatfloatfloat",
                    "Dot1,64,256;256,1000;1,64,1000floatfloatfloat"),
    "alexnet": ("Dot1,9216;4096,9216;1,4096floatfloatfloat",),
    # the upsampling, a ConvTranspose or a Resize (NNFusion has no kernel of its own for either: without kdb's row the
    # compile aborts, 'No valid kernel found'), and the skip join: the graph's input first
    "unet_decoder": ("ConvTranspose1,256,28,28;256,128,2,2;1,128,56,56floatfloatfloat",
                     "Concat1,128,56,56;1,128,56,56;1,256,56,56floatfloatfloat"),
    "unet_decoder_bilinear": ("Resize1,256,28,28;4;1,256,56,56floatfloatfloat",
                              "Concat1,128,56,56;1,256,56,56;1,384,56,56floatfloatfloat"),
    "two_towers": ("Concat4,16,64;4,16,32;4,16,96floatfloatfloat", "Concat2,8,16,16;2,8,16,16;2,16,16,16floatfloatfloat",
                   "Softmax4,16,10;4,16,10floatfloat"),
    # 1-D convs and pools are looked up 1-D; the global pool as the importer reshapes it, N,C,L,1 (op/pool.hpp)
    "tcn": ("Convolution1,32,256;64,32,1;1,64,256floatfloatfloatStrides{1}Strides{1}CoordinateDiff{0}",
            "MaxPool1,64,256;1,64,128floatfloatShape{2}Strides{2}Shape{0}Shape{0}",
            "AvgPool1,64,128,1;1,64,1,1floatfloatShape{128, 1}Strides{1, 1}Shape{0, 0}Shape{0, 0}"),
    "gru": ("Dot1,128;768,128;1,768floatfloatfloat", "Dot1,256;768,256;1,768floatfloatfloat"),  # Gemm, transB
    # nn.GRU's ONNX GRU nodes, unrolled by the importer: each step's Dots, the weights transposed first
    "gru_layers": ("Dot1,64;64,256;1,256floatfloatfloat", "Dot1,128;128,256;1,256floatfloatfloat",
                   "Dot1,256;256,128;1,128floatfloatfloat", "Dot1,128;128,128;1,128floatfloatfloat"),
    # the convs after each BatchNormalization + Relu (the Relu a lookup of its own), the transition's pool
    "densenet_block": (
        "Convolution1,128,56,56;32,128,3,3;1,32,56,56floatfloatfloatStrides{1, 1}Strides{1, 1}CoordinateDiff{1, 1}",
        "Convolution1,160,56,56;80,160,1,1;1,80,56,56floatfloatfloatStrides{1, 1}Strides{1, 1}CoordinateDiff{0, 0}",
        "Relu1,160,56,56;1,160,56,56floatfloat",
        "AvgPool1,80,56,56;1,80,28,28floatfloatShape{2, 2}Strides{2, 2}Shape{0, 0}Shape{0, 0}"),
    # the squeeze (global pool), the excitation's 1x1 convs on 1x1 maps (the first with its bias Add and Relu)
    "se_block": (
        "AvgPool1,512,28,28;1,512,1,1floatfloatShape{28, 28}Strides{1, 1}Shape{0, 0}Shape{0, 0}",
        "Convolution1,512,1,1;32,512,1,1;1,32,1,1floatfloatfloatStrides{1, 1}Strides{1, 1}CoordinateDiff{0, 0}"
        "Add1,32,1,1;1,32,1,1;1,32,1,1floatfloatfloatRelu1,32,1,1;1,32,1,1floatfloat",
        "Convolution1,32,1,1;512,32,1,1;1,512,1,1floatfloatfloatStrides{1, 1}Strides{1, 1}CoordinateDiff{0, 0}"),
    # the projections of the sequence-first [197, 1, 384] activations and the MLP's (the batched MatMuls are no lookup)
    # attention's batched products: BatchMatMul rows under OpType Dot (docs/NNFUSION-RULES.md)
    "attention_bmm": ("Dot197,1,384;384,384;197,1,384floatfloatfloat",
                      "Dot1,197,384;384,1536;1,197,1536floatfloatfloat",
                      "Dot1,197,1536;1536,384;1,197,384floatfloatfloat", *ATTENTION_BMM),
    # depthwise convolutions: DepthwiseConv2dNative rows under OpType Dot, the filter as the importer transposes it
    "mobilenet_v2": ("DepthwiseConv2dNative1,144,56,56;3,3,144,1;1,144,28,28floatfloatfloat",
                     "DepthwiseConv2dNative1,960,7,7;3,3,960,1;1,960,7,7floatfloatfloat"),
    # BNs NNFusion folds into their convs: Conv+Add+Relu where a Relu follows, a Conv and its bias Add before the
    # residual Add
    "resnet_unfolded_bn": (
        "Convolution1,3,112,112;64,3,7,7;1,64,56,56floatfloatfloatStrides{2, 2}Strides{1, 1}CoordinateDiff{3, 3}"
        "Add1,64,56,56;1,64,56,56;1,64,56,56floatfloatfloatRelu1,64,56,56;1,64,56,56floatfloat",
        "Convolution1,64,28,28;64,64,3,3;1,64,28,28floatfloatfloatStrides{1, 1}Strides{1, 1}CoordinateDiff{1, 1}"
        "Add1,64,28,28;1,64,28,28;1,64,28,28floatfloatfloatRelu1,64,28,28;1,64,28,28floatfloat",
        "Convolution1,64,28,28;256,64,1,1;1,256,28,28floatfloatfloatStrides{1, 1}Strides{1, 1}CoordinateDiff{0, 0}"),
    "convnext_block": (
        "DepthwiseConv2dNative1,96,56,56;7,7,96,1;1,96,56,56floatfloatfloat",
        "Convolution1,96,56,56;384,96,1,1;1,384,56,56floatfloatfloatStrides{1, 1}Strides{1, 1}CoordinateDiff{0, 0}",
        "Convolution1,384,56,56;96,384,1,1;1,96,56,56floatfloatfloatStrides{1, 1}Strides{1, 1}CoordinateDiff{0, 0}"),
}
# ... where NNFusion's ONNX Runtime pre-pass rewrote the model (the compiler's python3 has onnxruntime): BERT's
# MatMul+Add are 2-D Gemms then, and so are the ViT block's.
MUST_RUN_FROM_DB_REWRITTEN = {
    **MUST_RUN_FROM_DB,
    "bert_encoder": ("Dot128,768;768,768;128,768floatfloatfloat", "Dot128,768;768,3072;128,3072floatfloatfloat",
                     "Dot128,3072;3072,768;128,768floatfloatfloat"),
    "attention_bmm": ("Dot197,384;384,384;197,384floatfloatfloat", "Dot197,384;384,1536;197,1536floatfloatfloat",
                      "Dot197,1536;1536,384;197,384floatfloatfloat", *ATTENTION_BMM),
}


def kdb(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run_kdb(*args, cwd=work)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # whatever the outcome, never a crash
    return proc


def said(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


def nvcc_compiles(project: Path, work: Path, library_calls: dict[str, int]) -> None:
    """nnfusion_rt.cu compiles for sm_90: with the cuDNN/cuBLAS headers `kdb nnfusion --run` builds with (the `run`
    extra's wheels, which `make test` installs), else with empty stand-ins when the code calls no library (skip
    otherwise, saying why)."""
    nvcc = find_nvcc("")
    try:
        includes = list(find_cuda_libraries(nvcc).include_dirs)
    except ToolError as exc:
        if library_calls:
            pytest.skip(f"nnfusion_rt.cu calls {library_calls}: compiling it needs the cuDNN/cuBLAS headers ({exc})")
        includes = [work / "no-libraries"]
        includes[0].mkdir(exist_ok=True)
        for header in LIBRARY_HEADERS:
            (includes[0] / header).write_text("// included, nothing from it called\n", encoding="utf-8")
    proc = subprocess.run([nvcc, "-c", "-gencode", "arch=compute_90,code=sm_90", "--expt-relaxed-constexpr",
                           *(f"-I{i}" for i in includes), "nnfusion_rt.cu", "-o", str(work / "rt.o")],
                          cwd=project, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow  # 10-45 s each on 2 busy cores: started first, so none runs on alone at the end
@pytest.mark.parametrize("name", list(ZOO))
def test_the_network_compiles_with_the_kernels_kdb_made(tmp_path: Path, name: str):
    write(ZOO[name](), tmp_path / "model.onnx")
    # the compiler extraction reads the model as (its ONNX Runtime pre-pass, where its python3 has onnxruntime)
    assert kdb(tmp_path, "settings", "archs=sm_90", f"product_name={PRODUCT}", f"nnfusion_path={COMPILER}").returncode == 0
    if name in COMPILER_FAULTS:  # said before any compiler runs
        coverage = kdb(tmp_path, "coverage", "model.onnx", "--db", DB, "--json")
        assert coverage.returncode == 1, said(coverage)
        said_first = json.loads(coverage.stdout)
        blockers, rewritten = said_first["blockers"], said_first["prepass"]["applied"]
        expected = BLOCKERS_REWRITTEN.get(name, COMPILER_FAULTS[name][0]) if rewritten else COMPILER_FAULTS[name][0]
        assert tuple(b["node"] for b in blockers) == expected, blockers
    extract = kdb(tmp_path, "opconfig", "extract", "model.onnx", "-o", "ops.txt", "--json")
    assert (tmp_path / "ops.txt").is_file(), said(extract)
    must_run = (MUST_RUN_FROM_DB_REWRITTEN if json.loads(extract.stdout)["prepass"]["applied"] else MUST_RUN_FROM_DB)
    codegen = kdb(tmp_path, "codegen", "ops.txt", "-o", "kernels.json", "--arch", "sm_90", "--db", DB)
    assert codegen.returncode == 0, said(codegen)
    inject = kdb(tmp_path, "inject", "kernels.json", "--db", DB)
    assert inject.returncode == 0, said(inject)
    compiled = kdb(tmp_path, "nnfusion", "model.onnx", "--db", DB, "--nnfusion", str(COMPILER), "--json")
    report = json.loads(compiled.stdout)
    outcome = (f"exit {compiled.returncode}: {report['reason']}\n" + "\n".join(report["decisive_lines"])
               + f"\nlaunch check: {report['launch_check'] and report['launch_check']['error']}; cannot launch: "
               f"{report['launch_failures']}; broken promises: {report['broken_promises']}")
    if name in COMPILER_FAULTS:
        assert compiled.returncode == 1 and not report["ok"], "the compiler now takes it: give it the full checks"
        assert COMPILER_FAULTS[name][1] in "\n".join([report["reason"], *report["decisive_lines"]]), outcome
        return
    assert compiled.returncode == 0, outcome
    assert report["ok"] and report["product_name"] == PRODUCT
    promised, used = set(report["promised"]), set(report["usage"]["db_rows_used"])
    assert promised, "every network here has ops the DB serves"
    assert used == promised, f"used but not promised {sorted(used - promised)}; promised, not used {sorted(promised - used)}"
    pieces = [node for group in report["usage"]["blockfusion_groups"] for node in group]  # each named by its tensor
    assert len(pieces) == len(set(pieces)) and not [n for n in pieces if "sharing" in n], pieces
    summary = json.loads(kdb(tmp_path, "coverage", "model.onnx", "--db", DB, "--json").stdout)["summary"]
    nodes = report["usage"]["nodes_run_by"]["DB kernel"]  # the compiled code's nodes that run a DB row
    assert summary["ops"]["in DB"] == nodes, f"coverage: {summary['ops']}; the compiled code: {nodes} nodes on DB rows"
    from_db = {e["identifier"] for e in report["coverage"] if e["row"] and e["row"]["key"] in used}
    assert not set(must_run.get(name, ())) - from_db, f"run from the DB: {sorted(from_db)}"
    check = report["launch_check"]  # ran on the generated device code: compiled, every launch fits
    assert check is not None and check["arch"] == "sm_90", outcome
    assert not check["error"] and check["launches"] and not report["launch_failures"], check["error"]
    nvcc_compiles(Path(report["compile"]["project"]), tmp_path, report["usage"]["library_calls"])
