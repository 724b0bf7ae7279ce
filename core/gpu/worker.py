"""The GPU child process: reads one JSON job per line on stdin, answers one JSON line on stdout.

Jobs (built by core.gpu.jobs.job_for_row):
  verify   random inputs, outputs poisoned with NaN, one launch, compared with a float64 numpy reference
  time     CUDA-event timing: warm-up, then the median of many launches, each after an L2 flush
  barriers an instrumented copy counts the __syncthreads() executed by thread 0 of block 0
  devices  the inventory
Anything that goes wrong in a job is answered as {"ok": false, "reason": ...}; a kernel that hangs or
kills the process is handled by the parent (timeout, restart).
"""

from __future__ import annotations

import base64
import json
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from core.gpu.exclusive import WAITING, gpu_exclusive

_state: dict[str, Any] = {}
L2_FLUSH_FACTOR = 2  # the flush writes this many times the L2 size


def _cuda() -> Any:
    if "cuda" not in _state:
        import pycuda.driver as cuda

        cuda.init()
        device = cuda.Device(0)
        _state["cuda"] = cuda
        _state["device"] = device
        _state["context"] = device.make_context()
        _state["l2"] = device.get_attribute(cuda.device_attribute.L2_CACHE_SIZE)
    return _state["cuda"]


def _arch() -> str:
    major, minor = _state["device"].compute_capability()
    return f"sm_{major}{minor}"


def _module(key: tuple[str, str], load: Any, phase: str) -> Any:
    """The kernel function of a module loaded once per key: verify and time of one kernel share it."""
    cache: dict[tuple[str, str], Any] = _state.setdefault("modules", {})
    if key not in cache:
        if len(cache) > 64:
            cache.clear()
        module = load()  # kept beside its function: the function must not outlive it
        cache[key] = (module, module.get_function(key[1]))
    _phase_done(phase)
    return cache[key][1]


def _compile(source: str, name: str) -> Any:
    """Compile with pycuda (nvcc) here: the source has no cubin of the nvcc check for this device."""
    from pycuda.compiler import SourceModule

    return _module((source, name), lambda: SourceModule(source, no_extern_c=True, arch=_arch(),
                                                         options=["-lineinfo"]), "compiled")


def _kernel(job: dict[str, Any]) -> Any:
    """The job's kernel function: from the nvcc check's cubin for this device's arch when the job brings one
    (no second compile: a tuned kernel's nvcc run can take minutes), else compiled here with pycuda."""
    cubin = (job.get("cubins") or {}).get(_arch())
    if not cubin:
        return _compile(job["source"], job["kernel"])
    return _module((cubin, job["cubin_kernel"]),
                   lambda: _state["cuda"].module_from_buffer(base64.b64decode(cubin)), "loaded")


def _phase_done(phase: str) -> None:
    """Tell the parent a phase is over: its clock for the launches starts now (nvcc may take minutes)."""
    sys.stdout.write(json.dumps({"phase": phase}) + "\n")
    sys.stdout.flush()


@contextmanager
def _holding_gpu() -> Iterator[None]:
    _phase_done(WAITING)
    with gpu_exclusive():
        _phase_done("gpu")
        yield


def _shapes(job: dict[str, Any]) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    from core.codegen.te_ops import _out_shape

    config = _config(job)
    p, op = job["params"], job["op_type"]
    if "filter_shape" in p:
        ins = [p["input_shape"], p["filter_shape"]]
        if op == "Fused_Convolution_Add_Relu":
            ins.append(p["output_shape"])
    elif "arg0_shape" in p:  # Dot, BatchMatMul
        ins = [p["arg0_shape"], p["arg1_shape"]]
    elif "window_shape" in p:
        ins = [p["input_shape"]]
    else:
        ins = p.get("input_shapes") or [p["input_shape"]]
    return [tuple(s) for s in ins], tuple(_out_shape(config))


def _config(job: dict[str, Any]) -> Any:
    from core.opconfigs.opconfig import OpConfig

    return OpConfig(job["op_type"], job["params"], dtype=job.get("dtype", "float"))


def _inputs(job: dict[str, Any]) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """Seeded inputs in the row's element type (a half kernel reads half buffers)."""
    from core.codegen.reference import inputs_for

    shapes, out = _shapes(job)
    return inputs_for(_config(job), shapes, seed=1), out


