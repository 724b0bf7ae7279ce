"""Shared arrays keep their alignment where NNFusion puts them, and GPU jobs run the kernel as NNFusion does.

Seen on the H200: a TVM-tuned conv declares `__shared__ alignas(64) float pad_temp_shared_ptr[2457];` and
`... input1_shared_ptr[784];` and reads them with float4. NNFusion re-declares both from `shared_memory`
without the alignas, so the second starts at byte 9828 and the compiled ResNet-18 faulted with "misaligned
address", while kdb's verification (which ran the original function_body) had passed the kernel.
"""

from __future__ import annotations

import json
import sqlite3
from itertools import accumulate

import pytest

from core.cuda.nvcc import standalone_source
from core.cuda.source import parse_kernel
from core.gpu.jobs import job_for_row
from core.inject.prepare import prepare
from core.kernels.kernel_row import ALIGN_PREFIX, COLUMNS, DTYPE_BYTES
from core.kernels.lint import CRASH, lint_row

CODE = """extern "C" __global__ void __launch_bounds__(64) default_function_kernel(float* __restrict__ input0,
    float* __restrict__ input1, float* __restrict__ output0) {
  __shared__ alignas(64) float a_shared[2457];
  __shared__ alignas(64) float b_shared[784];
  for (int i = threadIdx.x; i < 2457; i += 64) a_shared[i] = input0[i];
  for (int i = threadIdx.x; i < 784; i += 64) b_shared[i] = input1[i];
  __syncthreads();
  float4 v = ((float4*)b_shared)[threadIdx.x];
  output0[threadIdx.x] = a_shared[threadIdx.x] + v.x + v.y + v.z + v.w;
}"""
ITEM = {"tvm_func_name": "aligned", "op_type": "Add",
        "parameters": {"input_shapes": [[2457], [2457]], "output_shape": [2457]},
        "code": CODE, "gridDim": [1, 1, 1], "blockDim": [64, 1, 1]}


def _function(row) -> dict:
    return json.loads(row.function)


def test_padded_sizes_put_every_array_on_the_asked_boundary():
    row = prepare("k.json", 0, ITEM).row
    assert row is not None
    sm = _function(row)["shared_memory"]
    assert sm["symbol"] == ["__align__(64) a_shared", "__align__(64) b_shared"]  # declared as TVM declared them
    assert sm["size"][0] >= 2457 and sm["size"][1] >= 784
    byte_sizes = [4 * n for n in sm["size"]]
    # BlockFusion form: running offsets in one shared_buffer; plain form: one array after the other
    assert all(offset % 64 == 0 for offset in accumulate(byte_sizes))
    assert lint_row((1, *row.values())) == []


def block_fusion_offsets(shared_memory: dict) -> list[int]:
    """Each array's byte offset in NNFusion's one shared_buffer of a BlockFusion kernel: the running sum of the
    arrays before it."""
    sizes = [DTYPE_BYTES[t] * n for t, n in zip(shared_memory["dtype"], shared_memory["size"], strict=True)]
    return [0, *accumulate(sizes)][:-1]


# Kernels whose arrays do not all ask for an alignment: an aligned array after an unaligned one must still land
# on its boundary, so the unaligned arrays are padded too (padding only the arrays that ask for it faults).
MIXED = {
    "unaligned, then aligned": ("__shared__ float a_shared[2457];", "__shared__ alignas(64) float b_shared[784];"),
    "aligned, then unaligned": ("__shared__ alignas(64) float a_shared[2457];", "__shared__ float b_shared[784];"),
    "half between them": ("__shared__ alignas(16) float a_shared[2457];\n  __shared__ half h_shared[3];",
                          "__shared__ alignas(64) float b_shared[784];"),
}


def mixed_item(first: str, second: str) -> dict:
    code = CODE.replace("__shared__ alignas(64) float a_shared[2457];", first) \
               .replace("__shared__ alignas(64) float b_shared[784];", second)
    if "h_shared" in code:
        code = "#include <cuda_fp16.h>\n" + code.replace("__syncthreads();", "h_shared[0] = a_shared[0];\n  __syncthreads();")
    return {**ITEM, "code": code}


@pytest.mark.parametrize("case", list(MIXED))
def test_mixed_alignment_keeps_each_aligned_array_on_its_boundary_in_both_forms(case: str):
    src = parse_kernel(mixed_item(*MIXED[case])["code"])
    asked = {d.symbol: d.align for d in src.shared if d.align}
    assert asked and len(asked) < len(src.shared)  # a mixed fixture: some arrays ask, some do not
    row = prepare("k.json", 0, mixed_item(*MIXED[case])).row
    assert row is not None
    sm = _function(row)["shared_memory"]
    for symbol, offset in zip(sm["symbol"], block_fusion_offsets(sm), strict=True):
        name = ALIGN_PREFIX.sub("", symbol)
        if name in asked:  # BlockFusion form: the array at its running offset; plain form: __align__ in the symbol
            assert offset % asked[name] == 0, (case, sm)
            assert symbol == f"__align__({asked[name]}) {name}", (case, sm)
        else:
            assert symbol == name, (case, sm)  # declared as TVM declared it: no alignment it did not ask for
    assert lint_row((1, *row.values())) == []


