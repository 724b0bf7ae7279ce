"""Slower, faster or within noise from interleaved rounds (core/gpu/verdict.py): the rule on round medians."""

from __future__ import annotations

import pytest

from core.gpu.verdict import FASTER, NO_VERDICT, SLOWER, WITHIN_NOISE, judge

# An A/A pair: one binary's five round medians against its own next five (ms), as a host moves them.
A = [1.512, 1.498, 1.530, 1.505, 1.521]
A_AGAIN = [1.509, 1.540, 1.501, 1.517, 1.496]


def test_the_same_binary_against_itself_gives_no_verdict_but_within_noise():
    verdict = judge(A, A_AGAIN)
    assert verdict.verdict == WITHIN_NOISE and verdict.ratio == pytest.approx(1.512 / 1.509)


def test_slower_or_faster_only_when_every_round_says_so():
    slower = [x * 1.05 for x in A_AGAIN]  # 5% slower, past the rounds' own spread
    assert judge(slower, A).verdict == SLOWER and judge(A, slower).verdict == FASTER
    overlapping = [*slower[:4], 1.49]  # one round as fast as the other's fastest: the rounds overlap
    assert judge(overlapping, A).verdict == WITHIN_NOISE


def test_a_median_ratio_over_1_is_not_slower_by_itself():
    """What one run each used to call slower: the ratio is above 1, the rounds overlap."""
    verdict = judge([1.52, 1.50, 1.53], [1.51, 1.49, 1.54])
    assert verdict.ratio > 1 and verdict.verdict == WITHIN_NOISE


def test_fewer_than_three_rounds_give_no_verdict():
    assert judge([2.0, 2.1], [1.0, 1.1]).verdict == NO_VERDICT
    with pytest.raises(ValueError):
        judge([], [1.0])


def test_the_spread_is_reported_per_contender():
    verdict = judge(A, A_AGAIN)
    assert verdict.first.low == 1.498 and verdict.first.high == 1.530
    assert verdict.first.relative == pytest.approx((1.530 - 1.498) / 1.512)
    assert "rounds 1.4980-1.5300" in verdict.first.text()
    assert verdict.as_dict()["rounds_ms"]["second"] == A_AGAIN


def test_a_network_right_with_the_db_and_wrong_with_the_empty_db_says_the_empty_db_is_wrong(tmp_path):
    """NNFusion's own code can compute wrong numbers (a Concat it skips: core/nnfusion/generated.SkippedCopy): the run
    stays OK on the DB's output and says the empty DB's is wrong, with its error."""
    from core.gpu.network_run import NetworkRun, RunOptions, _judge
    from core.nnfusion.compile_job import CompileJob

    run = NetworkRun(CompileJob(tmp_path / "m.onnx", tmp_path / "k.db"), RunOptions(), tmp_path, max_error=1e-4)
    rounds = [{"median_ms": 1.0}] * 3
    for contender, error in ((run.with_db, 1e-6), (run.empty_db, 0.7)):
        contender.error, contender.timing, contender.rounds = error, rounds[0], rounds
    _judge(run)
    assert run.findings == [] and any("with the empty DB the output is wrong" in n and "7.00e-01" in n
                                      for n in run.notes), run.notes
