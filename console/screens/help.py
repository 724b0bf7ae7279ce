"""The help screen: what each view is for and the keys that drive it."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# kdb console

Fill and inspect NNFusion's kernel DB. Every view works with the keyboard alone (and the mouse).

| key | anywhere |
| --- | --- |
| `1` … `8` | Kernels · Inject · Failures · GPU & SM settings · Op configs · AutoTVM logs · Tuning · Network |
| `ctrl+p` | command palette: every action, searchable |
| `ctrl+t` | light / dark theme |
| `?` `f1` | this help · `q` quit |

**Kernels**: the rows of the DB, paged from a browse index kept beside your state (a million rows stay
instant; it is built in the background the first time, and follows every write). Type to filter by
identifier, kernel name or Key (any case); pick op type, source, tag, device or lint status; click a header
to sort. `r` reloads, `R` rebuilds the index (after another tool edited rows in place). `n`/`p` next/previous page,
`space` marks rows, `d` deletes, `e` exports the marked rows (or the current one) as kernel JSON, `c` copies
the identifier, `b` the CUDA body. `v` verifies the marked rows (or the current one) on the GPU against a
reference; `P` also times them and stores the profile. `S` runs the ops of the marked rows standalone (never fused
by BlockFusion) or gives standalone ones back; `F` repairs, `K` keeps each op's fastest row: each shows what it
would change first (S, F and K: the same plans as `kdb db standalone|repair|fastest`); `u` undoes the last one
(its undo file stays in the state dir: `kdb db undo FILE --apply` after you quit). `N` compiles a model with
NNFusion.

**Inject**: pick files or directories in the tree (`space` adds, `enter` opens), set the SM archs and
options, `ctrl+r` runs the pipeline with a progress bar per stage; `escape` cancels between kernels.
`/` types a path (`enter` adds it); `escape` leaves the path box.

**Failures**: every conversion that failed, grouped by stage and reason: op configs TVM could not generate
(stage codegen) and kernels injection refused. The detail shows the cause and the offending place (the
schedule TVM refused, with TVM's lines; the nvcc error line; the JSON field). `r` retries the selected one
(an op config is generated again, then injected), `R` all of them (for instance after changing the SM
arch), `e` edits the item or op config and retries, `x` dismisses.

**GPU & SM**: the CUDA devices found here, target SM archs, the product name written into profiles (it
must equal NNFusion's `-fproduct_name`), nvcc and timeouts. Saved to the same TOML file the CLI reads.

**Op configs**: the ops to build kernels for (not saved: `x` exports the list as lines, `.toml` or `.json`).
`a` adds one from a template and `e`/`enter` edits it, checked as you type (an invalid line is never
added); `d` deletes, `D` clears. `i` imports an op-config file or an ONNX model (nodes with no kernel-DB
op are listed with the reason). `c` checks the list against the open DB: in DB, missing (tune it) or
falls back; from then on the check follows every change. `g` generates a kernel for each with TVM and
injects them, with progress; `escape` cancels, `f` shows the failures (codegen and injection). `n` compiles
the imported model with NNFusion and shows what each step of the generated code runs; when a BlockFusion
kernel cannot launch, `f` there runs the rows fused into it standalone (never fused) and compiles again.
There `r` runs the network on the GPU against the empty DB, `t` times each op with its row and with the library,
`n` keeps only the rows that make the network faster, and `g` makes `r` and `n` time it in a CUDA graph.

**AutoTVM logs**: `o` opens a tuning log. Each workload: its trials, successes, errors by kind and best
time; the selected one's best-so-far curve (`l` switches log/linear scale) and best knob config. Lines
that could not be read are listed with their line numbers.

**Tuning**: tune the ops with MetaSchedule. The list is the Op configs view's (`o` takes it again), or `i`
imports an op-config file or an ONNX model. A model is tuned as one network: only the ops NNFusion looks up
in the kernel DB (convolutions, pools, Dot; it fuses element-wise ops into its own kernels), with
trials per op × ops in all, spread by each op's share of the network's time, and the network time the best
kernels so far predict (against cuDNN's where that was measured). Set the trials per op, the target (cuda;
llvm tunes on this CPU) and the SM arch; `ctrl+r` starts. Each op's row shows how often it occurs, its
status (where its batch is: search, build, measure), trials, best time, speed (GFLOP/s; GB/s for pools)
and errors live, each trial as it is measured; below, the selected op's best-so-far curve (`l`:
log/linear) and the run's log. `escape` cancels after the trial in flight and keeps every trial measured:
`ctrl+r` again resumes from them. With cuda, the best kernels are
verified, timed (when there is a GPU) and injected. The RPC tracker set in GPU & SM is shown with its
servers and queue (refreshed every few seconds); its servers measure the trials when it is set.

**Network**: one ONNX model's story with this DB. `o` opens a model (or pick a recent one): what each op runs
(coverage, as `kdb coverage` says it) and every step taken with it, newest first, from the console or a terminal:
compiles (used == promised), runs against the empty DB, op times, never-slower steps. `c` opens the compile dialog
(`r` runs the network, `t` times each op against the library, `n` keeps only the rows that make the network
faster), `h` converts the model to fp16 and opens that one, `g` lists its op configs in the Op configs view
(where `g` generates and injects their rows), `t` takes it to the Tuning view as one network (`ctrl+r` starts),
`k` opens the selected op's row in the Kernels view.
Each op's row against the library (the newest op times) is shown with a bar, the slowest first, and what the
best tuned kernels so far predict for the network (the Tuning view's figure). Without a GPU it says what only a
GPU can show.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark,f1", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog dialog-wide"):
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)
