"""What NNFusion cannot compile whatever the kernel DB holds (core/opconfigs/nnfusion_import.py): each pattern as a
one-node model, found by kdb before any compiler runs, and held against the real compiler (it fails on the blocked
form and compiles the written-out one). `kdb coverage` names the node and exits 1; `kdb nnfusion` says it before
compiling and reports the compiler's decisive lines."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from shared_data import shared_path

pytest.importorskip("onnx")

from conftest import run_kdb, run_kdb_json
from onnx import ModelProto, TensorProto, helper
from onnx_models import IR_VERSION, GraphBuilder, write

from core.opconfigs.nnfusion_import import Blocker, import_blockers, import_faults
from core.opconfigs.onnx_extract import extract

COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", shared_path("nnfusion/bin/nnfusion")))
needs_compiler = pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                                    "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone")
X = {"x": [1, 4, 8, 8]}


def one(op: str, inputs: list[str] | None = None, opset: int = 17, shape: dict | None = None,
        extra: Callable[[GraphBuilder], list[str]] | None = None, **attrs: object) -> ModelProto:
    """A model of one node (named "n") on x."""
    g = GraphBuilder(shape or X)
    ins = ["x", *(extra(g) if extra else [])] if inputs is None else inputs
    return g.model(g.node(op, ins, "n", **attrs), op.lower(), opset=opset)


def gru(x: list[int] | None = None, lengths: bool = False, **attrs: object) -> ModelProto:
    """A GRU (hidden 8) of both outputs on x [3, 1, 4], as torch writes it (the importer returns Y and Y_h)."""
    g = GraphBuilder({"x": x or [3, 1, 4]})
    inputs = ["x", g.weight("W", [1, 24, 4]), g.weight("R", [1, 24, 8])]
    if lengths:
        inputs += [g.weight("B", [1, 48]), g.constant("lengths", [3], "int32")]
    g.nodes.append(helper.make_node("GRU", inputs, ["y", "y_h"], name="n", hidden_size=8, **attrs))
    graph = helper.make_graph(g.nodes, "gru", g.inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def conv_weight(g: GraphBuilder) -> list[str]:
    return [g.weight("w", [4, 4, 3, 3])]


# (pattern, the blocked model, the same written the way NNFusion takes it, or None when there is none)
CASES: dict[str, tuple[Callable[[], ModelProto], Callable[[], ModelProto] | None]] = {
    "Flatten without axis": (lambda: one("Flatten"), lambda: one("Flatten", axis=1)),
    "Gemm without C": (lambda: one("Gemm", shape={"x": [1, 16]}, extra=lambda g: [g.weight("w", [16, 8])]),
                       lambda: one("Gemm", shape={"x": [1, 16]},
                                   extra=lambda g: [g.weight("w", [16, 8]), g.weight("c", [8])])),
    # gemm.cpp reads C only for a beta other than 0: a Dot alone (`kdb nnfusion --op-times` rebuilds a transposed
    # Dot so)
    "Gemm without C, beta not 0": (lambda: one("Gemm", shape={"x": [1, 16]}, extra=lambda g: [g.weight("w", [8, 16])],
                                               transB=1, beta=0.5),
                                   lambda: one("Gemm", shape={"x": [1, 16]}, extra=lambda g: [g.weight("w", [8, 16])],
                                               transB=1, beta=0.0)),
    "Unsqueeze with axes as an input": (lambda: one("Unsqueeze", extra=lambda g: [g.constant("axes", [0])]),
                                        lambda: one("Unsqueeze", opset=11, axes=[0])),
    "Dropout without ratio 0": (lambda: one("Dropout", opset=11), lambda: one("Dropout", opset=11, ratio=0.0)),
    "Conv with auto_pad": (lambda: one("Conv", extra=conv_weight, kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
                           lambda: one("Conv", extra=conv_weight, kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "1-D Conv without kernel_shape": (lambda: one("Conv", shape={"x": [1, 4, 8]}, extra=lambda g: [g.weight("w", [4, 4, 3])]),
                                      lambda: one("Conv", shape={"x": [1, 4, 8]}, extra=lambda g: [g.weight("w", [4, 4, 3])],
                                                  kernel_shape=[3])),
    "Split on a negative axis without split": (lambda: one("Split", axis=-1), lambda: one("Split", axis=3)),
    "AveragePool without strides": (lambda: one("AveragePool", kernel_shape=[2, 2]),
                                    lambda: one("AveragePool", kernel_shape=[2, 2], strides=[1, 1])),
    "AveragePool over one axis": (lambda: one("AveragePool", shape={"x": [1, 4, 8]}, kernel_shape=[3], strides=[1]),
                                  lambda: one("AveragePool", shape={"x": [1, 4, 8, 1]}, kernel_shape=[3, 1],
                                              strides=[1, 1])),
    "grouped conv, not depthwise": (lambda: one("Conv", extra=lambda g: [g.weight("w", [4, 2, 3, 3])], group=2,
                                                kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                                    lambda: one("Conv", extra=conv_weight, kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "depthwise conv with two filters a channel": (
        lambda: one("Conv", extra=lambda g: [g.weight("w", [8, 1, 3, 3])], group=4, kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1]),
        lambda: one("Conv", extra=lambda g: [g.weight("w", [4, 1, 3, 3])], group=4, kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1])),
    "Pad without attributes": (lambda: one("Pad", extra=lambda g: [g.constant("pads", [0, 0, 1, 1, 0, 0, 1, 1])]),
                               lambda: one("Pad", extra=lambda g: [g.constant("pads", [0, 0, 1, 1, 0, 0, 1, 1])],
                                           mode="constant")),
    # (before opset 11 the importer reads the attributes by position: mode, pads, value; checked the other orders)
    "Pad with pads as an attribute": (lambda: one("Pad", opset=2, pads=[0, 0, 1, 1, 0, 0, 1, 1]),
                                      lambda: one("Pad", opset=2, mode="constant", pads=[0, 0, 1, 1, 0, 0, 1, 1],
                                                  value=0.0)),
    "Pad of attributes, without value": (lambda: one("Pad", opset=10, mode="constant", pads=[0, 0, 1, 1, 0, 0, 1, 1]),
                                         lambda: one("Pad", opset=10, mode="constant", pads=[0, 0, 1, 1, 0, 0, 1, 1],
                                                     value=0.0)),
    "an op without translator or generic op": (lambda: one("Elu"), lambda: one("Sign")),  # Sign: a generic op
    "ArgMin (a VQ-VAE's nearest code)": (lambda: one("ArgMin", axis=1), None),  # translated, no CUDA kernel
    # op/leaky_relu.hpp: Maximum(x, x * alpha), which is LeakyRelu only for alpha in [0, 1]; it checks that
    "LeakyRelu with alpha above 1": (lambda: one("LeakyRelu", alpha=1.5), lambda: one("LeakyRelu", alpha=0.2)),
    "GRU": (lambda: one("GRU", shape={"x": [3, 1, 4]}, hidden_size=8,
                        extra=lambda g: [g.weight("W", [1, 24, 4]), g.weight("R", [1, 24, 8])]), None),
    "Upsample": (lambda: one("Upsample", opset=9, extra=lambda g: [g.constant("scales", [1, 1, 2, 2], "float32")]),
                 None),
    # a ConvTranspose kdb makes a row for is no blocker (tests/test_conv_transpose.py); a non-square kernel fails a
    # CHECK of NNFusion's ConvTranspose
    "ConvTranspose, 3x1": (lambda: one("ConvTranspose", extra=lambda g: [g.weight("w", [4, 4, 3, 1])],
                                       kernel_shape=[3, 1]), None),
    # op/gru.cpp's CHECKs: what it does not translate aborts the import
    "GRU with clip": (lambda: gru(clip=2.0), gru),
    "GRU with activations": (lambda: gru(activations=["Sigmoid", "Tanh"]), gru),
    "GRU of layout 1": (lambda: gru(x=[1, 3, 4], layout=1), gru),
    "GRU with sequence_lens": (lambda: gru(lengths=True), gru),
    "LSTM": (lambda: one("LSTM", shape={"x": [3, 1, 4]}, hidden_size=8,
                         extra=lambda g: [g.weight("W", [1, 32, 4]), g.weight("R", [1, 32, 8])]), None),
    # a Resize kdb makes a row for is no blocker (tests/test_resize.py); one by a scale that gives no whole size
    # (8 x 1.3) has neither a row nor a kernel of NNFusion's own
    "Resize by a scale kdb takes not": (
        lambda: one("Resize", extra=lambda g: ["", g.constant("scales", [1, 1, 1.3, 1.3], "float32")]), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kdb_finds_the_node_before_any_compiler_runs(case: str):
    blocked, fixed = CASES[case]
    model = blocked()
    (blocker,) = import_blockers(model)
    assert blocker == Blocker("n", model.graph.node[0].op_type, blocker.reason) and blocker.reason
    if fixed is not None:
        assert import_blockers(fixed()) == []


def nnfusion(model: ModelProto, work: Path) -> subprocess.CompletedProcess[str]:
    work.mkdir(parents=True)
    path = write(model, work / "m.onnx")
    return subprocess.run([str(COMPILER), str(path), "-f", "onnx", f"-fkernel_cache_path={work / 'k.db'}"], cwd=work,
                          capture_output=True, text=True, timeout=300)


def compiled_code(proc: subprocess.CompletedProcess[str], work: Path, kind: str) -> Path:
    """The project's nnfusion_rt.cu, once the compiler in `work` aborted at a blocker (writing none) or compiled."""
    code = work / "nnfusion_rt" / "cuda_codegen" / "nnfusion_rt.cu"
    if kind == "blocker":
        assert proc.returncode != 0 and not code.exists(), proc.stdout[-2000:]
    else:
        assert proc.returncode == 0 and code.is_file(), proc.stdout[-3000:]
    return code


