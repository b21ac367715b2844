"""A hub model's files, downloaded once, before anything loads them.

``tuner run`` (prepare_run), ``tuner infer``/``chat``/``serve`` and, on several machines, ``launch.sh N`` (each
machine before its rendezvous) call :func:`plan_download` and :func:`download`: huggingface_hub's
``snapshot_download`` of exactly what ``from_pretrained`` reads for a causal LM and its tokenizer — the top-level
config, generation-config, tokenizer and chat-template files (and the model's ``.py`` files under
trust_remote_code) and the weight files its safetensors index names — with a progress bar of size and rate, into the
Hugging Face cache (``HF_HOME``/``HF_HUB_CACHE``; ``HF_ENDPOINT`` and ``HF_TOKEN`` apply).  A run directory records
the commit and files (``model_snapshot.json``), so every rank and machine loads that snapshot from its own cache
(:func:`run_snapshot`) and never asks the hub.

With ``HF_HUB_OFFLINE`` set nothing is planned here: the cache is all there is, and transformers reads it.
Machines that share one Hugging Face cache download once: huggingface_hub takes a lock per file
(``<cache>/.locks/``), so a second machine waits for the first one's file and reuses it.
"""
from __future__ import annotations

import glob
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.catalog.hub import INDEX_FILE, SINGLE_WEIGHTS_FILE, HubError, human_bytes, hub_error, is_hub_id
from tuner.loading.model import ModelLoadError
from tuner.reason import library_words
from tuner.rundir.layout import MODEL_SNAPSHOT

LOADER_SUFFIXES = (".json", ".jinja", ".model", ".tiktoken", ".txt")  # config, tokenizer, chat template, merges
CODE_SUFFIX = ".py"  # a model's own classes: fetched only under trust_remote_code
BIN_INDEX_FILE = "pytorch_model.bin.index.json"
BIN_WEIGHTS_FILE = "pytorch_model.bin"


@dataclass(frozen=True)
class HubDownload:
    """The files one hub model's load reads, at one commit, and which of them this machine's cache lacks."""

    model_id: str
    revision: str  # as asked
    commit: str
    files: dict[str, int]  # name -> bytes
    missing: tuple[str, ...]  # not in this machine's Hugging Face cache yet
    cache_dir: str

    @property
    def missing_bytes(self) -> int:
        return sum(self.files[name] for name in self.missing)

    def describe(self) -> str:
        commit = f"{self.model_id} (commit {self.commit[:12]})"
        if not self.missing:
            return f"model: {commit}, all {len(self.files)} files already in the Hugging Face cache {self.cache_dir}"
        return (f"downloading {commit}: {len(self.missing)} of {len(self.files)} files, "
                f"{human_bytes(self.missing_bytes)}, into {self.cache_dir}")

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("missing")  # this machine's, not the run's
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> HubDownload:
        data = json.loads(text)
        return cls(data["model_id"], data["revision"], data["commit"], data["files"],
                   _missing(data["model_id"], data["commit"], data["files"]), _cache_dir())


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _missing(model_id: str, commit: str, files) -> tuple[str, ...]:
    from huggingface_hub import try_to_load_from_cache

    return tuple(name for name in files if not isinstance(try_to_load_from_cache(model_id, name, revision=commit), str))


def _weight_files(model_id: str, commit: str, names: set[str]) -> list[str]:
    """The weight files transformers loads: those the safetensors index names, the one safetensors file, or else
    PyTorch's .bin files."""
    from huggingface_hub import hf_hub_download

    for index_name, single in ((INDEX_FILE, SINGLE_WEIGHTS_FILE), (BIN_INDEX_FILE, BIN_WEIGHTS_FILE)):
        if index_name in names:
            index = json.loads(Path(hf_hub_download(model_id, index_name, revision=commit)).read_text())
            return sorted(set(index.get("weight_map", {}).values()))
        if single in names:
            return [single]
    raise HubError(f"{model_id} ships no weights transformers loads ({SINGLE_WEIGHTS_FILE}, {INDEX_FILE} or "
                   f"{BIN_WEIGHTS_FILE}); point model.id at a model that does, or at a local directory.")


