"""GPU & SM settings: the CUDA devices found here, and the settings the console and the CLI share.

The form edits text; core's `read_settings` turns it into a Settings plus an error per bad field, as for the
engine's own validation, so the view can never save what `kdb settings` would refuse. Device
detection, the nvcc probe and the save itself run in thread workers that post messages back.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Button, DataTable, Footer, Header, Input, Label, Static

from console.screens.base import KdbScreen
from core.cuda.nvcc import NvccProbe, probe_nvcc
from core.gpu.inventory import DeviceInfo, detect_devices
from core.settings import Settings, load_settings, read_settings, save_settings, setting_problem, settings_path

NO_DEVICE = "no CUDA device: compile checks only"


@dataclass(frozen=True)
class FormField:
    name: str  # the Settings attribute it edits
    label: str
    help: str


FORM: tuple[FormField, ...] = (
    FormField("archs", "Target SM archs", "comma separated; the first is the primary one"),
    FormField("product_name", "Product name",
              "written into profile strings: must equal the -fproduct_name given to NNFusion"),
    FormField("nvcc_path", "nvcc path", "empty: nvcc on PATH, else /usr/local/cuda/bin/nvcc"),
    FormField("nvcc_flags", "nvcc flags", "extra flags for every compile check, space separated (quotes work)"),
    FormField("nvcc_timeout_s", "nvcc timeout (s)", "seconds per nvcc compile check"),
    FormField("gpu_timeout_s", "GPU job timeout (s)", "seconds per GPU job (verify or time one kernel)"),
    FormField("workers", "Workers", "parallel injection workers; 0 = one per core"),
    FormField("tune_trials", "Tuning trials", "MetaSchedule trials per operator"),
    FormField("tune_builder_timeout_s", "Builder timeout (s)",
              "seconds per TVM build (MetaSchedule's default 30 s kills big nvcc builds)"),
    FormField("rpc_tracker", "RPC tracker", "HOST:PORT of a TVM RPC tracker for remote measurement; empty = local"),
    FormField("rpc_key", "RPC key", "the device key registered with the tracker"),
)
HELP = {f.name: f.help for f in FORM}


# -- form text <-> Settings (pure, so the worker and the UI share it) ---------------------------------

def form_values(settings: Settings) -> dict[str, str]:
    def text(value: object) -> str:
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    values = {f.name: text(getattr(settings, f.name)) for f in FORM}
    values["archs"] = ", ".join(settings.archs)
    values["nvcc_flags"] = shlex.join(settings.nvcc_flags)
    return values


def copy_settings(source: Settings, target: Settings) -> None:
    """Update the shared Settings in place, so every view holding it sees the change."""
    for f in fields(Settings):
        setattr(target, f.name, getattr(source, f.name))


# -- the screen --------------------------------------------------------------------------------------

class SettingsScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+z", "revert", "Revert"),
        Binding("ctrl+g", "use_detected", "Use detected GPU"),
        Binding("ctrl+r", "detect", "Detect again"),
    ]

    @dataclass
    class DevicesDetected(Message):
        devices: list[DeviceInfo]
        reason: str

    @dataclass
    class NvccProbed(Message):
        info: NvccProbe

    @dataclass
    class SaveChecked(Message):
        info: NvccProbe
        errors: dict[str, str]
        settings: Settings | None
        path: Path | None

    @dataclass
    class SettingsLoaded(Message):
        settings: Settings

    def __init__(self) -> None:
        super().__init__()
        self.devices: list[DeviceInfo] = []
        self.nvcc: NvccProbe | None = None  # the probe of the nvcc path now in the form, once known
        self.probed_path: str | None = None  # the nvcc path text last sent to the probe
        self.probe_timer: Timer | None = None

    @property
    def settings(self) -> Settings:
        return self.app.context.settings  # type: ignore[attr-defined]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label("CUDA devices", classes="settings-section")
        with Horizontal(id="settings-devices"):
            with Vertical(id="settings-device-info"):
                yield DataTable(id="device-table", cursor_type="row")
                yield Static("detecting CUDA devices…", id="no-device", markup=False)
            yield Button("Use detected arch & name", id="use-detected", variant="primary", disabled=True)
            yield Button("Detect again", id="detect")
        yield Label("Settings (shared with the kdb CLI)", classes="settings-section")
        with VerticalScroll(id="settings-form"):
            for f in FORM:
                with Horizontal(classes="settings-row"):
                    yield Label(f.label, classes="settings-label")
                    yield Input(id=f"field-{f.name}")
                    with Vertical(classes="settings-notes"):
                        yield Static(f.help, id=f"help-{f.name}", classes="settings-help", markup=False)
                        yield Static(id=f"error-{f.name}", classes="settings-error", markup=False)
        with Horizontal(id="settings-actions"):
            yield Button("Save (ctrl+s)", id="save", variant="success")
            yield Button("Revert (ctrl+z)", id="revert")
            yield Static(id="settings-status", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one("#device-table", DataTable)
        table.add_columns("#", "name", "compute capability", "SMs", "shared / block", "registers / block",
                          "clock", "memory")
        self._fill(self.settings)
        self.action_detect()

    # -- devices ------------------------------------------------------------------------------

    def action_detect(self) -> None:
        self.query_one("#no-device", Static).update("detecting CUDA devices…")
        self.detect(self.settings.gpu_timeout_s)

    @work(thread=True, exit_on_error=False, group="devices", exclusive=True)
    def detect(self, timeout_s: float) -> None:
        devices, reason = detect_devices(timeout_s)
        self.post_message(self.DevicesDetected(devices, reason))

    def on_settings_screen_devices_detected(self, message: DevicesDetected) -> None:
        self.devices = message.devices
        table = self.query_one("#device-table", DataTable)
        table.clear()
        for d in message.devices:
            cc = f"{d.compute_capability[0]}.{d.compute_capability[1]} ({d.arch})"
            shared = f"{d.shared_per_block // 1024} KiB"
            if d.shared_per_block_optin > d.shared_per_block:
                shared += f" (opt-in {d.shared_per_block_optin // 1024} KiB)"
            table.add_row(str(d.index), d.name, cc, str(d.sm_count), shared, f"{d.registers_per_block:,}",
                          f"{d.clock_khz / 1e6:.2f} GHz", f"{d.memory_bytes / 2**30:.1f} GiB", key=str(d.index))
        table.display = bool(message.devices)
        no_device = self.query_one("#no-device", Static)
        no_device.display = not message.devices
        no_device.update(Content.assemble((NO_DEVICE, "bold"), "\n", message.reason))
        self.query_one("#use-detected", Button).disabled = not message.devices
        name_input = self.query_one("#field-product_name", Input)
        name_input.placeholder = message.devices[0].name if message.devices else "(detected device name)"

    @on(Button.Pressed, "#use-detected")
    def action_use_detected(self) -> None:
        if not self.devices:
            self.notify(NO_DEVICE, timeout=3)
            return
        row = self.query_one("#device-table", DataTable).cursor_row
        device = self.devices[row if 0 <= row < len(self.devices) else 0]
        self.query_one("#field-archs", Input).value = device.arch
        self.query_one("#field-product_name", Input).value = device.name
        self.notify(f"targets set to {device.arch} and {device.name!r}: ctrl+s saves", timeout=4)

    @on(Button.Pressed, "#detect")
    def detect_pressed(self) -> None:
        self.action_detect()

    # -- nvcc ---------------------------------------------------------------------------------

    def _probe(self, configured: str) -> None:
        if configured != self.probed_path:
            self.probed_path, self.nvcc = configured, None
            self.probe(configured)

    @work(thread=True, exit_on_error=False, group="nvcc", exclusive=True)
    def probe(self, configured: str) -> None:
        self.post_message(self.NvccProbed(probe_nvcc(configured)))

    def on_settings_screen_nvcc_probed(self, message: NvccProbed) -> None:
        self._apply_probe(message.info)

    def _apply_probe(self, info: NvccProbe) -> None:
        if info.configured != self._values()["nvcc_path"]:
            return  # the path changed meanwhile; a newer probe is on its way
        self.nvcc = info
        if info.nvcc:
            nvcc_note, archs_note = f"using {info.nvcc}", f"this nvcc builds {' '.join(info.archs)}"
        else:
            nvcc_note, archs_note = info.problem, "nvcc not found: archs are checked by name only"
        self.query_one("#help-nvcc_path", Static).update(f"{HELP['nvcc_path']} · {nvcc_note}")
        self.query_one("#help-archs", Static).update(f"{HELP['archs']} · {archs_note}")
        for name in ("archs", "nvcc_path"):
            self._show_error(name, setting_problem(name, self._values()[name], info))

    # -- the form -----------------------------------------------------------------------------

    def _values(self) -> dict[str, str]:
        return {f.name: self.query_one(f"#field-{f.name}", Input).value for f in FORM}

    def _fill(self, settings: Settings) -> None:
        values = form_values(settings)
        for name, text in values.items():
            self.query_one(f"#field-{name}", Input).value = text
        self._probe(values["nvcc_path"])
        self._update_status()

    def _show_error(self, name: str, error: str) -> None:
        self.query_one(f"#error-{name}", Static).update(f"✗ {error}" if error else "")
        self.query_one(f"#field-{name}", Input).set_class(bool(error), "invalid")

    @on(Input.Changed)
    def field_changed(self, event: Input.Changed) -> None:
        name = (event.input.id or "").removeprefix("field-")
        if name not in HELP:
            return
        if name == "nvcc_path" and event.value != self.probed_path:
            # Debounce: probe nvcc once the typing stops, not on every key.
            self.nvcc = None
            if self.probe_timer is not None:
                self.probe_timer.stop()
            self.probe_timer = self.set_timer(0.3, lambda: self._probe(self._values()["nvcc_path"]))
        self._show_error(name, setting_problem(name, event.value, self.nvcc))
        self._update_status()

    def _update_status(self) -> None:
        # Compare what the text means, not the text: "sm_80,sm_90" is saved as "sm_80, sm_90".
        form, errors = read_settings(self._values(), None, self.settings)
        dirty = bool(errors) or form != self.settings
        path = settings_path()
        if dirty:
            text = f"{path} · unsaved changes"
        else:
            text = f"{path} · saved" if path.exists() else f"defaults · ctrl+s writes {path}"
        self.query_one("#settings-status", Static).update(text)

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        self.check_and_save(self._values(), replace(self.settings))

    @work(thread=True, exit_on_error=False, group="settings-save", exclusive=True)
    def check_and_save(self, values: dict[str, str], base: Settings) -> None:
        info = probe_nvcc(values["nvcc_path"])
        settings, errors = read_settings(values, info, base)
        path = None if errors else save_settings(settings)
        self.post_message(self.SaveChecked(info, errors, None if errors else settings, path))

    def on_settings_screen_save_checked(self, message: SaveChecked) -> None:
        self._apply_probe(message.info)
        for f in FORM:
            self._show_error(f.name, message.errors.get(f.name, ""))
        if message.settings is None:
            first = next(f.name for f in FORM if f.name in message.errors)
            self.query_one(f"#field-{first}", Input).focus()
            self.notify(f"not saved: {len(message.errors)} field(s) need fixing", severity="warning", timeout=4)
            return
        copy_settings(message.settings, self.settings)
        self._update_status()
        self.notify(f"saved {message.path}", timeout=4)

    @on(Button.Pressed, "#revert")
    def action_revert(self) -> None:
        self.load_from_disk()

    @work(thread=True, exit_on_error=False, group="settings-load", exclusive=True)
    def load_from_disk(self) -> None:
        self.post_message(self.SettingsLoaded(load_settings()))

    def on_settings_screen_settings_loaded(self, message: SettingsLoaded) -> None:
        copy_settings(message.settings, self.settings)
        self._fill(self.settings)
        self.notify(f"reverted to {settings_path()}", timeout=3)
