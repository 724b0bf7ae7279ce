"""Op configs -> kernel JSON with Apache TVM 0.27: define, schedule (one kernel), emit CUDA, check on CPU.

The kernel JSON is the artifact's format ({tvm_func_name, op_type, parameters, code, gridDim, blockDim})
so the injection pipeline takes it unchanged. Code generation needs no GPU. The math of every definition
can be checked on the CPU (TVM's llvm target) against a float64 numpy reference.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Any

from core.cuda.source import find_words, mask, match_close
from core.errors import InputError, ToolError
from core.opconfigs.opconfig import OpConfig, validate

_NAME_PAREN = re.compile(r"\b(\w+)\s*\(")
_DEFINITION = re.compile(r'extern\s+"\s*"\s+__global__')  # on masked text: "C" is blanked


@dataclass
class Generated:
    config: OpConfig
    item: dict[str, Any] | None = None  # the kernel JSON item
    error: str = ""
    stage: str = ""  # define | schedule | codegen | check
    tvm_error: str = ""  # TVM's message cut to its decisive lines (a TVM failure)
    script: str = ""  # TVMScript of the module that failed (none before the op is defined)
    marked: list[int] = field(default_factory=list)  # lines of `script` TVM pointed at
    max_rel_error: float | None = None
    # what max_rel_error is of: "kernel's module" (its math on the CPU), "fp32 definition" (a half tensor-core op's
    # GEMM in fp32: _cpu_checked), "" when unchecked (not asked, or too big for the CPU)
    cpu_check: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    math: str = ""  # where the kernel computes: "tensor cores (...)" or "CUDA cores: why" (math_note)


def cuda_target(arch: str) -> Any:
    import tvm

    return tvm.target.Target({"kind": "cuda", "arch": arch, "max_threads_per_block": 1024,
                              "max_shared_memory_per_block": 49152, "thread_warp_size": 32})


def kernel_name(config: OpConfig) -> str:
    digest = hashlib.sha1(config.key.encode()).hexdigest()[:10]
    return f"kdb_{config.op_type.lower()}_{digest}_kernel0"


def on_tensor_cores(config: OpConfig) -> bool:
    """Whether the op's kernel is an mma.sync one (core/codegen/tensorcore.py), else a CUDA-core one."""
    from core.codegen.tensorcore import refusal

    return not refusal(config)


def prim_func_module(config: OpConfig, *, cuda_cores: bool = False) -> tuple[Any, list[tuple[int, ...]]]:
    """The op as an IRModule with one function `main`, and the shapes of its parameters in order: the tensor cores'
    padded GEMM for the ops they take, else (or asked: cuda_cores) the op's own definition (core/codegen/te_ops.py)."""
    import tvm
    from tvm import te

    if on_tensor_cores(config) and not cuda_cores:
        from core.codegen import mma
        from core.codegen.tensorcore import define

        mma.register()  # a tuning record's trace tensorizes with kdb's intrinsics: they must exist to replay it
    else:
        from core.codegen.te_ops import define

    inputs, output = define(config)
    shapes = [tuple(int(d) for d in t.shape) for t in (*inputs, output)]
    return tvm.IRModule({"main": te.create_prim_func([*inputs, output])}), shapes


def extract_kernel(source: str, name: str) -> str:
    """The one kernel definition of TVM's CUDA source, renamed, with canonical parameter names."""
    masked = mask(source)
    definitions = []
    for m in _DEFINITION.finditer(masked):
        call = _NAME_PAREN.search(masked, m.end())
        while call and call.group(1) == "__launch_bounds__":
            call = _NAME_PAREN.search(masked, match_close(masked, call.end() - 1) + 1)
        if call is None:
            continue
        close = match_close(masked, call.end() - 1)
        after = masked[close + 1:].lstrip()
        if after.startswith("{"):
            definitions.append((m.start(), close))
    if len(definitions) != 1:
        raise InputError(f"the schedule produced {len(definitions)} kernels; a kernel-DB row holds exactly one")
    start, close = definitions[0]
    body_open = masked.index("{", close)
    body_close = match_close(masked, body_open)
    code = source[start:body_close + 1]
    code = re.sub(r"\bmain_kernel\b", name, code, count=1)
    from core.cuda.inline import inline_device_helpers

    code = inline_device_helpers(code, source)  # TVM's cp.async helpers: a row holds one function
    # TVM names parameters <buffer>_ptr; our buffers are input0.., output0: drop the suffix.
    for ptr in set(re.findall(r"\b((?:input|output)\d+)_ptr\b", code)):
        code = re.sub(rf"\b{ptr}_ptr\b", ptr, code)
    if find_words(mask(code), "main_kernel"):
        raise InputError("the kernel calls another TVM function; a kernel-DB row holds one kernel")
    return code + "\n"


