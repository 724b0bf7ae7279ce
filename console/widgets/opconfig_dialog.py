"""Add or edit one op config as a line of the artifact's format, checked as you type.

The dialog answers only with a valid op config (or None when cancelled): an invalid line keeps the
dialog open with the reason under the field, so nothing invalid ever reaches the list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from core.errors import InputError
from core.opconfigs.opconfig import OpConfig, parse_line

TEMPLATES: dict[str, str] = {
    "Convolution": "cudnn_convolution_op_float|i+1_64_56_56|w+64_64_3_3|o+1_64_56_56|ws+1_1|wd+1_1|p+1_1",
    "Convolution + Relu":
        "cudnn_convolution_op_float|i+1_64_56_56|w+64_64_3_3|o+1_64_56_56|ws+1_1|wd+1_1|p+1_1|fuse+relu",
    "Convolution + Add + Relu":
        "cudnn_convolution_op_float|i+1_64_56_56|w+64_64_3_3|o+1_64_56_56|ws+1_1|wd+1_1|p+1_1|fuse+add_relu",
    "Depthwise convolution":
        "cudnn_depthwise_conv2d_op_float|i+1_144_56_56|w+3_3_144_1|o+1_144_28_28|ws+2_2|wd+1_1|p+1_1",
    "Dot": "cublas_dot_op_float|a+1_512|b+512_1000|o+1_1000|ta+0|tb+0",
    "BatchMatMul": "cublas_batch_matmul_op_float|a+1_12_128_64|b+1_12_64_128|o+1_12_128_128",
    "Softmax": "cudnn_softmax_op_float|i+1_12_128_128|o+1_12_128_128",
    "Sum": "cudnn_reduce_sum_op_float|i+1_128_768|o+1_128",
    "Concat": "concat_op_float|i+1_8_16|i+1_8_8|o+1_8_24",
    "Resize": "resize_op_float|i+1_256_28_28|o+1_256_56_56|mode+linear|ctm+align_corners|nm+floor",
    "ConvTranspose": "cudnn_conv_transpose_op_float|i+1_256_28_28|w+256_128_2_2|o+1_128_56_56|ws+2_2|wd+1_1|p+0_0",
    "MaxPool": "cudnn_maxpool_op_float|i+1_64_112_112|o+1_64_56_56|win+3_3|ws+2_2|pb+1_1|pa+1_1",
    "AvgPool": "cudnn_avgpool_op_float|i+1_512_7_7|o+1_512_1_1|win+7_7|ws+7_7|pb+0_0|pa+0_0",
    "Relu": "elementwise_relu_op_float|i+1_64_56_56|o+1_64_56_56",
    "Add": "elementwise_add_op_float|i+1_64_56_56|i+1_64_56_56|o+1_64_56_56",
}
DEFAULT_TEMPLATE = TEMPLATES["Convolution"]

FIELDS_HINT = ("convolution i+ w+ o+ ws+ wd+ p+ [pa+ g+ fuse+relu|add_relu] · depthwise the same, w+ as kh_kw_C_1 · "
               "dot a+ b+ o+ ta+ tb+ · batch matmul a+ b+ o+ · pools i+ o+ win+ ws+ pb+ pa+ · softmax (last axis) and "
               "sum i+ o+ · concat and element-wise one i+ per input, o+ · resize i+ o+ mode+ ctm+ nm+ · conv "
               "transpose as a convolution, w+ as Cin_Cout_k_k · shapes as 1_64_56_56")


def check_line(line: str, taken: Mapping[str, int]) -> tuple[OpConfig | None, str]:
    """The op config of a line and "" when it is fine to add; else None and the reason."""
    line = line.strip()
    if not line:
        return None, "type an op config line, or pick a template"
    try:
        config = parse_line(line)
    except InputError as exc:
        return None, exc.reason
    if config.key in taken:
        return None, f"already in the list as row {taken[config.key]}"
    return config, ""


class OpConfigDialog(ModalScreen[OpConfig | None]):
    """One line in, a valid OpConfig out; `taken` maps the keys already listed to their row numbers."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel"),
                                             Binding("ctrl+s", "save", "Save")]

    def __init__(self, title: str, line: str = DEFAULT_TEMPLATE, *, taken: Mapping[str, int] | None = None,
                 save_label: str = "Add") -> None:
        super().__init__()
        self.title_text, self.line, self.save_label = title, line, save_label
        self.taken: Mapping[str, int] = taken or {}

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog opconfig-dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Select([(name, line) for name, line in TEMPLATES.items()], prompt="start from a template…",
                         id="template")
            yield Input(self.line, id="line", placeholder="cudnn_convolution_op_float|i+…")
            yield Static(id="line-check")
            yield Static(FIELDS_HINT, classes="dialog-detail", id="fields-hint")
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self.save_label} (enter)", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self._check()
        self.query_one("#line", Input).focus()

    def _check(self) -> OpConfig | None:
        config, error = check_line(self.query_one("#line", Input).value, self.taken)
        verdict = self.query_one("#line-check", Static)
        if config is None:
            verdict.update(f"[$error]✗ {escape(error)}[/]")
        else:
            verdict.update(f"[$success]✓[/] {escape(config.describe())} · {config.flops / 1e9:.3f} GFLOP")
        verdict.set_class(config is None, "bad")
        self.query_one("#line", Input).set_class(config is None, "bad")
        return config

    @on(Input.Changed, "#line")
    def line_changed(self) -> None:
        self._check()

    @on(Select.Changed, "#template")
    def template_chosen(self, event: Select.Changed) -> None:
        if isinstance(event.value, str):
            field = self.query_one("#line", Input)
            field.value = event.value
            field.focus()

    @on(Input.Submitted, "#line")
    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        config = self._check()
        if config is None:
            self.app.bell()  # the reason is already under the field; the text stays as typed
            self.query_one("#line", Input).focus()
            return
        self.dismiss(config)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
