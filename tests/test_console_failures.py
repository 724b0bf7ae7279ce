"""Pilot tests of the Failures view: grouping, detail, retry after a settings change, edit + retry, dismiss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from console_helpers import SNAPSHOT_DIR, FixedDeviceApp, build_small_db, wait_until
from rich.console import Console
from textual.widgets import TextArea

from console.context import ConsoleContext
from console.screens.failures import FailuresScreen, FailureTree, group_failures
from console.widgets.dialogs import ConfirmDialog
from console.widgets.failure_detail import field_line, json_lines, log_excerpt
from core.cuda.nvcc import find_nvcc, translation_unit
from core.db.kernel_db import KernelDB
from core.db.state import Failure, StateDB
from core.demo import _elementwise
from core.errors import ToolError
from core.inject.pipeline import InjectOptions
from core.inject.prepare import prepare
from core.inject.session import open_injector
from core.kernels.kernel_row import distinct_kernels
from core.settings import load_settings


def _has_nvcc() -> bool:
    try:
        return bool(find_nvcc())
    except ToolError:
        return False


# Retries compile-check with the settings' archs, as every retry does.
needs_nvcc = pytest.mark.skipif(not _has_nvcc(), reason="nvcc is not installed")


def sm90_only_item(name: str = "pair_accumulate_kernel0", size: int = 1024) -> dict:
    """An element-wise kernel that builds only for sm_90+ (atomicAdd on float2)."""
    item = _elementwise("Relu", [1, size], "atomicAdd((float2*)output0, make_float2(input0[i], 0.000000e+00f)).x", 1)
    item["tvm_func_name"] = name
    item["code"] = item["code"].replace("demo_relu_kernel0", name)
    return item


def mismatched_relu_item() -> dict:
    item = _elementwise("Relu", [1, 2048], "max(input0[i], 0.000000e+00f)", 1)
    item["parameters"]["output_shape"] = [1, 1024]  # element-wise ops do not broadcast: a validate failure
    return item


def inject(db_path: Path, items: list[dict], source: Path, **options: object) -> None:
    source.write_text(json.dumps(items), encoding="utf-8")
    with open_injector(db_path, InjectOptions(**options)) as injector:  # type: ignore[arg-type]
        injector.run([source])


def open_failures(db_path: Path) -> list[Failure]:
    state = StateDB()
    try:
        return state.failures(db_path)
    finally:
        state.close()


def kernel_count(db_path: Path) -> int:
    """Kernels, not rows: a fused kernel's CUDA twin is part of it."""
    with KernelDB.open(db_path) as db:
        return sum(1 for _ in distinct_kernels(db.iter_rows()))


def make_app(db_path: Path, archs: list[str] | None = None) -> FixedDeviceApp:
    settings = load_settings()
    settings.workers = 1  # no process pool for a handful of items
    if archs:
        settings.archs = archs
    return FixedDeviceApp(ConsoleContext(db_path=db_path, settings=settings, device_summary="no CUDA device (test)"))


def shown_text(widget) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(widget.content)
    return console.export_text()


def leaves(tree: FailureTree) -> list:
    return [leaf for stage in tree.root.children for reason in stage.children for leaf in reason.children]


async def open_view(pilot, app: FixedDeviceApp, n_leaves: int) -> FailureTree:
    await pilot.press("3")
    tree = app.screen.query_one(FailureTree)
    # The cursor moves to its failure after the tree's next render (FailureTree.show): until then `r` finds no
    # failure selected and starts nothing, which once left a retry wait hanging in a loaded CI run.
    await wait_until(pilot, lambda: len(leaves(tree)) == n_leaves and (n_leaves == 0 or tree.cursor_node is not None),
                     f"{n_leaves} failure(s) in the tree and the cursor on one")
    tree.focus()
    return tree


