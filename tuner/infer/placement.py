"""Where a ``device_map="auto"`` model went, and what it will need while generating.

The budget (``max_memory``) is derived from the recipe's hardware; the report is a plain
data object built from the loaded model's ``hf_device_map`` so the CLI prints it as a table
and the TUI can show the same numbers.  Layer counts and KV heads are the planner's model facts
(:mod:`tuner.catalog.models`).  Nothing here imports torch at module level.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tuner.planner.items import GIB

DISK = "disk"
CPU = "cpu"


def kv_cache_bytes(facts, batch: int, context: int, bytes_per_value: int, layers: int | None = None) -> int:
    """Keys and values of every token: 2 · layers · kv_heads · head_dim · bytes · batch · context.

    ``facts`` is the planner's :class:`~tuner.catalog.facts.ModelFacts` (num_layers, num_kv_heads, head_dim);
    ``layers`` counts only some of the layers (those computing on one device).
    """
    layers = facts.num_layers if layers is None else layers
    return 2 * layers * facts.num_kv_heads * facts.head_dim * bytes_per_value * batch * context


def max_memory_map(gpu_memory_gib: list[float], headroom_gib: float, cpu_gib: float) -> dict[int | str, int]:
    """Accelerate's ``max_memory`` in bytes: each GPU less its headroom, then CPU RAM; the rest goes to disk."""
    budget: dict[int | str, int] = {
        index: max(int((total - headroom_gib) * GIB), 0) for index, total in enumerate(gpu_memory_gib)
    }
    budget[CPU] = max(int(cpu_gib * GIB), 0)
    return budget


def hardware_memory_map(recipe, use_recipe_hardware: bool = True) -> tuple[dict[int | str, int], list[str]]:
    """``max_memory`` for this machine as the recipe describes it, and notes on what was assumed.

    GPUs: ``hardware.gpus_per_machine`` of the visible ones (all visible ones for an ad hoc model), each
    sized from ``hardware.gpu_memory_gb`` / the catalog entry of ``hardware.gpu`` (never more than the card
    really has) less ``inference.gpu_headroom_gb``. CPU: ``hardware.host_ram_gb`` or the RAM available now.
    """
    import psutil
    import torch

    from tuner.catalog.gpus import lookup_gpu

    hardware, notes = recipe.hardware, []
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    wanted = hardware.gpus_per_machine if use_recipe_hardware else visible
    if wanted > visible:
        notes.append(f"hardware.gpus_per_machine is {wanted} but {visible} GPU(s) are visible; using {visible}.")
    elif use_recipe_hardware and visible > wanted:
        notes.append(f"{visible} GPU(s) visible, the recipe uses {wanted} (hardware.gpus_per_machine).")
    count = min(wanted, visible)
    sizes = []
    for index in range(count):
        real = torch.cuda.get_device_properties(index).total_memory / GIB
        stated = hardware.gpu_memory_gb
        if stated is None and hardware.gpu and use_recipe_hardware:
            try:
                stated = lookup_gpu(hardware.gpu).memory_gib
            except KeyError:
                stated = None
        if stated is not None and stated > real + 0.5:
            notes.append(f"GPU {index} has {real:.1f} GiB, less than the recipe's {stated:.1f} GiB; using {real:.1f}.")
        sizes.append(min(stated, real) if stated is not None else real)
    if hardware.host_ram_gb is not None and use_recipe_hardware:
        cpu_gib = hardware.host_ram_gb
    else:
        cpu_gib = psutil.virtual_memory().available / GIB
        notes.append(f"CPU budget: {cpu_gib:.1f} GiB of RAM available now (set hardware.host_ram_gb to fix it).")
    return max_memory_map(sizes, recipe.inference.gpu_headroom_gb, cpu_gib), notes


