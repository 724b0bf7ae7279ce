"""A network as one tuning job (core/tuning/network.py): which ops are tuned, how the budget is spread, what the
predicted network time says; and the speed units progress reports use (GB/s for pools). No TVM needed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from core.opconfigs.opconfig import parse_line
from core.opconfigs.ort_prepass import PrePass
from core.tuning.network import (
    FLOOR_TRIALS,
    Network,
    NetworkOp,
    has_row_type,
    network_from_model,
    network_of,
    predict,
    probe_trials,
    spread_budget,
    tuning_order,
)

NO_COMPILER = PrePass.not_checked("these tests give no compiler")  # the model as given

CONV = parse_line("cudnn_convolution_op_float|i+1_64_56_56|w+64_64_3_3|o+1_64_56_56|ws+1_1|wd+1_1|p+1_1", "c")
CONV_RELU = parse_line("cudnn_convolution_op_float|i+1_64_56_56|w+64_64_3_3|o+1_64_56_56|ws+1_1|wd+1_1|p+1_1"
                       "|fuse+relu", "cr")
SMALL_CONV = parse_line("cudnn_convolution_op_float|i+1_64_56_56|w+64_64_1_1|o+1_64_56_56|ws+1_1|wd+1_1|p+0_0", "s")
POOL = parse_line("cudnn_maxpool_op_float|i+1_16_32_32|o+1_16_16_16|win+2_2|ws+2_2|pb+0_0|pa+0_0", "p")
DOT = parse_line("cublas_dot_op_float|a+1_512|b+512_1000|o+1_1000|ta+0|tb+0", "d")
RELU = parse_line("elementwise_relu_op_float|i+1_64_56_56|o+1_64_56_56", "r")
DEPTHWISE = parse_line("cudnn_convolution_op_float|i+1_32_56_56|w+32_1_3_3|o+1_32_56_56|ws+1_1|wd+1_1|p+1_1|g+32",
                       "dw")


def ops(*pairs: tuple[object, int]) -> list[NetworkOp]:
    return [NetworkOp(config, count) for config, count in pairs]  # type: ignore[arg-type]


def test_of_op_configs_every_op_a_row_can_serve_is_tuned():
    assert [has_row_type(c)[0] for c in (CONV, CONV_RELU, POOL, DOT, RELU)] == [True] * 5
    grouped, why = has_row_type(DEPTHWISE)
    assert not grouped and "DepthwiseConv2dNative" in why
    counts = {CONV.key: 2, RELU.key: 5}
    network = network_of("n", [CONV, RELU, POOL, DEPTHWISE], lambda c: counts.get(c.key, 1))
    assert [(op.config, op.count) for op in network.ops] == [(CONV, 2), (RELU, 5), (POOL, 1)]
    assert [(c, n) for c, n, _ in network.skipped] == [(DEPTHWISE, 1)]


def test_a_models_ops_with_their_counts(tmp_path: Path):
    pytest.importorskip("onnx")
    from onnx_models import resnet, write

    # Two stages of two blocks: the stride-1 convs repeat, element-wise Add/Relu are fused by NNFusion.
    network = network_from_model(write(resnet(widths=(16, 32), blocks=(2, 2), size=32, classes=10),
                                       tmp_path / "r.onnx"), prepass=NO_COMPILER)
    assert network.ops and all(has_row_type(op.config)[0] for op in network.ops)
    assert len({op.config.key for op in network.ops}) == len(network.ops)  # distinct
    assert max(op.count for op in network.ops) >= 2  # the repeated 3x3 convs of a stage
    types = {op.config.op_type for op in network.ops}
    assert {"Fused_Convolution_Relu", "Fused_Convolution_Add_Relu", "MaxPool", "AvgPool", "Dot"} <= types


def test_a_models_network_is_what_nnfusion_looks_up_at_the_flags(tmp_path: Path):
    """A dense layer's lone bias Add is looked up (and tuned); an Add and Relu NNFusion fuses into a kernel of its
    own are not, until -fkernel_fusion_level=0 leaves every element-wise op to the DB."""
    pytest.importorskip("onnx")
    from onnx_models import GraphBuilder, write

    from core.nnfusion.compiler import CompilerFlags
    from core.opconfigs.extract_cache import extract_as_compiled

    g = GraphBuilder({"x": [1, 128, 64]})
    y = g.node("Add", [g.node("MatMul", ["x", g.weight("w", [64, 64])], "dense"), g.weight("b", [64])], "bias")
    y = g.node("MatMul", [y, g.weight("w2", [64, 64])], "dense2")
    y = g.node("Relu", [g.node("Add", [y, "x"], "residual")], "relu")
    model = write(g.model(y, "dense"), tmp_path / "dense.onnx")
    for flags in (None, CompilerFlags.parse(["-fkernel_fusion_level=0"])):
        network = network_from_model(model, flags, prepass=NO_COMPILER)
        extraction = extract_as_compiled(model, flags, NO_COMPILER)
        assert [op.config.key for op in network.ops] == [c.key for c in extraction.looked_up()]
    default = {op.config.op_type: op.count for op in network_from_model(model, prepass=NO_COMPILER).ops}
    assert default == {"Dot": 2, "Add": 1}  # the bias Add alone; the residual Add + Relu are NNFusion's kernel
    unfused = {op.config.op_type: op.count for op in network.ops}
    assert unfused == {"Dot": 2, "Add": 2, "Relu": 1}


def test_the_budget_follows_each_ops_share_of_the_network_time():
    network = ops((CONV, 4), (SMALL_CONV, 1), (POOL, 1), (DOT, 1))
    shares = spread_budget(network, 400)
    assert sum(shares.values()) == 400
    # The 3x3 conv has 9x the FLOPs of the 1x1 one and occurs 4 times: most of the budget goes there.
    assert shares[CONV.key] > 300 and shares[CONV.key] > 10 * shares[SMALL_CONV.key]
    assert min(shares.values()) >= FLOOR_TRIALS  # every op keeps a floor
    # Counts weigh: the same conv occurring once gets less than occurring four times.
    assert spread_budget(ops((CONV, 1), (SMALL_CONV, 1), (POOL, 1), (DOT, 1)), 400)[CONV.key] < shares[CONV.key]


def test_measured_times_replace_the_flops_estimate():
    network = ops((CONV, 1), (SMALL_CONV, 1))
    by_flops = spread_budget(network, 200)
    assert by_flops[CONV.key] > by_flops[SMALL_CONV.key]
    # Measured: the 1x1 conv turns out to take far longer (memory bound): the budget follows the measurement.
    measured = spread_budget(network, 200, best={CONV.key: 10e-6, SMALL_CONV.key: 90e-6})
    assert measured[SMALL_CONV.key] > measured[CONV.key] and sum(measured.values()) == 200
    assert [op.config for op in tuning_order(network, {CONV.key: 10e-6, SMALL_CONV.key: 90e-6})] == [SMALL_CONV, CONV]
    # Only one measured: the other is estimated at the speed the measured one reached, not in raw FLOPs.
    mixed = spread_budget(network, 200, best={CONV.key: 10e-6})
    assert mixed[CONV.key] > mixed[SMALL_CONV.key]


def test_trials_recorded_earlier_count_and_the_total_is_kept():
    network = ops((CONV, 4), (SMALL_CONV, 1), (POOL, 1))
    # An earlier run gave the pool 150 trials, more than its share now: it keeps them, the others share the rest.
    shares = spread_budget(network, 300, recorded={POOL.key: 150})
    assert shares[POOL.key] == 150 and sum(shares.values()) == 300
    # Resumed with the same budget and every op at its share: nothing new is planned.
    again = spread_budget(network, 300, recorded=shares)
    assert again == shares
    # More recorded than the whole budget: every op keeps what it has, no op is cut below it.
    assert spread_budget(network, 10, recorded=shares) == shares


def test_ops_with_nothing_measured_are_probed_with_the_floor_before_the_spread():
    network = ops((CONV, 2), (POOL, 1), (DOT, 1))
    assert probe_trials(network, 1800) == {CONV.key: FLOOR_TRIALS, POOL.key: FLOOR_TRIALS, DOT.key: FLOOR_TRIALS}
    # measured ops, and ops that hold the floor's trials already (all failed: no best), need no probe
    assert probe_trials(network, 1800, recorded={POOL.key: 20}, best={CONV.key: 30e-6}) == {DOT.key: FLOOR_TRIALS}
    assert probe_trials(network, 8) == {CONV.key: 1, POOL.key: 1, DOT.key: 1}  # the floor shrinks with the budget
    assert probe_trials(ops((CONV, 1)), 1800) == {}  # one op: nothing to weigh it against
    # what a probe measured decides the spread: a Dot whose first kernel is slow gets the trials to fix it
    by_flops = spread_budget(network, 1800)
    probed = {CONV.key: 30e-6, POOL.key: 5e-6, DOT.key: 60e-6}
    assert spread_budget(network, 1800, recorded=probe_trials(network, 1800), best=probed)[DOT.key] > 4 * by_flops[DOT.key]


def test_tiny_budgets_still_give_every_op_a_trial():
    network = ops((CONV, 1), (SMALL_CONV, 1), (POOL, 1), (DOT, 1))
    assert all(n >= 1 for n in spread_budget(network, 2).values())
    assert sum(spread_budget(network, 8).values()) == 8


def test_the_prediction_sums_best_times_by_count_and_never_invents_a_library_time():
    network = Network("net", ops((CONV, 4), (POOL, 1)))
    partial = predict(network, {CONV.key: 20e-6}, trials=10, budget=64)
    assert partial.predicted_seconds == pytest.approx(80e-6) and partial.measured_ops == 1 and not partial.complete
    assert "measured ops only: 1 of 2" in partial.text() and "library (cuDNN) time not measured" in partial.text()
    full = predict(network, {CONV.key: 20e-6, POOL.key: 5e-6}, trials=20, budget=64)
    assert full.predicted_seconds == pytest.approx(85e-6) and full.complete and full.library_seconds is None
    assert "predicted 85.0 us" in full.text() and "not measured" in full.text()
    assert predict(network, {}, 0, 64).predicted_seconds is None
    timed = Network("net", [replace(op, library_seconds=10e-6) for op in network.ops])
    halfway = predict(timed, {CONV.key: 20e-6}, trials=10, budget=64).text()
    assert "library 50.0 us (ratio once every op has a result)" in halfway and "not measured" not in halfway
    # A library time only when it is known for every op.
    half = Network("net", [NetworkOp(CONV, 4, 25e-6), NetworkOp(POOL, 1)])
    assert half.library_seconds is None
    known = Network("net", [NetworkOp(CONV, 4, 25e-6), NetworkOp(POOL, 1, 10e-6)])
    event = predict(known, {CONV.key: 20e-6, POOL.key: 5e-6}, 20, 64)
    assert event.library_seconds == pytest.approx(110e-6) and "ratio 0.77x" in event.text()


def test_pools_and_element_wise_ops_report_gb_per_s():
    # MaxPool 1x16x32x32 -> 1x16x16x16: 16,384 + 4,096 floats read and written = 81,920 bytes.
    assert POOL.bytes_moved == 81_920
    value, unit = POOL.speed(1e-6)
    assert unit == "GB/s" and value == pytest.approx(81.92)
    assert POOL.speed_text(1e-6) == "81.9 GB/s"
    assert RELU.speed(1e-6)[1] == "GB/s"
    assert CONV.speed(1e-3)[1] == "GFLOP/s" and CONV.speed_text(1e-3) == f"{CONV.flops / 1e-3 / 1e9:,.0f} GFLOP/s"
    assert DOT.bytes_moved == (512 + 512 * 1000 + 1000) * 4


def test_a_row_far_slower_than_its_tuning_is_reported_with_what_ptxas_did(tmp_path: Path):
    """The H200 case: a conv tuned to 86 us ran 624 us as a row (32 registers, 3 KB spilled)."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_kernel_row import row_of

    from core.db.kernel_db import KernelDB
    from core.demo import demo_kernels
    from core.tuning.queue import slower_than_tuned

    row = row_of(demo_kernels()[0])
    miscs = json.loads(row.miscs)
    miscs["kdb"]["profile"] = {"NVIDIA H200": {"us": 624.0}}
    miscs["kdb"]["compile"] = {"sm_90": {"kdb_block_kernel": {"registers": 32, "spill_stores": 3024}}}
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(replace(row, miscs=json.dumps(miscs)))
        slow = slower_than_tuned(db, {"best": row.key}, [{"role": "best", "seconds": 86e-6}])
        assert slow == ["the best row runs 7.3x its tuned time (624.0 vs 86.0 us); sm_90: 32 registers, 3024 B spilled"]
        assert slower_than_tuned(db, {"best": row.key}, [{"role": "best", "seconds": 400e-6}]) == []


def test_a_cap_holds_every_op_to_it_and_gives_the_rest_to_the_others():
    """The issue's quality target counts at most 256 trials per op; uncapped, the spread gave ResNet-18's costliest
    op 263 of 1,800 on the H200 (session 10)."""
    network = ops((CONV, 4), (SMALL_CONV, 1), (POOL, 1), (DOT, 1))
    uncapped = spread_budget(network, 400)
    assert uncapped[CONV.key] > 300
    capped = spread_budget(network, 400, cap=150)
    assert capped[CONV.key] == 150 and max(capped.values()) == 150 and sum(capped.values()) == 400
    assert all(capped[k] >= uncapped[k] for k in capped if k != CONV.key), "the others get what the cap freed"
    # every op at the cap: the budget is not reached, and no op passes the cap
    assert spread_budget(network, 400, cap=50) == {op.config.key: 50 for op in network}
    # trials recorded earlier above the cap are kept, never cut
    assert spread_budget(network, 400, recorded={CONV.key: 200}, cap=150)[CONV.key] == 200