async def cursor_to(pilot, tree: FailureTree, name: str) -> None:
    """Walk the tree with the keyboard, from the top down to the failure of kernel `name`."""
    await pilot.press(*["up"] * (tree.last_line + 1))
    for _ in range(tree.last_line + 1):
        node = tree.cursor_node
        if node is not None and node.data is not None and node.data.leaf and node.data.failures[0].name == name:
            title = tree.screen.query_one("#failure-place-title")
            # the place is highlighted in a worker: wait for it
            await wait_until(pilot, lambda t=title: "highlighting" not in shown_text(t), "the highlighted place")
            return
        await pilot.press("down")
    raise AssertionError(f"no failure of {name} in the tree")


async def press_and_wait_retry(pilot, app: FixedDeviceApp, *keys: str) -> None:
    """Press the keys that start a retry, then wait for its end and for the reload it starts (its RetryDone
    reloads the view: a newer load generation, whose worker has posted its failures)."""
    screen = next(s for s in app.screen_stack if isinstance(s, FailuresScreen))
    started = screen.generation
    await pilot.press(*keys)

    def reloaded() -> bool:
        loading = [w for w in app.workers if w.node is screen and w.group == "failures-load" and not w.is_finished]
        return screen.retry_worker is None and screen.generation > started and not loading

    try:
        await wait_until(pilot, reloaded, "the retry to end and the view to reload", timeout_s=120)
    except AssertionError as exc:  # once in a loaded CI run (session 16): say which step never came
        workers = [(w.name, w.group, w.state.name) for w in app.workers if w.node is screen]
        raise AssertionError(f"{exc}; retry_worker {screen.retry_worker}, generation {screen.generation} (started at "
                             f"{started}), the screen's workers {workers}") from exc
    await pilot.pause()  # the last load's message, posted before its worker finished


# -- pure helpers -----------------------------------------------------------------------------


def test_json_lines_point_at_the_failing_field():
    text, starts = json_lines({"op_type": "Relu", "parameters": {"input_shape": [1, 4], "output_shape": [1, 2]},
                               "gridDim": [1, 1, 1]})
    lines = text.splitlines()
    assert '"output_shape": [1, 2]' in lines[field_line(starts, "parameters.output_shape[1]") - 1]
    assert '"gridDim"' in lines[field_line(starts, "gridDim") - 1]
    assert json.loads(text)["parameters"]["output_shape"] == [1, 2]


def test_log_excerpt_keeps_errors_drops_notes_and_scratch_paths():
    log = ("/tmp/x/nvcc-ab12/kernel.cu(6): error: no instance of overloaded function\n"
           "            argument types are: (float2 *, float2)\n"
           "/usr/local/cuda/include/sm_60_atomic_functions.hpp(292): note #3326-D: does not match\n"
           "  static double atomicAdd(double *address, double val)\n\n"
           '2 errors detected in the compilation of "/tmp/x/nvcc-ab12/kernel.cu".\n')
    shown, cut = log_excerpt(log)
    assert shown == ["kernel.cu(6): error: no instance of overloaded function",
                     "            argument types are: (float2 *, float2)"] and cut == 0


def test_reasons_that_differ_in_numbers_share_a_group():
    def failure(i: int, stage: str, reason: str) -> Failure:
        return Failure(id=i, db_path="k.db", file="a.json", item_index=i, stage=stage, reason=reason)

    grouped = group_failures([failure(0, "compile", "nvcc (sm_75): bad"),
                              failure(2, "validate", "line 12: [1, 2] differs"),
                              failure(1, "validate", "line 7: [1, 4] differs")])
    assert [stage for stage, _ in grouped] == ["validate", "compile"]  # pipeline order
    [(title, group)] = grouped[0][1]
    assert title == "line #: [#, #] differs" and [f.item_index for f in group] == [1, 2]
    assert grouped[1][1][0][0] == "nvcc (sm_75): bad"  # a single reason keeps its numbers


# -- the view -------------------------------------------------------------------------------


