"""Slower, faster or within noise: two networks' times judged from interleaved rounds, never from one run each.

Each contender runs in rounds (its own process each time, the two alternating, which goes first swapping every
round), and each round gives one median. One run each cannot tell: a host's clocks and neighbours move a
network's median between two processes by more than many a row changes it; the empty DB's fp32 ResNet-50 gave
3.68 ms and 4.74 ms in two runs on one H100 in session 19 (bench/results/h100/session19/5-*.out and 6-*.out).
The verdict is "slower" only when every round of the first is slower than every round of the second ("faster" the
other way), else "within noise". With 5 rounds each that is the exact Mann-Whitney test at U = 0: two-sided
p = 2 / C(10, 5) = 0.008; with fewer than MIN_ROUNDS rounds no verdict is given.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SLOWER, FASTER, WITHIN_NOISE, NO_VERDICT = "slower", "faster", "within noise", "no verdict"
MIN_ROUNDS = 3  # 3 v 3 at U = 0: p = 0.1, the least that says anything


@dataclass(frozen=True)
class Spread:
    """One contender's round medians (ms): their median, and the lowest and highest."""

    rounds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def low(self) -> float:
        return min(self.rounds)

    @property
    def high(self) -> float:
        return max(self.rounds)

    @property
    def relative(self) -> float:
        """(high - low) / median: how far apart the rounds landed."""
        return (self.high - self.low) / self.median if self.median > 0 else 0.0

    def text(self) -> str:
        return f"{self.median:.4f} ms (rounds {self.low:.4f}-{self.high:.4f}, spread {self.relative:.1%})"


@dataclass(frozen=True)
class Verdict:
    """The first contender against the second."""

    verdict: str  # SLOWER, FASTER, WITHIN_NOISE or NO_VERDICT
    ratio: float  # first's median / second's
    first: Spread
    second: Spread

    def as_dict(self) -> dict[str, object]:
        return {"verdict": self.verdict, "ratio": self.ratio,
                "rounds_ms": {"first": list(self.first.rounds), "second": list(self.second.rounds)},
                "spread": {"first": self.first.relative, "second": self.second.relative}}


def judge(first: list[float], second: list[float]) -> Verdict:
    """The verdict on the first contender's round medians against the second's (ms, one per round each)."""
    if not first or not second:
        raise ValueError("a verdict needs a round of each contender")
    a, b = Spread(tuple(first)), Spread(tuple(second))
    ratio = a.median / b.median if b.median > 0 else float("inf")
    if min(len(first), len(second)) < MIN_ROUNDS:
        return Verdict(NO_VERDICT, ratio, a, b)
    if a.low > b.high:
        return Verdict(SLOWER, ratio, a, b)
    if a.high < b.low:
        return Verdict(FASTER, ratio, a, b)
    return Verdict(WITHIN_NOISE, ratio, a, b)
