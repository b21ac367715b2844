"""Hardware: this machine's GPUs prefilled (none here: the CPU), or any cluster typed in."""
from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Input, Label, Static

from tuner.catalog.gpus import known_gpu_names
from tuner.tui.detect import DetectedGpus, detect_gpus, machine_ram_gib
from tuner.tui.messages import FieldEdited
from tuner.tui.screens.base import WizardScreen
from tuner.tui.widgets.fields import InputField, SelectField


class HardwareScreen(WizardScreen):
    STEP = "hardware"

    def compose_body(self) -> ComposeResult:
        with Horizontal(classes="body"):
            with VerticalScroll(classes="form", can_focus=False):  # tab goes to the fields
                yield InputField("Machines", "hardware.machines", number=True)
                yield InputField("GPUs per machine", "hardware.gpus_per_machine", number=True,
                                 help="0 trains on the CPU")
                yield SelectField("GPU type", "hardware.gpu", known_gpu_names(), prompt="custom / none",
                                  help="From the catalog; or type a size such as 48GB in GPU memory")
                yield InputField("GPU memory (GiB)", "hardware.gpu_memory_gb", number=True,
                                 help="Overrides the catalog memory of the GPU type")
                yield InputField("Processes (CPU)", "hardware.num_processes", number=True,
                                 help="On the CPU: how many gloo processes; on GPUs it must be machines x GPUs")
                yield InputField("Host RAM (GiB)", "hardware.host_ram_gb", number=True,
                                 help="Per machine; checked against CPU offload")
                yield InputField("NVMe path", "hardware.nvme_path", placeholder="/local/nvme (ZeRO-Infinity)")
                yield InputField("Main node address", "hardware.main_process_ip", placeholder="10.0.0.1 (multi-node)")
            with Vertical(classes="side", id="machine-side"):
                yield Label("This machine", classes="section-title")
                yield Static("looking for GPUs…" if self.app.detect_hardware else "detection off", id="detected")
                yield Button("Use this machine", id="use-detected", disabled=True)

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#hardware-machines-input").focus()
        if self.app.detect_hardware:
            self.detect()

    def sync(self) -> None:
        super().sync()
        on_gpus = self.app.draft.resolved.uses_gpu  # the label says what the count is of (GPUs set: one per GPU)
        label = "Processes (1 per GPU)" if on_gpus else "Processes (CPU)"
        processes = self.query_one("#hardware-num_processes .field-label", Label)
        if str(processes.render()) != label:
            processes.update(label)

    @work(thread=True, exclusive=True)
    def detect(self) -> None:
        found = detect_gpus()
        self.app.call_from_thread(self._show_detected, found, machine_ram_gib())

    def _changes(self, found: DetectedGpus | None, ram_gib: float) -> dict:
        """This machine as the recipe's hardware: its GPUs (none: the CPU) and its RAM, the box and the label alike."""
        return {**(found.recipe_changes() if found else {}), "hardware.host_ram_gb": ram_gib}

    def _show_detected(self, found: DetectedGpus | None, ram_gib: float) -> None:
        self.detected = self._changes(found, ram_gib)
        text = (f"{found.count} × {found.name}, {found.memory_gib:.1f} GiB each" if found
                else "no NVIDIA GPU found: training runs on the CPU")
        text += f"\nhost RAM: {ram_gib:g} GiB"
        self.query_one("#detected", Static).update(text)
        self.query_one("#use-detected", Button).disabled = False
        self.query_one("#hardware-host_ram_gb-input", Input).placeholder = f"not set (this machine: {ram_gib:g})"
        # a new recipe is prefilled with this machine's GPUs, never an opened one; its RAM stays the placeholder (a
        # recipe holds only what the user chose: "Use this machine" writes it)
        if found and "hardware" not in self.app.draft.data:
            self.post_message(FieldEdited(found.recipe_changes()))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "use-detected" and getattr(self, "detected", None):
            self.post_message(FieldEdited(self.detected))