def generate(config: OpConfig, arch: str, *, scheduled: Any = None, check: bool = True) -> Generated:
    """Kernel JSON for one op config (the default schedule unless `scheduled` is given)."""
    import time

    result = Generated(config)
    start = time.perf_counter()
    stage = "define"
    current: Any = None  # the module being worked on: its TVMScript goes with a failure
    try:
        validate(config)
        if config.groups != 1:
            from core.opconfigs.onnx_extract import grouped_conv_reason

            p = config.params
            reason, _ = grouped_conv_reason(config.groups, p["input_shape"][1], p["filter_shape"][0])
            raise InputError(f"{reason}; no kernel JSON is written")
        mod, shapes = prim_func_module(config)
        current = mod
        stage = "schedule"
        from core.codegen.schedule import default_schedule, launch_dims

        default = scheduled is None
        tensor_cores = on_tensor_cores(config)
        if default and tensor_cores:
            scheduled = current = tensor_core_default(mod, config)
        else:
            scheduled = current = default_schedule(mod) if default else scheduled
        from core.codegen.whole_warps import whole_warp_module

        scheduled = current = whole_warp_module(scheduled)  # as the tuner built it: core/codegen/whole_warps.py
        grid, block = launch_dims(scheduled)
        stage = "codegen"

        exe = compile_cuda_module(scheduled, arch)
        source = exe.mod.imports[0].inspect_source()
        name = kernel_name(config)
        code = extract_kernel(source, name)
        item = {"tvm_func_name": name, "op_type": config.op_type, "parameters": dict(config.params),
                "code": code, "gridDim": list(grid), "blockDim": list(block)}
        if config.dtype != "float":  # kernel JSON's default is float: a half kernel says so, or it is read as fp32
            item["dtype"] = config.dtype
        if config.math and tensor_cores:  # a TF32 kernel: verified and run by TF32's error bound
            item["math"] = config.math
        if check:
            stage = "check"
            from core.codegen.reference import check_on_cpu

            # The default schedule's own math, its thread loops left serial; a tuned schedule's definition.
            checked = default_schedule(mod, bind=False) if default and not tensor_cores else mod
            as_checked, checked, checked_shapes = _cpu_checked(config, checked, shapes, tensor_cores)
            result.max_rel_error = check_on_cpu(as_checked, checked, checked_shapes)
            if result.max_rel_error is not None:
                result.cpu_check = "fp32 definition" if as_checked is not config else "kernel's module"
        result.math = math_note(config)
        result.notes.append(result.math)
        result.item = item  # only a kernel whose math checked out (or was not asked to be checked)
    except InputError as exc:  # (its place, when it is the op config's own, is said with the failure already)
        result.error, result.stage = exc.reason if exc.where == config.source else str(exc), stage
        result.script = _script(current)
    except ToolError:
        raise
    except Exception as exc:  # TVM raises its own error types: keep the cause, fail this config only
        from core.codegen.diagnostics import diagnose

        diagnosis = diagnose(exc)
        result.error, result.stage, result.tvm_error = diagnosis.reason, stage, diagnosis.excerpt
        # A schedule error prints the module as it was when the primitive failed: the most precise place.
        result.script, result.marked = (diagnosis.script, diagnosis.marked) if diagnosis.script else (
            _script(current), [])
    result.seconds = time.perf_counter() - start
    return result


def _cpu_checked(config: OpConfig, mod: Any, shapes: list[tuple[int, ...]],
                 tensor_cores: bool) -> tuple[OpConfig, Any, list[tuple[int, ...]]]:
    """What the CPU check runs: the module itself, but for a half tensor-core op its padded GEMM defined in fp32
    (the same index math, padding and patches: what the check is for). LLVM emulates half on the CPU, which made
    an fp16 VGG's codegen 12x slower than fp32's (issue 39); the half kernel's own numbers are verified on the GPU."""
    if not (tensor_cores and config.dtype == "half"):
        return config, mod, shapes
    as_float = replace(config, dtype="float", math="tf32")  # the tensor cores' definition, operands in fp32
    float_mod, float_shapes = prim_func_module(as_float)
    return as_float, float_mod, float_shapes


def tensor_core_default(mod: Any, config: OpConfig) -> Any:
    """The op's tensor-core GEMM scheduled with the untuned tiling (tensorcore.default_decisions)."""
    import tvm.s_tir as s_tir

    from core.codegen import tensorcore

    sch = s_tir.Schedule(mod)
    tensorcore.schedule(sch, config, tensorcore.default_decisions(config))
    return sch.mod


def compile_cuda_module(scheduled: Any, arch: str) -> Any:
    """TVM's CUDA build of a scheduled module; kernels with warp fragments take kdb's lowering (core/codegen/mma.py)."""
    import tvm

    from core.codegen import mma

    pipeline = mma.install_pipeline() if mma.uses_fragments(scheduled) else "default"
    return tvm.compile(scheduled, target=cuda_target(arch), tir_pipeline=pipeline)


def math_note(config: OpConfig) -> str:
    """Where the op's kernel computes, for the user: the tensor cores, or the CUDA cores and why."""
    from core.codegen.tensorcore import refusal

    reason = refusal(config)
    if reason:
        plain = config.dtype == "float" and not config.math  # an fp32 op nobody asked to run in TF32
        return f"CUDA cores ({config.dtype})" if plain else f"CUDA cores: {reason}"
    return f"tensor cores (mma.sync{' tf32' if config.math == 'tf32' else ''}, fp32 accumulation)"


def _script(mod: Any) -> str:
    from core.codegen.diagnostics import MAX_SCRIPT

    return mod.script()[:MAX_SCRIPT] if mod is not None else ""


def require_tvm() -> None:
    try:
        import tvm  # noqa: F401
    except ImportError as exc:
        raise ToolError("Apache TVM is not installed: pip install -e '.[tvm]' (apache-tvm==0.27.0.post1)") from exc