@needs_compiler
@pytest.mark.parametrize("case", list(CASES))
def test_the_real_compiler_fails_where_kdb_says_and_compiles_the_written_out_form(tmp_path: Path, case: str):
    blocked, fixed = CASES[case]
    compiled_code(nnfusion(blocked(), tmp_path / "blocked"), tmp_path / "blocked", "blocker")
    if fixed is not None:
        compiled_code(nnfusion(fixed(), tmp_path / "fixed"), tmp_path / "fixed", "compiles")


def flatten_network(tmp_path: Path) -> Path:
    """A conv network whose classifier's Flatten has no axis (as a hand-built AlexNet had it)."""
    g = GraphBuilder({"x": [1, 3, 16, 16]})
    y = g.node("Relu", [g.conv("x", 3, 8, 3, name="conv")], "relu")
    y = g.node("Flatten", [g.node("GlobalAveragePool", [y], "pool")], "flatten")
    y = g.node("Gemm", [y, g.weight("fc_w", [10, 8]), g.weight("fc_b", [10])], "fc", transB=1)
    return write(g.model(y, "flatten_net"), tmp_path / "flatten_net.onnx")


def test_kdb_coverage_names_the_node_and_exits_1(tmp_path: Path):
    model = flatten_network(tmp_path)
    assert [b.node for b in extract(model).blockers] == ["flatten"]
    proc, report = run_kdb_json("coverage", str(model), "--db", str(tmp_path / "k.db"))
    assert proc.returncode == 1
    (blocker,) = report["blockers"]
    assert (blocker["node"], blocker["op_type"]) == ("flatten", "Flatten") and "axis" in blocker["reason"]
    text = run_kdb("coverage", str(model), "--db", str(tmp_path / "k.db"))
    flat = " ".join(text.stdout.split())
    assert text.returncode == 1 and "NNFusion cannot compile flatten_net" in flat
    assert "node flatten (Flatten): Flatten without its axis attribute" in flat
    extracted = run_kdb("opconfig", "extract", str(model))  # extraction says it too (exit 1 since session 30, as
    assert extracted.returncode == 1 and "node flatten (Flatten)" in " ".join(extracted.stdout.split())  # coverage)