@dataclass(frozen=True)
class DevicePlacement:
    """One row of the placement table: a GPU index, ``cpu`` or ``disk``."""

    device: int | str
    layers: int
    weights_bytes: int
    kv_cache_bytes: int
    budget_bytes: int | None

    @property
    def label(self) -> str:
        if isinstance(self.device, int):
            return f"GPU {self.device}"
        return "CPU" if self.device == CPU else self.device

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes


@dataclass(frozen=True)
class Placement:
    """Every device the model touches, with the predicted memory for weights plus KV cache."""

    devices: tuple[DevicePlacement, ...]
    batch: int
    context: int
    total_layers: int
    headroom_bytes: int = 0
    facts_from: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def weights_bytes(self) -> int:
        return sum(row.weights_bytes for row in self.devices)

    @property
    def kv_cache_bytes(self) -> int:
        return sum(row.kv_cache_bytes for row in self.devices)

    def row(self, device: int | str) -> DevicePlacement | None:
        return next((row for row in self.devices if row.device == device), None)

    def warnings(self) -> list[str]:
        """What will make generation slow or fail, with what to change."""
        found = []
        disk = self.row(DISK)
        if disk and disk.weights_bytes:
            found.append(
                f"{disk.layers} layer(s) ({format_bytes(disk.weights_bytes)}) are offloaded to disk: every generated "
                "token reads them back from disk, so generation will be slow. Give more CPU RAM "
                "(hardware.host_ram_gb), quantise with --bits 4, or add GPUs.")
        cpu = self.row(CPU)
        gpus = [row for row in self.devices if isinstance(row.device, int)]
        if cpu and gpus and cpu.weights_bytes:
            found.append(
                f"{cpu.layers} layer(s) ({format_bytes(cpu.weights_bytes)}) sit in CPU RAM and are copied to GPU "
                f"{gpus[0].device} for every forward pass; expect slower generation than all-GPU placement.")
        for row in gpus:
            if row.budget_bytes is not None and row.total_bytes > row.budget_bytes + self.headroom_bytes:
                found.append(
                    f"{row.label}: weights + KV cache ({format_bytes(row.total_bytes)}) exceed the GPU's "
                    f"{format_bytes(row.budget_bytes + self.headroom_bytes)}; lower --batch-size or --context, "
                    "or raise inference.gpu_headroom_gb so fewer layers are placed there.")
        return found


def format_bytes(count: int) -> str:
    """GiB for model-sized numbers, MiB for small ones (the demo model is a few MiB)."""
    if count >= GIB // 10:
        return f"{count / GIB:.2f} GiB"
    return f"{count / 1024**2:.1f} MiB"


def _device_key(device) -> int | str:
    """Normalise ``0`` / ``"cuda:0"`` / ``"cpu"`` / ``"disk"`` to an int GPU index or a name."""
    if isinstance(device, int):
        return device
    text = str(device)
    if text.startswith("cuda"):
        return int(text.partition(":")[2] or 0)
    return text


def _device_of(name: str, device_map: dict[str, int | str]) -> int | str:
    """The device of a parameter or module: the longest ``device_map`` key that prefixes its name."""
    best, best_len = None, -1
    for key, device in device_map.items():
        if (key == "" or name == key or name.startswith(key + ".")) and len(key) > best_len:
            best, best_len = device, len(key)
    if best is None:
        raise KeyError(f"{name} is not in the device map")
    return _device_key(best)


def _order(device: int | str) -> tuple[int, int]:
    return (0, device) if isinstance(device, int) else (1, 0) if device == CPU else (2, 0)