async def test_tree_groups_the_demo_failure_under_its_stage_and_shows_the_reason(tmp_path: Path):
    app = make_app(build_small_db(tmp_path / "k.db"))
    async with app.run_test(size=(160, 45)) as pilot:
        tree = await open_view(pilot, app, 1)
        stage = tree.root.children[0]
        assert str(stage.label).startswith("barriers")
        assert "demo_sigmoid_spin_kernel0" in str(leaves(tree)[0].label)
        await cursor_to(pilot, tree, "demo_sigmoid_spin_kernel0")
        summary = shown_text(app.screen.query_one("#failure-summary"))
        assert "barrier count not provable statically" in summary and "small_kernels.json" in summary
        listing = shown_text(app.screen.query_one("#failure-listing"))
        assert "__syncthreads();" in listing  # the kernel's code, barrier lines marked
        assert "1 open failure(s) in 1 file(s)" in shown_text(app.screen.query_one("#failures-status"))


@needs_nvcc
async def test_retry_a_compile_failure_after_a_settings_change(tmp_path: Path):
    db = build_small_db(tmp_path / "k.db", with_failure=False)
    inject(db, [sm90_only_item()], tmp_path / "sm90_only.json", archs=("sm_75",), compile=True)
    [failure] = open_failures(db)
    detail = failure.detail_dict()
    assert failure.stage == "compile" and detail["arch"] == "sm_75"
    assert "atomicAdd" in detail["source"].splitlines()[detail["line"] - 1]

    app = make_app(db, archs=["sm_75"])
    async with app.run_test(size=(160, 45)) as pilot:
        tree = await open_view(pilot, app, 1)
        await cursor_to(pilot, tree, "pair_accumulate_kernel0")
        assert "error at line" in shown_text(app.screen.query_one("#failure-place-title"))
        assert "atomicAdd" in shown_text(app.screen.query_one("#failure-log"))

        await press_and_wait_retry(pilot, app, "r")  # same settings: fails again, as a fresh failure
        [again] = open_failures(db)
        assert again.id != failure.id and again.stage == "compile"
        assert tree.cursor_node is not None and tree.cursor_node.data.failures[0].id == again.id

        app.context.settings.archs = ["sm_90"]
        await press_and_wait_retry(pilot, app, "r")
        assert open_failures(db) == []
        assert leaves(tree) == []
        assert "No open failures" in shown_text(app.screen.query_one("#failure-summary"))
    assert kernel_count(db) == 11 and row_from(db, "sm90_only.json#0")


def row_from(db_path: Path, origin: str) -> bool:
    """Whether the DB holds the row injected from `file#item` (the engine notes it in Miscs)."""
    with KernelDB.open(db_path) as db:
        return any(json.loads(r.miscs).get("kdb", {}).get("from") == origin for r in db.iter_rows())


@needs_nvcc
async def test_edit_the_item_then_retry_injects_it(tmp_path: Path):
    db = build_small_db(tmp_path / "k.db", with_failure=False)
    inject(db, [mismatched_relu_item()], tmp_path / "relu.json", compile=False)
    [failure] = open_failures(db)
    assert failure.stage == "validate" and failure.detail_dict()["field"] == "parameters.output_shape"

    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        tree = await open_view(pilot, app, 1)
        await cursor_to(pilot, tree, "demo_relu_kernel0")
        place = app.screen.query_one("#failure-listing")
        marked = [line for line in shown_text(place).splitlines() if "❱" in line]
        assert len(marked) == 1 and '"output_shape"' in marked[0]

        await pilot.press("e")
        await wait_until(pilot, lambda: bool(app.screen.query("#editor")), "the editor")
        editor = app.screen.query_one("#editor", TextArea)
        fixed = json.loads(editor.text)
        fixed["parameters"]["output_shape"] = [1, 2048]
        editor.load_text(json.dumps(fixed, indent=2))
        await press_and_wait_retry(pilot, app, "ctrl+s")
        assert open_failures(db) == []
    state = StateDB()
    try:
        saved = state.get_failure(failure.id)
    finally:
        state.close()
    assert saved is not None and saved.resolved_at is not None
    assert json.loads(saved.input)["parameters"]["output_shape"] == [1, 2048]
    assert kernel_count(db) == 11 and row_from(db, "relu.json#0")