def _launch(fn: Any, buffers: list[Any], job: dict[str, Any], extra: list[Any] | None = None) -> None:
    fn(*buffers, *(extra or []), block=tuple(job["block"]), grid=tuple(job["grid"]))


def _reference(job: dict[str, Any], config: Any, arrays: list[np.ndarray]) -> np.ndarray:
    """The float64 reference, kept for the next kernel of the same op (a tuned op's best and efficient ones,
    the variants of one layer): it is the CPU's share of a verification, and the inputs are seeded."""
    from core.codegen.reference import reference

    cache: dict[str, np.ndarray] = _state.setdefault("references", {})
    key = json.dumps([job["op_type"], job["params"]], sort_keys=True)
    if key not in cache:
        if len(cache) >= 8:
            cache.pop(next(iter(cache)))
        cache[key] = reference(config, arrays)
    return cache[key]


def verify(job: dict[str, Any]) -> dict[str, Any]:
    """The kernel's output against the float64 reference of the same inputs, within the job's tolerance (the
    policy of core/codegen/reference.tolerance: it grows with the terms each output sums, and with half's roundoff)."""
    from core.codegen.reference import NUMPY_DTYPES, reference, relative_error
    from core.opconfigs.opconfig import OpConfig

    cuda = _cuda()
    fn = _kernel(job)
    arrays, out_shape = _inputs(job)
    element = NUMPY_DTYPES[job.get("dtype", "float")]
    with _holding_gpu():  # one launch, but it must not land beside another process's timed ones
        dev_in = [cuda.to_device(a) for a in arrays]
        poison = np.full(out_shape, np.nan, dtype=element)
        dev_out = cuda.to_device(poison)
        _launch(fn, [*dev_in, dev_out], job)
        cuda.Context.synchronize()
        got = cuda.from_device(dev_out, out_shape, element)
        for buffer in [*dev_in, dev_out]:
            buffer.free()
    config = _config(job)
    unwritten = int(np.isnan(got).sum())
    if unwritten:
        return {"ok": False, "reason": f"{unwritten} of {got.size} outputs never written (still NaN)"}

    def rel_error(want: np.ndarray) -> float:
        return relative_error(got, want)

    err = rel_error(_reference(job, config, arrays))
    extra: dict[str, Any] = {}
    if err > job["tolerance"] and job["op_type"] == "Fused_Convolution_Add_Relu":
        # TVM's conv+bias+relu kernels (the artifact's) read input2 as a per-channel bias, input2[k]:
        # check that reading too, and say which one the kernel does.
        k = arrays[1].shape[0]
        bias = arrays[2].reshape(-1)[:k].reshape(1, k, 1, 1).astype(np.float64)
        conv = reference(OpConfig("Convolution", job["params"]), arrays[:2])
        bias_err = rel_error(np.maximum(conv + bias, 0))
        if bias_err <= job["tolerance"]:
            err, extra = bias_err, {"input2": f"per-channel bias: the kernel reads input2[0..{k - 1}]"}
    ok = err <= job["tolerance"]
    reason = "" if ok else f"max relative error {err:.2e} over the {job['tolerance']:g} allowed for {job['dtype']}"
    return {"ok": ok, "reason": reason, "max_rel_error": err, "extra": extra}


