"""A runner that survives measurement servers dying mid-job: their trials are measured again elsewhere.

MetaSchedule's RPCRunner reports a lost session as that trial's run error, so one rpc_server going
down (a GPU lost, a host rebooted) would quietly turn its trials into failures. This wrapper re-queues
a trial whose error is the session's, not the kernel's, up to `retries` times; the tracker hands the
retry to a live server.
"""

from __future__ import annotations

from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerFuture, RunnerInput, RunnerResult

# Errors that say the measurement session broke, not that the kernel failed.
SESSION_ERRORS = ("An exception occurred", "Timeout, killed", "RPCSession", "Connection", "Broken pipe", "socket",
                  "closed", "reset by peer", "RPCError")


def is_session_error(message: str | None) -> bool:
    return bool(message) and any(s in str(message) for s in SESSION_ERRORS) and "CUDA" not in str(message)


@derived_object
class RequeuedFuture(PyRunnerFuture):
    def __init__(self, runner: Any, runner_input: RunnerInput, future: RunnerFuture, retries: int) -> None:
        super().__init__()
        self.runner, self.runner_input, self.future, self.retries = runner, runner_input, future, retries

    def done(self) -> bool:
        return bool(self.future.done())

    def result(self) -> RunnerResult:
        result = self.future.result()
        while is_session_error(result.error_msg) and self.retries > 0:
            self.retries -= 1
            self.runner.requeued += 1
            self.future = self.runner.inner.run([self.runner_input])[0]
            result = self.future.result()
        return result


@derived_object
class ResilientRunner(PyRunner):
    def __init__(self, inner: Any, retries: int = 2) -> None:
        super().__init__()
        self.inner, self.retries, self.requeued = inner, retries, 0

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        futures = self.inner.run(runner_inputs)
        return [RequeuedFuture(self, i, f, self.retries) for i, f in zip(runner_inputs, futures, strict=True)]