@needs_compiler
def test_kdb_nnfusion_says_it_before_compiling_and_gives_the_compilers_decisive_lines(tmp_path: Path):
    model = flatten_network(tmp_path)
    args = ("nnfusion", str(model), "--db", str(tmp_path / "k.db"), "--nnfusion", str(COMPILER))
    text = run_kdb(*args, "--out", str(tmp_path / "text"))
    assert text.returncode == 1
    flat = " ".join(text.stdout.split())
    said, failed = flat.find("node flatten (Flatten)"), flat.find("NNFusion failed")
    assert 0 <= said < failed, flat
    assert "killed by SIGABRT while importing ONNX node flatten" in flat
    assert "Node (flatten): unknown attribute 'axis'" in flat
    proc, report = run_kdb_json(*args, "--out", str(tmp_path / "json"))
    assert proc.returncode == 1 and not report["ok"]
    assert report["decisive_lines"][0] == "while importing ONNX node flatten"
    assert any("unknown attribute 'axis'" in line for line in report["decisive_lines"])
    assert not any("onnxruntime" in line for line in report["decisive_lines"])  # every run's noise left out
    assert [b["node"] for b in report["blockers"]] == ["flatten"]


async def test_the_consoles_coverage_names_the_node_nnfusion_cannot_compile(tmp_path: Path):
    from console_helpers import FixedDeviceApp
    from test_console_opconfigs import import_path, open_view, text, wait_for

    from console.context import ConsoleContext
    from core.db.kernel_db import KernelDB
    from core.settings import Settings

    model = flatten_network(tmp_path)
    KernelDB.create_if_missing(tmp_path / "k.db")
    app = FixedDeviceApp(ConsoleContext(db_path=tmp_path / "k.db", settings=Settings(workers=1),
                                        device_summary="no CUDA device (test)"))
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, model, len(extract(model).configs))
        assert "cannot compile" not in text(screen, "#opconfigs-status")  # said with coverage (c)
        await pilot.press("c")
        await wait_for(pilot, lambda: len(screen.coverage) == len(screen.configs))
        status = " ".join(text(screen, "#opconfigs-status").split())
        assert "NNFusion cannot compile flatten_net: node flatten (Flatten): Flatten without its axis" in status


