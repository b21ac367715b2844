"""The doctor's checks of optional libraries: bitsandbytes, CUDA extensions (flash-attn, Liger), vLLM, the kernels
this machine will use, experiment trackers and DeepSpeed's ops. Each is imported inside its check, quietly."""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import shutil

from tuner.check import Check, Status
from tuner.reason import library_words
from tuner.recipe.schema import Recipe


@contextlib.contextmanager
def _quiet():
    """Some libraries print banners while importing (DeepSpeed's accelerator guess, bitsandbytes' kernels
    notice); doctor's output is its lines only."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_bitsandbytes(recipe: Recipe | None) -> Check:
    needed = recipe is not None and recipe.uses_bitsandbytes
    missing: Status = "fail" if needed else "warn"
    try:
        with _quiet():
            import bitsandbytes
            from bitsandbytes import cextension
    except Exception as exc:  # a broken native library raises all sorts of errors at import
        return Check("bitsandbytes", missing, f"cannot import: {library_words(exc)}",
                     "pip install -U bitsandbytes (needed for qlora and 8-bit optimizers)")
    backend = getattr(cextension, "BNB_BACKEND", "unknown")
    if isinstance(getattr(cextension, "lib", None), getattr(cextension, "ErrorHandlerMockBNBNativeLibrary", ())):
        return Check("bitsandbytes", missing, f"{bitsandbytes.__version__}: the {backend} native library did not load",
                     "reinstall bitsandbytes for this torch/CUDA: pip install --force-reinstall bitsandbytes")
    if needed and recipe.uses_gpu and backend == "CPU":
        return Check("bitsandbytes", "fail", f"{bitsandbytes.__version__} with the CPU backend; the recipe quantises on GPUs",
                     "install a CUDA build of torch, then reinstall bitsandbytes")
    return Check("bitsandbytes", "ok", f"{bitsandbytes.__version__} ({backend} backend)")


def _import_check(name: str, module: str, distribution: str, needed: bool, purpose: str, install: str) -> Check:
    """An optional CUDA extension: absent is fine unless needed; present but broken is always worth a line."""
    if importlib.util.find_spec(module) is None:
        status: Status = "fail" if needed else "warn"
        return Check(name, status, f"not installed ({purpose})", install)
    try:
        with _quiet():
            importlib.import_module(module)
    except Exception as exc:  # undefined symbols: built for another torch or CUDA
        first = library_words(exc)
        return Check(name, "fail", f"{_version(distribution) or 'installed'} but cannot import: {first}",
                     f"rebuild it for this torch: pip install --force-reinstall --no-build-isolation {distribution}")
    return Check(name, "ok", f"{_version(distribution) or 'installed'} imports with this torch")


def check_flash_attn(recipe: Recipe | None) -> Check:
    needed = recipe is not None and recipe.memory.attention == "flash" and recipe.uses_gpu
    return _import_check("flash-attn", "flash_attn", "flash-attn", needed, "attention falls back to sdpa",
                         "pip install flash-attn --no-build-isolation (CUDA GPUs only), or set memory.attention: sdpa")


def check_vllm(recipe: Recipe | None) -> Check:
    """vLLM for grpo's vllm_colocate/vllm_server generation: installed, and a version TRL supports (TRL's own check,
    whose warning names its range)."""
    import warnings

    grpo = recipe.objective.grpo if recipe is not None else None
    needed = grpo is not None and grpo.generation != "transformers"
    install = "pip install vllm (a version TRL supports, on the GPU machines), or set objective.grpo.generation: " \
              "transformers"
    version = _version("vllm")
    if version is None:
        why = f"objective.grpo.generation: {grpo.generation} needs it" if needed else \
            "only grpo's vLLM generation uses it"
        return Check("vllm", "fail" if needed else "ok", f"not installed ({why})", install if needed else "")
    from trl.import_utils import is_vllm_available

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        is_vllm_available()
    unsupported = next((str(warning.message) for warning in caught if "vLLM versions" in str(warning.message)), None)
    if unsupported:
        return Check("vllm", "fail" if needed else "warn", unsupported.split(" We recommend")[0], install)
    return Check("vllm", "ok", f"vllm {version}, within TRL's supported range")


def check_liger(recipe: Recipe | None) -> Check:
    needed = recipe is not None and recipe.memory.liger
    return _import_check("liger-kernel", "liger_kernel", "liger-kernel", needed, "fused kernels unavailable",
                         "pip install liger-kernel, or set memory.liger: false")


def _model_type(recipe: Recipe | None) -> str | None:
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts

    if recipe is None:
        return None
    try:
        return model_facts(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code).model_type
    except UnknownModelError:  # check_model says why; the kernels are then told without the model's class
        return None


def machine_kernels(recipe: Recipe | None) -> dict[str, str]:
    """The kernels this machine will use for ``recipe`` (or in general, without one): attention, Liger, and how
    TRL's fused log-prob head folds its tiles (dpo/kto) -- each with the loader's own reason."""
    import torch
    from transformers.utils import is_triton_available

    from tuner.loading.model import choose_attention, choose_liger

    model_type, cuda = _model_type(recipe), torch.cuda.is_available()
    attention, why = choose_attention(recipe.memory.attention if recipe else "auto", model_type)
    liger, liger_why = choose_liger(recipe.memory.liger if recipe else True, model_type or "llama",
                                    cuda and (recipe is None or recipe.uses_gpu))
    fold = "triton (TRL's Triton kernel on this GPU)" if is_triton_available() and cuda else \
        "torch ops, fp32 tiles (" + ("triton is not installed)" if cuda else "no CUDA GPU)")
    return {"attention": f"{attention} ({why})", "liger": f"on ({liger_why})" if liger else liger_why,
            "trl log-prob fold": fold}


def check_kernels(recipe: Recipe | None) -> Check:
    """Which kernels this machine will use, against the ones the plan assumed (tuner.planner.kernels)."""
    used = machine_kernels(recipe)
    detail = "; ".join(f"{name}: {value}" for name, value in used.items())
    if recipe is None or not recipe.uses_gpu:
        return Check("kernels", "ok", detail)
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.models import model_facts
    from tuner.planner.kernels import TRITON_FOLD, kernels

    try:
        planned = kernels(recipe, model_facts(recipe.model.id, recipe.model.revision,
                                              recipe.model.trust_remote_code).model_type)
    except UnknownModelError:
        return Check("kernels", "ok", detail)
    differ = []
    if not used["attention"].startswith({"flash": "flash_attention_2"}.get(planned.attention, planned.attention)):
        differ.append(f"attention {planned.attention}")
    if planned.liger != used["liger"].startswith("on"):
        differ.append(f"liger {'on' if planned.liger else 'off'}")
    if recipe.objective.preference and (planned.logprob_fold == TRITON_FOLD) != used["trl log-prob fold"].startswith("triton"):
        differ.append(f"the {planned.logprob_fold} fold of TRL's log-prob head")
    if differ:
        return Check("kernels", "warn", f"{detail}; the plan assumed {', '.join(differ)}",
                     "run tuner plan on this machine: it plans the kernels installed here")
    return Check("kernels", "ok", detail + "; as the plan assumed")


def tracker_installed(tracker: str) -> bool:
    """Whether the Trainer's integration for a tracker can run here (TensorBoard also writes through tensorboardX)."""
    modules = ("tensorboard", "tensorboardX") if tracker == "tensorboard" else (tracker,)
    return any(importlib.util.find_spec(module) is not None for module in modules)