@pytest.mark.parametrize("case", list(MIXED))
def test_a_mixed_row_with_an_unpadded_array_before_an_aligned_one_is_a_crash_finding(case: str):
    row = prepare("k.json", 0, mixed_item(*MIXED[case])).row
    fn = _function(row)
    src = parse_kernel(mixed_item(*MIXED[case])["code"])
    # only the arrays that ask for an alignment padded (sizes as TVM declared them for the others)
    fn["shared_memory"]["size"] = [size if d.align else d.size
                                   for size, d in zip(fn["shared_memory"]["size"], src.shared, strict=True)]
    aligned_after_unpadded = any(offset % 64 for offset, d in zip(block_fusion_offsets(fn["shared_memory"]),
                                                                 src.shared, strict=True) if d.align == 64)
    values = dict(zip(COLUMNS, row.values(), strict=True), Function=json.dumps(fn))
    findings = [f.severity for f in lint_row((1, *values.values())) if f.check == "shared-alignment"]
    assert findings == ([CRASH] if aligned_after_unpadded else [])


def test_a_row_that_lost_the_alignment_is_a_crash_finding():
    row = prepare("k.json", 0, ITEM).row
    fn = _function(row)
    fn["shared_memory"]["size"] = [2457, 784]  # as kdb wrote it before the fix
    values = dict(zip(COLUMNS, row.values(), strict=True), Function=json.dumps(fn))
    findings = [f for f in lint_row((1, *values.values())) if f.check == "shared-alignment"]
    assert [f.severity for f in findings] == [CRASH]
    assert "misaligned" in findings[0].message


def test_gpu_jobs_run_the_kernel_in_nnfusions_form():
    row = prepare("k.json", 0, ITEM).row
    fn = _function(row)
    source = job_for_row(row, "verify")["source"]
    assert source == standalone_source(fn)
    # the shared arrays as NNFusion's emit_alloc_shared declares them, then block_function_body
    assert f"__shared__ float __align__(64) a_shared[{fn['shared_memory']['size'][0]}];" in source
    assert fn["block_function_body"].strip() in source
    assert "alignas" not in source  # not the original declarations of function_body


def test_the_stored_row_round_trips_through_sqlite(tmp_path):
    # the padded sizes are plain ints NNFusion's nlohmann::json reads as size_t
    row = prepare("k.json", 0, ITEM).row
    conn = sqlite3.connect(tmp_path / "k.db")
    conn.execute("CREATE TABLE t (f TEXT)")
    conn.execute("INSERT INTO t VALUES (?)", (row.function,))
    assert all(isinstance(n, int) for n in json.loads(conn.execute("SELECT f FROM t").fetchone()[0])
               ["shared_memory"]["size"])


def test_a_row_that_declares_its_arrays_without_their_alignment_is_a_warning():
    """Rows injected before the symbols carried `__align__(N)`: they run, but without 128-bit shared loads."""
    from core.kernels.lint import WARNING

    row = prepare("k.json", 0, ITEM).row
    fn = _function(row)
    fn["shared_memory"]["symbol"] = ["a_shared", "b_shared"]  # as kdb wrote it before (sizes still padded)
    values = dict(zip(COLUMNS, row.values(), strict=True), Function=json.dumps(fn))
    findings = lint_row((1, *values.values()))
    assert [(f.severity, f.check) for f in findings] == [(WARNING, "shared-alignment-dropped")]
    assert "alignas(64)" in findings[0].message and "kdb db repair --apply" in findings[0].message