# NNFusion's importer drops an AveragePool's pads, auto_pad and ceil_mode (the first of its two AveragePool
# translators wins): a 3x3 stride-1 pool padded by 1 comes out 26x26 of a 28x28 input. Each case: the model, whether
# kdb calls the pool a blocker (the compile aborts downstream) or a wrong-shape warning (it compiles another network),
# and what the compiler shows.
POOL_X = {"x": [1, 4, 28, 28]}


def padded_pool(g: GraphBuilder, x: str = "x", name: str = "n", **attrs: object) -> str:
    return g.node("AveragePool", [x], name, **{"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                                                **attrs})


def pool_model(build: Callable[[GraphBuilder], str], shape: dict | None = None) -> ModelProto:
    import onnx

    g = GraphBuilder(shape or POOL_X)
    return onnx.shape_inference.infer_shapes(g.model(build(g), "pool"))


POOL_CASES: dict[str, tuple[Callable[[], ModelProto], str, str]] = {
    "then an Add of the input": (lambda: pool_model(lambda g: g.node("Add", [padded_pool(g), "x"], "add")), "blocker",
                                 "Auto-broadcast not possible for these input shapes: shape1=[1, 4, 26, 26] "
                                 "shape2=[1, 4, 28, 28]"),
    "then a Relu, then a Mul by the input": (
        lambda: pool_model(lambda g: g.node("Mul", [g.node("Relu", [padded_pool(g, count_include_pad=1)], "r"), "x"],
                                            "mul")), "blocker", "Auto-broadcast not possible"),
    "then a Concat with the input": (lambda: pool_model(lambda g: g.node("Concat", [padded_pool(g), "x"], "cat",
                                                                         axis=1)), "blocker", "type 'Concat'"),
    "two of them added": (lambda: pool_model(lambda g: g.node("Add", [padded_pool(g), padded_pool(g, name="m")],
                                                              "add")), "warning", "{1, 4, 26, 26}"),
    "then a Conv": (lambda: pool_model(lambda g: g.conv(padded_pool(g), 4, 4, 3, pad=1, name="c")), "warning",
                    "{1, 4, 26, 26}"),
    "ceil_mode": (lambda: pool_model(lambda g: padded_pool(g, kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0],
                                                           ceil_mode=1), {"x": [1, 4, 27, 27]}),
                  "warning", "{1, 4, 13, 13}"),  # ONNX: 14x14
    "padded below, the same shape": (lambda: pool_model(lambda g: padded_pool(g, strides=[2, 2], pads=[1, 1, 0, 0]),
                                                        {"x": [1, 4, 29, 29]}), "warning", "{1, 4, 14, 14}"),
    "auto_pad SAME_UPPER, stride 2": (lambda: pool_model(lambda g: g.node(
        "AveragePool", ["x"], "n", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"), {"x": [1, 4, 28, 28]}),
        "warning", "{1, 4, 13, 13}"),  # ONNX: 14x14
}


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_an_average_pool_nnfusion_pools_without_padding_is_named(case: str):
    build, kind, _ = POOL_CASES[case]
    blockers, warnings = import_faults(build())
    found = blockers if kind == "blocker" else warnings
    assert [f.node for f in found] == (["m", "n"] if case == "two of them added" else ["n"]), (blockers, warnings)
    assert not (warnings if kind == "blocker" else blockers)
    text = found[0].reason if kind == "blocker" else found[0].text
    assert "drops AveragePool's" in text


@needs_compiler
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_the_real_compiler_aborts_at_a_blocker_and_compiles_another_network_at_a_warning(tmp_path: Path, case: str):
    build, kind, shown = POOL_CASES[case]
    proc = nnfusion(build(), tmp_path / "c")
    code = compiled_code(proc, tmp_path / "c", kind)
    if kind == "blocker":
        assert shown in proc.stdout + proc.stderr
    else:  # it compiles, its output of the shape NNFusion gives the pool (the last case: ONNX's, its windows shifted)
        assert f"#define NNFUSION_GRAPH_OUTPUT_SHAPE_0 {shown}" in code.read_text()


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_kdb_model_expand_writes_the_average_pool_as_onnx_computes_it(tmp_path: Path, case: str):
    """Found in session 33 (Inception's padded 3x3 average pools, count_include_pad 0; a ceil_mode pool): expand
    writes a Pad of zeros, the pool without padding and a Mul by ONNX's own divisors; nothing is left to name, and
    ONNX Runtime gives the model's numbers."""
    ort = pytest.importorskip("onnxruntime")
    import numpy as np

    from core.opconfigs.expand_functions import expand_functions

    build = POOL_CASES[case][0]
    source = write(build(), tmp_path / "m.onnx")
    expand_functions(source, tmp_path / "x.onnx", None)
    expanded = onnx_shapes(tmp_path / "x.onnx")
    assert import_faults(expanded) == ([], []) and "AveragePool" in {n.op_type for n in expanded.graph.node}
    shape = [d.dim_value for d in build().graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    before, after = (ort.InferenceSession(str(p)).run(None, {"x": x})[0] for p in (source, tmp_path / "x.onnx"))
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)


@needs_compiler
@pytest.mark.parametrize("case", ["then an Add of the input", "ceil_mode"])
def test_the_real_compiler_takes_the_expanded_average_pool(tmp_path: Path, case: str):
    from core.opconfigs.expand_functions import expand_functions

    source = write(POOL_CASES[case][0](), tmp_path / "m.onnx")
    expand_functions(source, tmp_path / "x.onnx", None)
    compiled_code(nnfusion(onnx_shapes(tmp_path / "x.onnx"), tmp_path / "c"), tmp_path / "c", "compiles")


def onnx_shapes(path: Path) -> ModelProto:
    import onnx

    return onnx.shape_inference.infer_shapes(onnx.load(path))


@needs_compiler
def test_kdb_nnfusion_says_it_foresaw_an_abort_at_the_node_a_pools_shape_meets(tmp_path: Path):
    """Held out in session 32 (a PoolFormer block): kdb named the padded pool and the Sub where the compile aborts,
    the compiler aborted at that Sub, and kdb said it "did not foresee this node"."""
    model = tmp_path / "pool.onnx"
    write(POOL_CASES["then an Add of the input"][0](), model)
    text = run_kdb("nnfusion", str(model), "--db", str(tmp_path / "k.db"), "--nnfusion", str(COMPILER))
    flat = " ".join(text.stdout.split())
    assert text.returncode == 1 and "as kdb said before compiling: node n (AveragePool)" in flat, flat
    assert "did not foresee" not in flat


@needs_compiler
def test_kdb_nnfusion_closes_an_abort_past_a_wrong_shape_it_named(tmp_path: Path):
    """Held out in session 32 (a ResNet-D block at 33 px): kdb named the pool's wrong shape and that it flows into a
    conv it does not follow ("it may abort there"); the compile aborted at the Add after, and kdb said nothing of it."""
    model = tmp_path / "pool.onnx"

    def build(g: GraphBuilder) -> str:
        conv = g.node("Conv", [padded_pool(g), g.weight("w", [4, 4, 1, 1], fan_in=4)], "conv", kernel_shape=[1, 1])
        return g.node("Add", [conv, "x"], "add")
    write(pool_model(build), model)
    text = run_kdb("nnfusion", str(model), "--db", str(tmp_path / "k.db"), "--nnfusion", str(COMPILER))
    flat = " ".join(text.stdout.split())
    assert text.returncode == 1 and "before compiling kdb said NNFusion compiles another network here (node n (wrong "\
        "shape))" in flat and flat.endswith("it aborted at add"), flat


def test_an_average_pool_whose_dropped_padding_changes_nothing_is_looked_up_without_it(tmp_path: Path):
    """Padding above only, where the shape does not change: NNFusion's windows are ONNX's; the op config is the
    unpadded pool the compiler looks up."""
    model = write(pool_model(lambda g: padded_pool(g, strides=[2, 2], pads=[0, 0, 1, 1]), {"x": [1, 4, 27, 27]}),
                  tmp_path / "m.onnx")
    ext = extract(model)
    assert ext.blockers == [] and not ext.notes
    (config,) = ext.configs
    assert config.signature().identifier == \
        "AvgPool1,4,27,27;1,4,13,13floatfloatShape{3, 3}Strides{2, 2}Shape{0, 0}Shape{0, 0}"  # as the compiler logs it


def uneven_split() -> ModelProto:
    """x[1, 12] split by a sizes input [4, 8] (opset 13 on), each part through its own op, joined again."""
    import onnx

    g = GraphBuilder({"x": [1, 12]})
    outs = ["a", "b"]
    g.nodes.append(helper.make_node("Split", ["x", g.constant("sizes", [4, 8])], outs, name="n", axis=1))
    y = g.node("Concat", [g.node("Relu", ["a"], "r"), g.node("Sigmoid", ["b"], "s")], "cat", axis=1)
    return onnx.shape_inference.infer_shapes(g.model(y, "split"))


def test_a_split_by_unequal_sizes_is_a_wrong_shape_the_compiler_compiles_another_network_of(tmp_path: Path):
    """NNFusion's Split never reads the sizes input: it cuts equal parts, compiles, and the network is not the
    model's (its first part 1x6 where the model's is 1x4)."""
    blockers, warnings = import_faults(uneven_split())
    assert blockers == [] and [w.node for w in warnings] == ["n"] and "sizes [4, 8]" in warnings[0].text
    if COMPILER.is_file():
        proc = nnfusion(uneven_split(), tmp_path / "c")
        assert proc.returncode == 0, proc.stdout[-2000:]
        code = (tmp_path / "c" / "nnfusion_rt" / "cuda_codegen" / "nnfusion_rt.cu").read_text()
        assert "Shape{1, 6}" in code