def summarise_placement(device_map: dict[str, int | str], tensor_bytes: dict[str, int], layer_names: list[str],
                        facts, bytes_per_value: int, batch: int, context: int,
                        max_memory: dict[int | str, int] | None = None, headroom_bytes: int = 0,
                        notes: tuple[str, ...] = ()) -> Placement:
    """Pure: layers and bytes per device from a device map; KV cache where each layer computes.

    Layers on CPU or disk run on the main device (the first GPU, else the CPU), so their KV cache lives there.
    """
    weights: dict[int | str, int] = {}
    for name, size in tensor_bytes.items():
        device = _device_of(name, device_map)
        weights[device] = weights.get(device, 0) + size
    layers: dict[int | str, int] = {}
    for name in layer_names:
        device = _device_of(name, device_map)
        layers[device] = layers.get(device, 0) + 1
    gpus = sorted(device for device in set(weights) | set(layers) if isinstance(device, int))
    main = gpus[0] if gpus else CPU
    kv_layers: dict[int | str, int] = {}
    for device, count in layers.items():
        runs_on = device if isinstance(device, int) else main
        kv_layers[runs_on] = kv_layers.get(runs_on, 0) + count
    rows = []
    for device in sorted(set(weights) | set(layers) | set(kv_layers), key=_order):
        kv = kv_cache_bytes(facts, batch, context, bytes_per_value, layers=kv_layers.get(device, 0))
        budget = None if max_memory is None or device == DISK else max_memory.get(device)
        rows.append(DevicePlacement(device, layers.get(device, 0), weights.get(device, 0), kv, budget))
    return Placement(tuple(rows), batch, context, len(layer_names), headroom_bytes, getattr(facts, "source", ""), notes)


def placement_of(model, batch: int, context: int, max_memory: dict[int | str, int] | None = None,
                 headroom_bytes: int = 0, notes: tuple[str, ...] = (), facts=None) -> Placement:
    """The placement report of a loaded (unwrapped) Hugging Face model.

    ``facts``: the planner's model facts for the model (tuner.catalog.models.model_facts); without them they
    are read from the loaded model's config through the same function.
    """
    from tuner.catalog.facts import facts_from_config

    device_map = getattr(model, "hf_device_map", None) or {"": _device_key(model.device)}
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    tensor_bytes = {name: tensor.numel() * tensor.element_size() for name, tensor in tensors.items()}
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layer_names = [name for name, module in model.named_modules() if type(module).__name__ in layer_classes]
    facts = facts or facts_from_config(model.config.to_dict(), model.name_or_path, "the model config")
    bytes_per_value = kv_bytes_per_value(model)
    return summarise_placement(device_map, tensor_bytes, layer_names, facts, bytes_per_value, batch, context,
                               max_memory, headroom_bytes, notes)


def kv_bytes_per_value(model) -> int:
    """The KV cache is kept in the compute dtype (the 4-bit compute dtype for quantised models)."""
    import torch

    quant = getattr(model.config, "quantization_config", None)
    compute = getattr(quant, "bnb_4bit_compute_dtype", None) if quant is not None else None
    dtype = compute if isinstance(compute, torch.dtype) else getattr(model, "dtype", torch.float32)
    return torch.empty((), dtype=dtype).element_size()


def placement_table(placement):
    """The placement as a rich table (one row per device, then the total); a split model's placement
    (:mod:`tuner.infer.rank_placement`) draws its own, one row per rank."""
    from rich.table import Table

    if not isinstance(placement, Placement):
        return placement.table()

    table = Table(title="Model placement", title_justify="left",
                  caption=f"KV cache at batch {placement.batch} × context {placement.context} tokens "
                          f"(model facts: {placement.facts_from})", caption_justify="left")
    for column in ("device", "layers", "weights", "KV cache", "weights + KV", "budget"):
        table.add_column(column, justify="left" if column == "device" else "right")
    for row in placement.devices:
        budget = "-" if row.budget_bytes is None else format_bytes(row.budget_bytes)
        table.add_row(row.label, str(row.layers), format_bytes(row.weights_bytes), format_bytes(row.kv_cache_bytes),
                      format_bytes(row.total_bytes), budget)
    table.add_section()
    table.add_row("total", str(placement.total_layers), format_bytes(placement.weights_bytes),
                  format_bytes(placement.kv_cache_bytes),
                  format_bytes(placement.weights_bytes + placement.kv_cache_bytes), "")
    return table
