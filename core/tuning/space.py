"""The CUDA design space we tune in: MetaSchedule's own, less the schedules NNFusion could never take.

On sm_80 and newer, MetaSchedule's multi-level tiling adds software pipelines with asynchronous stages
(cp.async). TVM emits those as helper functions beside the kernel, but a kernel DB row carries one
function body, so such a kernel is never self-contained. On the H200 the 16 best schedules of a
192-trial run all used them and none could be injected. Dropping those design spaces up front means
every trial measures a schedule we can ship.
"""

from __future__ import annotations

from typing import Any

ASYNC_ANNOTATION = "software_pipeline_async_stages"


def uses_async_pipeline(schedule: Any) -> bool:
    return any(inst.kind.name == "Annotate" and str(inst.attrs[0]) == ASYNC_ANNOTATION
               for inst in schedule.trace.insts)


def self_contained_cuda_space() -> Any:
    """A space generator: MetaSchedule's CUDA post-order-apply spaces without asynchronous pipelines."""
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

        def _initialize_with_tune_context(self, context: Any) -> None:
            self.inner._initialize_with_tune_context(context)

        def generate_design_space(self, mod: Any) -> list[Any]:
            return [s for s in self.inner.generate_design_space(mod) if not uses_async_pipeline(s)]

        def clone(self) -> Any:
            return SelfContainedCudaSpace()

    return SelfContainedCudaSpace()