async def test_dismiss_asks_then_removes_the_failure(tmp_path: Path):
    db = build_small_db(tmp_path / "k.db")
    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        tree = await open_view(pilot, app, 1)
        await cursor_to(pilot, tree, "demo_sigmoid_spin_kernel0")
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation dialog")
        await pilot.press("escape")  # cancelled: still there (only a confirmation starts the write)
        await wait_until(pilot, lambda: isinstance(app.screen, FailuresScreen), "the dialog to close")
        assert len(open_failures(db)) == 1
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation dialog")
        await pilot.press("y")
        await wait_until(pilot, lambda: leaves(tree) == [], "the tree to empty")
    assert open_failures(db) == []
    state = StateDB()
    try:
        [closed] = state.failures(db, include_closed=True)
    finally:
        state.close()
    assert closed.dismissed and closed.resolved_at is None


@needs_nvcc
async def test_retry_all_resolves_what_the_new_arch_builds(tmp_path: Path):
    db = build_small_db(tmp_path / "k.db")  # with the demo's unprovable kernel: it fails again
    inject(db, [sm90_only_item("pair_a_kernel0"), sm90_only_item("pair_b_kernel0", 2048)], tmp_path / "pairs.json",
           archs=("sm_75",), compile=True)
    demo_failure = next(f for f in open_failures(db) if f.stage == "barriers")
    assert sorted(f.stage for f in open_failures(db)) == ["barriers", "compile", "compile"]

    app = make_app(db, archs=["sm_90"])
    async with app.run_test(size=(160, 45)) as pilot:
        tree = await open_view(pilot, app, 3)
        await press_and_wait_retry(pilot, app, "R")
        await wait_until(pilot, lambda: len(leaves(tree)) == 1, "one failure left")
    [left] = open_failures(db)
    assert left.stage == "barriers" and left.id != demo_failure.id  # superseded by this retry's record
    assert kernel_count(db) == 12 and row_from(db, "pairs.json#0") and row_from(db, "pairs.json#1")


@needs_nvcc
async def test_escape_cancels_a_retry_between_kernels(tmp_path: Path):
    db = build_small_db(tmp_path / "k.db", with_failure=False)
    record_compile_failures(db, tmp_path / "many.json",
                            [sm90_only_item(f"k{i}_kernel0", 256 * (i + 1)) for i in range(8)])
    app = make_app(db, archs=["sm_90"])
    async with app.run_test(size=(160, 45)) as pilot:
        await open_view(pilot, app, 8)
        await press_and_wait_retry(pilot, app, "R", "escape")
        assert any(n.message.startswith("cancelled:") for n in app._notifications)
        assert not app.screen.query_one("#retry-progress").display
    assert len(open_failures(db)) == 8  # a cancelled retry closes none (see core.inject.retry)
    assert kernel_count(db) < 18


# -- snapshot -------------------------------------------------------------------------------

# What nvcc 13.0 printed for sm90_only_item() at sm_75 (kept fixed: the snapshot must not depend on nvcc).
NVCC_LOG = """\
/state/tmp/nvcc-h2x9/kernel.cu(6): error: no instance of overloaded function "atomicAdd" matches the argument list
            argument types are: (float2 *, float2)
      output0[i] = atomicAdd((float2*)output0, make_float2(input0[i], 0.000000e+00f)).x;
                   ^
/usr/local/cuda/targets/x86_64-linux/include/sm_60_atomic_functions.hpp(292): note #3326-D: function \
"atomicAdd(double *, double)" does not match because argument #1 does not match parameter
  static __inline__ __attribute__((device)) double atomicAdd(double *address, double val)
                                                   ^

/state/tmp/nvcc-h2x9/kernel.cu(16): error: no instance of overloaded function "atomicAdd" matches the argument list
            argument types are: (float2 *, float2)
      output0[i] = atomicAdd((float2*)output0, make_float2(input0[i], 0.000000e+00f)).x;
                   ^

2 errors detected in the compilation of "/state/tmp/nvcc-h2x9/kernel.cu".
"""


