"""The CUDA design space we tune in: MetaSchedule's own, less the schedules NNFusion could never take.

On sm_80 and newer, MetaSchedule's multi-level tiling adds software pipelines with asynchronous stages
(cp.async). TVM emits those as helper functions beside the kernel, but a kernel DB row carries one
function body, so such a kernel is never self-contained. On the H200 the 16 best schedules of a
192-trial run all used them and none could be injected. Dropping those design spaces up front means
every trial measures a schedule we can ship.

MetaSchedule's cross-thread reduction also spreads a reduction of fewer elements than a warp over a block
of threads (a 3x3 max pool: 9 elements, threads 4-512), one output per block: most lanes idle, and 200,704
blocks for ResNet-18's max pool. It is never competitive, yet on the H200 (session 8) the search took it for
that pool: 125 us against cuDNN's 8.4. Those design spaces are dropped too; a reduction of a warp or more
(a global average pool: 49) keeps them, and there they win (0.49x cuDNN).

Of an op of several reductions (a softmax: a row's max, then its sum), MetaSchedule's spaces mostly launch a kernel
per reduction (3 of the 4 for a softmax); only the one that computes both inside the output's kernel is kept.
"""

from __future__ import annotations

import re
from typing import Any

ASYNC_ANNOTATION = "software_pipeline_async_stages"
WARP = 32


def uses_async_pipeline(schedule: Any) -> bool:
    return any(inst.kind.name == "Annotate" and str(inst.attrs[0]) == ASYNC_ANNOTATION
               for inst in schedule.trace.insts)


def launches(schedule: Any) -> int:
    """How many kernels the scheduled function launches: the loop nests at its top level bound to blocks. A row holds
    one; MetaSchedule's spaces for an op of several reductions (a softmax) mostly launch one per reduction."""
    import tvm_ffi
    from tvm import tirx

    body = schedule.mod["main"].body
    stmt = body.block.body if hasattr(body, "block") else body
    count = 0
    for nest in (list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else [stmt]):
        bound: list[bool] = []

        def visit(node: Any, bound: list[bool] = bound) -> None:
            if node.kind == tirx.ForKind.THREAD_BINDING and str(node.thread_binding.thread_tag).startswith("blockIdx"):
                bound.append(True)

        tvm_ffi.structural_walk(nest, [(tirx.For, visit)])
        count += bool(bound)
    return count