def test_kdb_db_repair_gives_old_rows_their_alignment_back_and_keeps_the_rest(tmp_path):
    """A fused kernel injected before 1f8bb1c (plain symbols), its CUDA twin, and a second kernel of the same op
    after it: repair previews, then rewrites the symbols of the first kernel and its twin only, keeping the
    Key, the profile and the order NNFusion reads the op's rows in."""
    from dataclasses import replace

    from conftest import run_kdb_json
    from test_pattern_twins import fused_row, stored

    from core.db.kernel_db import KernelDB
    from core.kernels.kernel_row import twin_key
    from core.kernels.lint import lint_rows

    fn = _function(prepare("k.json", 0, ITEM).row)
    old = {**fn, "shared_memory": {**fn["shared_memory"], "symbol": ["a_shared", "b_shared"]}}
    profile = json.dumps({"external_profile": {"time": "NVIDIA H200:12.5;", "resource": 64}})
    first = replace(fused_row("kdb:first", miscs=profile), function=json.dumps(old))
    second = replace(fused_row("kdb:second"), function=json.dumps(fn))  # in the form injection writes now
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(first)
        db.insert(second)
    before = stored(tmp_path / "k.db")
    proc, preview = run_kdb_json("db", "repair", "--db", str(tmp_path / "k.db"))
    assert proc.returncode == 1 and [m["key"] for m in preview["misaligned"]] == ["kdb:first"]
    assert preview["realigned"] == [] and stored(tmp_path / "k.db") == before  # a preview writes nothing
    proc, done = run_kdb_json("db", "repair", "--db", str(tmp_path / "k.db"), "--apply")
    assert proc.returncode == 0 and done["realigned"] == ["kdb:first"]
    after = stored(tmp_path / "k.db")
    for key in ("kdb:first", twin_key("kdb:first")):
        assert json.loads(after[key][COLUMNS.index("Function")])["shared_memory"]["symbol"] == [
            "__align__(64) a_shared", "__align__(64) b_shared"]
        assert after[key][COLUMNS.index("Miscs")] == profile
    assert after["kdb:second"] == before["kdb:second"]
    conn = sqlite3.connect(tmp_path / "k.db")
    order = [k for (k,) in conn.execute("SELECT Key FROM KernelCache WHERE DeviceType = 'CUDA_GPU' ORDER BY rowid")]
    findings = list(lint_rows(conn.execute(f"SELECT rowid, {', '.join(COLUMNS)} FROM KernelCache")))
    conn.close()
    assert order == ["kdb:first", "kdb:second"]  # NNFusion still takes the same first row of the op
    assert not [f for f in findings if f.check == "shared-alignment-dropped"]
    proc, again = run_kdb_json("db", "repair", "--db", str(tmp_path / "k.db"))
    assert proc.returncode == 0 and again["misaligned"] == []


def test_restricted_signature_adds_restrict_to_the_form_injection_writes_and_leaves_others():
    from core.db.realign import restricted_signature

    plain = 'extern "C" __launch_bounds__(128, 1) __global__ void (float* input0, float* input1, float* output0)'
    assert restricted_signature(plain) == ('extern "C" __launch_bounds__(128, 1) __global__ void (float* __restrict__ '
                                           'input0, float* __restrict__ input1, float* __restrict__ output0)')
    assert restricted_signature(restricted_signature(plain) or "") is None  # already there: nothing to do
    # NNFusion's import script's form (no launch bounds) and odd parameters are not ours to rewrite
    assert restricted_signature('extern "C" __global__  void (float* input0, float* output0)') is None
    assert restricted_signature('extern "C" __launch_bounds__(64) __global__ void (float* input0, int n)') is None


def test_kdb_db_repair_gives_old_rows_restrict_pointers_and_keeps_their_key_and_profile(tmp_path):
    """A kernel injected before rows declared their pointers __restrict__, its twin, and a row of NNFusion's import
    script's form: repair rewrites the first (and its twin) only."""
    from dataclasses import replace

    from conftest import run_kdb_json
    from test_pattern_twins import fused_row, stored

    from core.db.kernel_db import KernelDB
    from core.kernels.kernel_row import twin_key

    fn = _function(prepare("k.json", 0, ITEM).row)
    assert "float* __restrict__ input0" in fn["function_signature"]  # what injection writes now
    old = {**fn, "function_signature": fn["function_signature"].replace("__restrict__ ", "")}
    foreign = {**old, "function_signature": 'extern "C" __global__  void (float* input0, float* input1, '
                                            'float* input2, float* output0)'}
    profile = json.dumps({"external_profile": {"time": "NVIDIA H200:12.5;", "resource": 64}})
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(replace(fused_row("kdb:old", miscs=profile), function=json.dumps(old)))
        db.insert(replace(fused_row("kdb:foreign"), function=json.dumps(foreign)))
        # NNFusion's own kernels may share an output with an input (in-place pairs): never given __restrict__
        db.insert(replace(fused_row("kdb:own"), function=json.dumps(old), source="Default"))
    before = stored(tmp_path / "k.db")
    proc, done = run_kdb_json("db", "repair", "--db", str(tmp_path / "k.db"), "--apply")
    assert proc.returncode == 0 and done["realigned"] == ["kdb:old"], done
    after = stored(tmp_path / "k.db")
    for key in ("kdb:old", twin_key("kdb:old")):
        assert json.loads(after[key][COLUMNS.index("Function")]) == fn
        assert after[key][COLUMNS.index("Miscs")] == profile
    assert after["kdb:foreign"] == before["kdb:foreign"] and after["kdb:own"] == before["kdb:own"]