def record_compile_failures(db_path: Path, source: Path, items: list[dict]) -> None:
    """The failures the engine records for sm90_only_item()s at sm_75, without running nvcc."""
    source.write_text(json.dumps(items), encoding="utf-8")
    state = StateDB()
    try:
        run_id = state.start_run("inject", db_path, {"archs": ["sm_75"]})
        for index, item in enumerate(items):
            prepared = prepare(str(source), index, item)
            assert prepared.row is not None
            unit = translation_unit(json.loads(prepared.row.function))
            state.record_failures([Failure(
                run_id=run_id, db_path=str(db_path), file=str(source), item_index=index,
                name=item["tvm_func_name"], stage="compile",
                reason='nvcc (sm_75): no instance of overloaded function "atomicAdd" matches the argument list',
                detail=json.dumps({"arch": "sm_75", "line": 6, "log": NVCC_LOG, "source": unit}),
                input=json.dumps(item))])
    finally:
        state.close()


def test_snapshot_compile_failure_selected(snap_compare, monkeypatch: pytest.MonkeyPatch):
    root = SNAPSHOT_DIR / "failures"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    monkeypatch.setenv("KDB_STATE_DIR", str(root / "state"))
    db = build_small_db(root / "kernel_cache.db")
    record_compile_failures(db, root / "sm90_only.json", [sm90_only_item()])
    app = make_app(db)

    async def select_compile_failure(pilot) -> None:
        tree = await open_view(pilot, app, 2)
        await cursor_to(pilot, tree, "pair_accumulate_kernel0")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(160, 45), run_before=select_compile_failure)


async def test_a_retry_that_cannot_start_is_reported(tmp_path: Path):
    app = make_app(build_small_db(tmp_path / "k.db"))
    app.context.settings.nvcc_path = str(tmp_path / "no-such-nvcc")
    async with app.run_test(size=(160, 45)) as pilot:
        await open_view(pilot, app, 1)
        await press_and_wait_retry(pilot, app, "r")
        assert not app.screen.query_one("#retry-progress").display
        assert any("nvcc not found" in n.message for n in app._notifications)
    assert len(open_failures(app.context.db_path)) == 1


async def test_the_chosen_failure_is_current_before_the_cursor_reaches_it(tmp_path: Path):
    """`show` moves the cursor only after the next render. A key pressed in between (a retry right after a
    reload) must act on what `show` chose, not on the node the cursor held before (a resolved failure's)."""
    app = make_app(build_small_db(tmp_path / "k.db"))
    async with app.run_test(size=(160, 45)) as pilot:
        tree = await open_view(pilot, app, 1)
        screen = app.screen
        base = screen.failures[0]
        first = base.replace(id=101, stage="validate", item_index=0, name="first")
        second = base.replace(id=102, stage="compile", item_index=1, name="second")
        tree.show([first, second])
        await wait_until(pilot, lambda: tree.cursor_node is not None, "the cursor on the first failure")
        await cursor_to(pilot, tree, "first")
        chosen = tree.show([second])  # `first` resolved; no await: the render that moves the cursor has not run
        assert chosen is not None and chosen.failures == (second,)
        assert screen._current() == chosen
        await wait_until(pilot, lambda: tree.cursor_node is not None and tree.cursor_node.data == chosen,
                         "the cursor on the chosen failure")
        assert screen._current() == chosen


# -- codegen failures -------------------------------------------------------------------------