def spreads_a_short_reduction_over_threads(schedule: Any) -> bool:
    """A reduction of fewer than a warp's elements whose reduction loops are bound to threads."""
    from math import prod

    from tvm import tirx

    from core.codegen.schedule import is_reduction, loop_kinds
    from core.errors import InputError

    root = schedule.get_sblock("root")
    for block in schedule.get_child_blocks(root):
        if not is_reduction(schedule, block):
            continue
        extents = [iv.dom.extent for iv in schedule.get(block).iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        if not all(hasattr(e, "value") for e in extents) or prod(int(e.value) for e in extents) >= WARP:
            continue
        try:
            kinds = loop_kinds(schedule, block)
        except InputError:  # a loop feeding both kinds: not the cross-thread rule's shape
            continue
        for loop, kind in kinds:
            binding = schedule.get(loop).thread_binding
            if kind == "R" and binding is not None and str(binding.thread_tag).startswith("threadIdx"):
                return True
    return False


# The vector widths MetaSchedule's cooperative fetch may load a staged operand with, for a half workload: 2 is CUDA's
# half2. TVM writes 4 halves as `half4`, a struct of its own prelude that NNFusion's code lacks, and a gather of 8 as
# make_uint4 of 8 values; nvcc refuses both (a third and a sixth of sampled candidates, each a trial wasted), and
# TVM has no vector of 3 or 16 halves. (Its default: 1, 2, 3, 4, 8, 16.)
HALF_VECTOR_LOAD_LENS = (1, 2)


def is_half_workload(mod: Any) -> bool:
    """Whether any buffer of the workload holds float16 (read off its TVMScript: this TVM's PrimFunc does not expose
    its buffer map to Python)."""
    return re.search(r'T\.Buffer\([^"]*"float16"', mod.script()) is not None


def simt_rules(half: bool) -> list[Any]:
    """MetaSchedule's CUDA rules ("cuda"); for a half workload its multi-level tiling loads staged operands only in
    vector widths a row can hold (HALF_VECTOR_LOAD_LENS), with every other setting as TVM's default."""
    from tvm.s_tir import meta_schedule as ms

    rules = list(ms.ScheduleRule.create("cuda"))
    if half:
        tiling = [i for i, rule in enumerate(rules) if type(rule).__name__ == "MultiLevelTiling"]
        if len(tiling) != 1:  # another TVM: its defaults are not the ones this rule copies
            raise RuntimeError(f"MetaSchedule's CUDA rules hold {len(tiling)} MultiLevelTiling rules, where TVM 0.27 "
                               "has one: the half rule set must be made again for this TVM")
        reuse = ms.schedule_rule.ReuseType
        rules[tiling[0]] = ms.schedule_rule.MultiLevelTiling(  # TVM 0.27's ScheduleRule::DefaultCUDA, but the widths
            structure="SSSRRSRS", tile_binds=["blockIdx.x", "vthread.x", "threadIdx.x"], max_innermost_factor=64,
            vector_load_lens=list(HALF_VECTOR_LOAD_LENS),
            reuse_read=reuse(req="must", levels=[4], scope="shared"),
            reuse_write=reuse(req="must", levels=[3], scope="local"))
    return rules


def uses_dynamic_shared_memory(schedule: Any) -> bool:
    """MetaSchedule's tensor-core rules stage operands in `shared.dyn`: the kernel declares `extern __shared__`, and
    NNFusion launches every kernel with 0 bytes of it (injection refuses such a kernel)."""
    return "shared.dyn" in str(schedule.trace)


def self_contained_cuda_space() -> Any:
    """A space generator: MetaSchedule's CUDA post-order-apply spaces without asynchronous pipelines.

    For fp16 workloads MetaSchedule's tensor-core rules replace its SIMT tiling, and every space they give stages
    its operands in dynamic shared memory (and calls WMMA, whose header NNFusion's code does not include): no trial
    of them could be shipped. Those spaces are dropped, and the workload gets MetaSchedule's SIMT CUDA spaces instead
    (half arithmetic on the CUDA cores). Tensor cores for fp16 rows need a static-shared, PTX-mma variant of the rule
    (TVM 0.27 registers no static-shared mma store for f16): not done yet."""
    import tvm.s_tir.tensor_intrin  # noqa: F401  (the tensor-core rules look their intrinsics up; TuneContext imports it too)
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class SelfContainedCudaSpace(ms.space_generator.PySpaceGenerator):
        def __init__(self) -> None:
            # Concrete rule sets (what "from-target" picks for sm_70+): a Python space generator does not
            # resolve "from-target" itself.
            self.sch_rules = ms.ScheduleRule.create("cuda-tensorcore")
            self.postprocs = ms.Postproc.create("cuda-tensorcore")
            self.mutator_probs = ms.Mutator.create("cuda-tensorcore")
            self.inner = ms.space_generator.PostOrderApply(
                sch_rules=self.sch_rules, postprocs=self.postprocs, mutator_probs=self.mutator_probs)
            self.simt, self.simt_half = (ms.space_generator.PostOrderApply(
                sch_rules=simt_rules(half), postprocs=self.postprocs, mutator_probs=self.mutator_probs)
                for half in (False, True))

        def _initialize_with_tune_context(self, context: Any) -> None:
            for generator in (self.inner, self.simt, self.simt_half):
                generator._initialize_with_tune_context(context)

        def generate_design_space(self, mod: Any) -> list[Any]:
            spaces = self.inner.generate_design_space(mod)
            if spaces and all(map(uses_dynamic_shared_memory, spaces)):
                spaces = (self.simt_half if is_half_workload(mod) else self.simt).generate_design_space(mod)
            return [s for s in spaces if not uses_async_pipeline(s) and not spreads_a_short_reduction_over_threads(s)
                    and not uses_dynamic_shared_memory(s) and launches(s) == 1]

        def clone(self) -> Any:
            return SelfContainedCudaSpace()

    return SelfContainedCudaSpace()


def tensor_core_space(config: Any) -> Any:
    """The design space of an op on the tensor cores: core/codegen/tensorcore.py's schedule, its tilings and copy
    widths sampled (MetaSchedule's evolutionary search mutates the tilings; the cost model ranks the candidates as
    for any other op). VerifyGPUCode drops candidates over the block's limits (threads, 48 KB of static shared)."""
    from tvm.s_tir import meta_schedule as ms

    from core.codegen import tensorcore

    def schedule(sch: Any) -> list[Any]:
        return tensorcore.design_space(sch, config)

    return ms.space_generator.ScheduleFn(
        schedule, sch_rules=[], postprocs=[ms.postproc.DisallowDynamicLoop(), ms.postproc.VerifyGPUCode()],
        mutator_probs={ms.mutator.MutateTileSize(): 1.0})


def cuda_space(config: Any) -> Any:
    """The space a CUDA job tunes in: the tensor cores' for the ops they take, else MetaSchedule's self-contained."""
    from core.codegen.generate import on_tensor_cores

    return tensor_core_space(config) if on_tensor_cores(config) else self_contained_cuda_space()