def check_trackers(recipe: Recipe | None) -> Check:
    """Which experiment trackers are installed; fails when ``training.report_to`` names one that is not."""
    from tuner.recipe.schema import TRACKERS

    installed = [tracker for tracker in TRACKERS if tracker_installed(tracker)]
    absent = [tracker for tracker in TRACKERS if tracker not in installed]
    detail = f"installed: {', '.join(installed) or 'none'}" + (f"; not installed: {', '.join(absent)}" if absent else "")
    missing = [tracker for tracker in recipe.training.report_to if tracker in absent] if recipe else []
    if missing:
        return Check("trackers", "fail", f"training.report_to names {', '.join(missing)}, which is not installed "
                     f"({detail})", f"pip install 'tuner[{','.join(missing)}]', or remove it from training.report_to")
    hint = f" (pip install 'tuner[{absent[0]}]' adds one)" if absent else ""
    return Check("trackers", "ok", detail + hint)


def require_trackers(recipe: Recipe) -> None:
    """Before a launch (and again on every rank): a tracker the recipe names must be installed."""
    from tuner.recipe.source import RecipeError

    check = check_trackers(recipe)
    if check.status == "fail":
        raise RecipeError([f"{check.detail}: {check.fix}."])


def _deepspeed_ops_needed(recipe: Recipe | None) -> set[str]:
    if recipe is None or recipe.memory.distributed != "deepspeed":
        return set()
    mem = recipe.memory
    ops = set()
    if "cpu" in (mem.offload_optimizer, mem.offload_params):
        ops.add("cpu_adam")
    if "nvme" in (mem.offload_optimizer, mem.offload_params):
        ops |= {"cpu_adam", "async_io"}
    if recipe.uses_gpu and mem.offload_optimizer == "none":
        ops.add("fused_adam")
    return ops


def check_deepspeed(recipe: Recipe | None) -> Check:
    """ds_report in one line: which ops this machine can build, and whether the recipe's ones are among them."""
    needs_deepspeed = recipe is not None and recipe.memory.distributed == "deepspeed"
    try:
        with _quiet():
            import deepspeed
            from deepspeed.git_version_info import installed_ops
            from deepspeed.ops.op_builder.all_ops import ALL_OPS
            compatible = {name for name, builder in ALL_OPS.items() if builder.is_compatible(verbose=False)}
    except Exception as exc:
        return Check("deepspeed", "fail" if needs_deepspeed else "warn", f"cannot import: {library_words(exc)}",
                     "pip install deepspeed (needed for distributed: deepspeed)")
    prebuilt = {name for name, built in installed_ops.items() if built}
    needed = _deepspeed_ops_needed(recipe)
    detail = f"{deepspeed.__version__}: {len(compatible)}/{len(ALL_OPS)} ops compatible, {len(prebuilt)} prebuilt"
    unavailable = sorted(needed - compatible)
    if unavailable:
        return Check("deepspeed", "fail", f"{detail}; the recipe needs {', '.join(unavailable)}, which cannot build here",
                     "run ds_report for the reason (usually a missing CUDA toolkit or libaio-dev for async_io)")
    jit = sorted(needed - prebuilt)
    if jit and not (shutil.which("ninja") or importlib.util.find_spec("ninja")):
        return Check("deepspeed", "fail", f"{detail}; {', '.join(jit)} must be compiled at first use and ninja is missing",
                     "pip install ninja (and have a C++ compiler), or prebuild: DS_BUILD_OPS=1 pip install deepspeed")
    incompatible = sorted(set(ALL_OPS) - compatible)
    if incompatible:
        detail += f" (not here: {', '.join(incompatible)})"
    return Check("deepspeed", "ok", detail)