def time_kernel(job: dict[str, Any]) -> dict[str, Any]:
    """Median GPU time of one launch, from cold L2, with the CPU's launch overhead kept out of it.

    Each timed launch follows a memset over twice the L2 size: it evicts the inputs (every launch starts
    from HBM, as in a real network) and keeps the GPU busy while Python queues the next launch, so the
    start event fires right before the kernel instead of while the GPU waits for the CPU (an idle GPU
    timed a pycuda launch's ~10 us of Python along with the kernel). Nothing synchronises until the end.
    """
    cuda = _cuda()
    fn = _kernel(job)
    arrays, out_shape = _inputs(job)
    buffers = [cuda.to_device(a) for a in arrays] + [cuda.mem_alloc(int(np.prod(out_shape)) * 4)]
    flush_words = L2_FLUSH_FACTOR * _state["l2"] // 4
    flush = cuda.mem_alloc(flush_words * 4)
    with _holding_gpu():  # nothing else on the GPU while it is timed
        for _ in range(10):  # warm-up: clocks up, code loaded
            _launch(fn, buffers, job)
        cuda.Context.synchronize()
        pairs = [(cuda.Event(), cuda.Event()) for _ in range(job["repeats"])]
        for start, stop in pairs:
            cuda.memset_d32_async(flush, 0, flush_words)
            start.record()
            _launch(fn, buffers, job)
            stop.record()
        pairs[-1][1].synchronize()
    times = sorted(stop.time_since(start) * 1000.0 for start, stop in pairs)  # ms -> us
    flush.free()
    for buffer in buffers:
        buffer.free()
    return {"ok": True, "microseconds": float(np.median(times)), "launches": len(times),
            "spread": [times[len(times) // 10], times[(9 * len(times)) // 10]],
            "extra": {"l2_flush_mb": round(flush_words * 4 / 2**20)}}


# Both barriers a row may hold: __syncthreads(), and the non-aligned one of rows padded to whole warps
# (core/cuda/warps.py), whose text is an asm string: found by its opening in the masked source.
_BARRIER = re.compile(r"\b__syncthreads\s*\(\s*\)|\basm\s+volatile\s*\(")


def instrument(source: str, kernel: str) -> str:
    """The kernel with every barrier counted for thread 0 of block 0 into an extra parameter."""
    from core.cuda.source import mask
    from core.cuda.warps import NON_ALIGNED_BARRIER

    masked = mask(source)
    pieces, pos = [], 0
    for m in _BARRIER.finditer(masked):
        if m.group().startswith("asm"):
            if not source.startswith(NON_ALIGNED_BARRIER, m.start()):
                continue  # some other inline assembly
            end, call = m.start() + len(NON_ALIGNED_BARRIER), "kdb_counted_barrier(kdb_barrier_count)"
        else:
            end, call = m.end(), "kdb_counted_sync(kdb_barrier_count)"
        pieces += [source[pos:m.start()], call]
        pos = end
    pieces.append(source[pos:])
    body = "".join(pieces)
    body = re.sub(rf"\b{kernel}\s*\(", f"{kernel}(unsigned int* __restrict__ kdb_barrier_count, ", body, count=1)
    helper = ("__device__ __forceinline__ void kdb_counted_sync(unsigned int* count) {\n"
              "  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && blockIdx.x == 0 && blockIdx.y == 0\n"
              "      && blockIdx.z == 0) atomicAdd(count, 1u);\n  __syncthreads();\n}\n")
    non_aligned = helper.replace("kdb_counted_sync", "kdb_counted_barrier")
    non_aligned = non_aligned.replace("__syncthreads()", NON_ALIGNED_BARRIER)
    return helper + non_aligned + body


def count_barriers(job: dict[str, Any]) -> dict[str, Any]:
    cuda = _cuda()
    fn = _compile(instrument(job["source"], job["kernel"]), job["kernel"])
    arrays, out_shape = _inputs(job)
    counter = cuda.to_device(np.zeros(1, dtype=np.uint32))
    with _holding_gpu():
        fn(counter, *[cuda.to_device(a) for a in arrays], cuda.mem_alloc(int(np.prod(out_shape)) * 4),
           block=tuple(job["block"]), grid=tuple(job["grid"]))
        cuda.Context.synchronize()
    return {"ok": True, "barriers": int(cuda.from_device(counter, (1,), np.uint32)[0])}


def devices(job: dict[str, Any]) -> dict[str, Any]:
    from core.gpu.inventory import _probe

    return {"ok": True, "extra": _probe()}


JOBS = {"verify": verify, "time": time_kernel, "barriers": count_barriers, "devices": devices}


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        try:
            answer = JOBS[job["kind"]](job)
        except Exception as exc:  # the job fails, the worker lives on: the parent gets the cause
            answer = {"ok": False, "reason": f"{type(exc).__name__}: {str(exc).strip()[:1500]}",
                      "extra": {"traceback": traceback.format_exc()[-3000:]}}
        answer["kind"] = job["kind"]
        if "device" in _state:
            answer["device"] = _state["device"].name()
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    if "context" in _state:
        _state["context"].pop()


if __name__ == "__main__":
    main()
