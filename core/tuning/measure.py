"""How a CUDA trial is timed: every run starts from a cold L2, as the profile we inject and the library
figures we compare with are timed.

MetaSchedule's default runner averages back-to-back runs of the same inputs, so the L2 is warm. On the
H200 that ranked first the schedules that lean on L2 residency: a conv whose best record measured
39.7 us that way took 171 us from cold L2, and its "best" kernel lost to cuDNN by 2.7x. In a network a
layer's weights are rarely still in L2, so the tuner should optimise what the kernel will meet there.
"""

from __future__ import annotations

from typing import Any

COLD_RUNS = 10  # timed runs per trial, each after an L2 flush (one launch each: nothing to warm up)
FALLBACK_FLUSH_BYTES = 256 << 20  # when the device does not report its L2 size


def cold_evaluator_config() -> Any:
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.EvaluatorConfig(number=1, repeat=COLD_RUNS, min_repeat_ms=0)


def flush_bytes(device: Any) -> int:
    """Twice the L2: TVM's evaluator copies one buffer of this size into another before each repeat."""
    l2 = device.l2_cache_size_bytes
    return 2 * int(l2) if l2 else FALLBACK_FLUSH_BYTES


def cold_run_evaluator(rt_mod: Any, device: Any, evaluator_config: Any, repeated_args: list[Any]) -> list[float]:
    """LocalRunner's f_run_evaluator: `repeat` single runs per argument set, each after an L2 flush.

    A local GPU is held while it times (core/gpu/exclusive.py): the previous op's kernels may be verified
    and timed beside the tuning."""
    if getattr(device, "type", "") == "cpu":  # llvm: no GPU to share
        return _cold_runs(rt_mod, device, evaluator_config, repeated_args)
    from core.gpu.exclusive import gpu_exclusive

    with gpu_exclusive():
        return _cold_runs(rt_mod, device, evaluator_config, repeated_args)


def _cold_runs(rt_mod: Any, device: Any, evaluator_config: Any, repeated_args: list[Any]) -> list[float]:
    evaluator = rt_mod.time_evaluator(rt_mod.entry_name, device, number=1, repeat=evaluator_config.repeat,
                                      min_repeat_ms=0, cache_flush_bytes=flush_bytes(device))
    costs: list[float] = []
    for args in repeated_args:
        device.sync()
        costs.extend(float(c) for c in evaluator(*args).results)
    return costs


def cold_rpc_run_evaluator(session: Any, rt_mod: Any, device: Any, evaluator_config: Any,
                           repeated_args: list[Any]) -> list[float]:
    """RPCRunner's f_run_evaluator (it passes the session first): the same, on the server's device."""
    del session  # the module and device already belong to it (a remote GPU: the lock here would not guard it)
    return _cold_runs(rt_mod, device, evaluator_config, repeated_args)