def plan_download(model_id: str, revision: str | None = None, trust_remote_code: bool = False) -> HubDownload | None:
    """What loading ``model_id`` needs from the hub, asked of the hub now (one request and the index): the commit
    ``revision`` names, the files and their sizes, and which are cached.  None for a built-in model, a local folder
    or anything but an ``org/name`` hub id, and under HF_HUB_OFFLINE; :class:`HubError` when the hub refuses."""
    if not is_hub_id(model_id) or Path(model_id).expanduser().exists():
        return None
    from huggingface_hub import HfApi, constants

    if constants.is_offline_mode():
        return None
    revision = revision or "main"
    try:
        info = HfApi().model_info(model_id, revision=revision, files_metadata=True)
        sizes = {sibling.rfilename: (sibling.lfs.size if sibling.lfs else sibling.size) or 0
                 for sibling in info.siblings or []}
        weights = _weight_files(model_id, info.sha, set(sizes))
    except HubError:
        raise
    except Exception as exc:
        raise hub_error(exc, model_id, revision, f"looking up {model_id}'s files (revision {revision}) on "
                                                 f"{constants.ENDPOINT}") from None
    suffixes = LOADER_SUFFIXES + ((CODE_SUFFIX,) if trust_remote_code else ())
    names = sorted({name for name in sizes if "/" not in name and name.endswith(suffixes)} | set(weights))
    files = {name: sizes.get(name, 0) for name in names}
    return HubDownload(model_id, revision, info.sha, files, _missing(model_id, info.sha, files), _cache_dir())


SHOWN_BAR = "huggingface_hub.snapshot_download"  # its bar of the bytes written to the cache, across all files


def _progress_bar(shown: bool, description: str):
    """One bar for the whole download, with tqdm's standard size, rate and time left: huggingface_hub's own bars
    hide themselves when stderr is no terminal (a log, a pipe, CI) and come three at a time.  Nothing at all where
    another display owns the screen (``shown`` false: the wizard)."""
    from huggingface_hub.utils import tqdm

    class Progress(tqdm):
        def __init__(self, *args, **kwargs):
            bar = shown and kwargs.get("name") == SHOWN_BAR
            if bar:
                kwargs.pop("bar_format", None)
                kwargs["desc"] = description
            super().__init__(*args, **{**kwargs, "disable": not bar, "mininterval": 1.0})

        def set_description(self, *args, **kwargs) -> None:  # keep the model's name and tqdm's own rate
            pass

        def set_postfix_str(self, *args, **kwargs) -> None:
            pass

    return Progress


def download(plan: HubDownload, *, progress: bool = True) -> Path:
    """The snapshot folder of ``plan``'s commit, holding all its files (downloaded now when missing)."""
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(plan.model_id, revision=plan.commit,
                                      allow_patterns=[glob.escape(name) for name in plan.files],
                                      tqdm_class=_progress_bar(progress, plan.model_id)))
    except Exception as exc:
        raise hub_error(exc, plan.model_id, plan.revision,
                        f"downloading {plan.model_id} (commit {plan.commit[:12]}) from {constants.ENDPOINT}") from None


def local_snapshot(plan: HubDownload) -> Path:
    """The snapshot folder of ``plan``'s commit from this machine's cache, without asking the hub; every file must be
    there (huggingface_hub checks the snapshot against the file list it kept when downloading)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(plan.model_id, revision=plan.commit, local_files_only=True,
                                      allow_patterns=[glob.escape(name) for name in plan.files]))
    except Exception as exc:
        reason = library_words(exc, 1000)
        raise ModelLoadError(
            f"model.id: {plan.model_id} (commit {plan.commit[:12]}) is not complete in this machine's Hugging Face "
            f"cache {plan.cache_dir} ({reason}). `tuner run` downloads it before launching and `launch.sh N` on each "
            "machine before its rendezvous (tuner doctor --preflight); run that here, or share the cache.") from None


def run_snapshot(run_dir: Path) -> Path | None:
    """For a rank: the local snapshot of the hub model prepare_run recorded for this run, or None when it recorded
    none (a built-in or local model, or HF_HUB_OFFLINE)."""
    record = Path(run_dir) / MODEL_SNAPSHOT
    if not record.is_file():
        return None
    return local_snapshot(HubDownload.from_json(record.read_text(encoding="utf-8")))