GROUPED_CONV = "cudnn_convolution_op_float|i+1_8_8_8|w+8_1_3_3|o+1_8_8_8|ws+1_1|wd+1_1|p+1_1|g+8"
CONV = "cudnn_convolution_op_float|i+1_8_8_8|w+8_8_3_3|o+1_8_8_8|ws+1_1|wd+1_1|p+1_1"


def record_codegen_failures(db_path: Path, ops: Path, lines: list[str]) -> None:
    from core.codegen.batch import generate_all, load_configs
    from core.opconfigs.ort_prepass import PrePass

    ops.write_text("\n".join(lines) + "\n", encoding="utf-8")
    configs, errors = load_configs([ops], prepass=PrePass.not_checked("op-config files only"))
    assert not errors
    state = StateDB()
    try:
        generate_all(configs, "sm_90", state=state, db_path=db_path)
    finally:
        state.close()


def decompose_the_copy(mod, threads: int = 128, *, bind: bool = True):  # type: ignore[no-untyped-def]
    """A schedule bug planted for the test: TVM refuses it with a ScheduleError."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    out = sch.get_sblock("output0")
    sch.decompose_reduction(out, sch.get_loops(out)[0])
    return sch.mod


@pytest.mark.tvm
async def test_a_codegen_failure_shows_the_failing_schedule_and_what_tvm_said(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("tvm")
    import core.codegen.schedule as schedule

    db = build_small_db(tmp_path / "k.db")  # with the demo's barrier failure: codegen is listed first
    with monkeypatch.context() as patch:
        patch.setattr(schedule, "default_schedule", decompose_the_copy)
        record_codegen_failures(db, tmp_path / "ops.txt", ["elementwise_relu_op_float|i+64|o+64", CONV])
    failure = next(f for f in open_failures(db) if f.stage == "codegen" and f.item_index == 2)
    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        tree = await open_view(pilot, app, 3)
        assert [str(stage.label).split()[0] for stage in tree.root.children] == ["codegen", "barriers"]
        assert str(leaves(tree)[1].label).startswith("ops.txt:2 Convolution")  # the op config's file and line
        await cursor_to(pilot, tree, failure.name)
        summary = shown_text(app.screen.query_one("#failure-summary"))
        assert CONV in summary and "codegen, at schedule" in summary and 'The block "output0"' in summary
        assert "TVMScript of the failing schedule" in shown_text(app.screen.query_one("#failure-place-title"))
        marked = [line for line in shown_text(app.screen.query_one("#failure-listing")).splitlines() if "❱" in line]
        assert marked and 'T.sblock("output0")' in marked[0]
        log = shown_text(app.screen.query_one("#failure-log"))
        assert log.startswith("TVM says:") and "violates condition #1" in log and "T.sblock" not in log


@pytest.mark.tvm
@needs_nvcc
async def test_edit_the_op_config_then_retry_generates_and_injects_it(tmp_path: Path):
    pytest.importorskip("tvm")
    db = build_small_db(tmp_path / "k.db", with_failure=False)
    record_codegen_failures(db, tmp_path / "ops.txt", [GROUPED_CONV])
    [failure] = open_failures(db)
    app = make_app(db)
    async with app.run_test(size=(160, 45)) as pilot:
        tree = await open_view(pilot, app, 1)
        await cursor_to(pilot, tree, failure.name)
        assert "the op config" in shown_text(app.screen.query_one("#failure-place-title"))  # no module: no script
        await pilot.press("e")
        await wait_until(pilot, lambda: bool(app.screen.query("#editor")), "the editor")
        editor = app.screen.query_one("#editor", TextArea)
        fixed = json.loads(editor.text)
        assert fixed["groups"] == 8
        del fixed["groups"]
        fixed["filter_shape"] = [8, 8, 3, 3]
        editor.load_text(json.dumps(fixed, indent=2))
        await press_and_wait_retry(pilot, app, "ctrl+s")
        assert open_failures(db) == []
    assert kernel_count(db) == 11 and row_from(db, "ops.txt#1")
