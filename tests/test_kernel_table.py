"""The kernel table's cursor across reloads: it stays on its row, and comes back to a row a reload left out."""

from __future__ import annotations

from textual.app import App, ComposeResult

from console.widgets.kernel_table import KernelTable
from core.db.browse import KernelSummary


def summary(key: str) -> KernelSummary:
    return KernelSummary(key=key, identifier=f"Relu1,{len(key)};1,{len(key)}floatfloat", op_type="Relu",
                         source="kdb", device_type="CUDA_GPU", tags="KernelEmitter,BlockCudaEmitter", grid=[1],
                         block=[32], barriers=0, shared_bytes=0)


def page(*keys: str) -> list[KernelSummary]:
    return [summary(k) for k in keys]


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield KernelTable()


async def test_the_cursor_follows_its_row_to_a_new_place_in_the_page():
    async with TableApp().run_test() as pilot:
        table = pilot.app.query_one(KernelTable)
        table.show(page("a", "b", "c"), set())
        table.move_cursor(row=1)
        table.show(page("b", "a", "c"), set())
        assert table.current_key() == "b"


async def test_a_row_a_reload_left_out_gets_the_cursor_back_when_a_later_page_holds_it():
    """An edit rewrites a row at a new rowid; a reload can run before the browse index has it (the page then
    lacks it), and the next holds it again: the cursor must return to it, not stay on the row it fell back to."""
    async with TableApp().run_test() as pilot:
        table = pilot.app.query_one(KernelTable)
        table.show(page("a", "b", "c"), set())
        table.move_cursor(row=1)
        table.show(page("a", "c"), set())
        assert table.current_key() == "c"  # the same place, another row
        table.show(page("a", "c", "d"), set())  # still without it
        assert table.current_key() == "c"
        table.show(page("a", "c", "b"), set())
        assert table.current_key() == "b"


async def test_a_move_of_the_user_after_the_fallback_is_kept():
    async with TableApp().run_test() as pilot:
        table = pilot.app.query_one(KernelTable)
        table.show(page("a", "b", "c"), set())
        table.move_cursor(row=1)
        table.show(page("a", "c"), set())
        table.move_cursor(row=0)  # the user goes to "a"
        table.show(page("a", "b", "c"), set())
        assert table.current_key() == "a"
