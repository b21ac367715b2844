"""Any hub model by name: its config.json, and its safetensors index for the size and dtype it ships in, fetched
once through huggingface_hub and kept under ``$TUNER_HOME/hub/`` (by one process of all the ranks and machines that
share it: tuner/build_once.py), so planning a model outside the catalog needs none of its weights.  Offline (``HF_HUB_OFFLINE``) only what tuner kept or the Hugging Face cache holds answers.

huggingface_hub is imported inside the functions (its HTTP client costs ~0.2 s): ``tuner plan`` of a catalog model
never loads it.  The hub's own settings apply: ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME``/``HF_HUB_CACHE``.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

from tuner.catalog.model_config import MAX_CONFIG_BYTES, UnknownModelError, code_refs, decoded

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # 'name' or 'org/name'
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
KEPT_DIR = "hub"  # under $TUNER_HOME: a folder per model and revision (built once, tuner/build_once.py)
KEPT_FILE = "hub_config.json"
# an index of a 1T-parameter model is a few MiB
MAX_INDEX_BYTES = 64 * 2**20


class HubError(UnknownModelError):
    """The hub cannot give a model's files — no such model, gated, private, unreachable — or this machine has no
    room for them.  An environment error (exit 1); the message names the model, the endpoint and what was tried."""


_FAILED: dict[tuple[str, str], HubError] = {}  # asked once per process: validation, plan and advice ask alike


def human_bytes(count: float) -> str:
    """1.2 GB, 830.0 MB, 412 B: decimal units, as the hub's pages and progress bars show sizes."""
    units, power = ("B", "kB", "MB", "GB", "TB"), 0
    while count >= 1000 and power < len(units) - 1:
        count, power = count / 1000, power + 1
    return f"{count:.0f} B" if power == 0 else f"{count:.1f} {units[power]}"


@dataclass(frozen=True)
class ShippedWeights:
    """What the safetensors files on the hub hold, from their index (or the one file's size): the dtype a model is
    shipped in decides its download and, for pre-quantised models (gpt-oss's MXFP4 experts), its memory."""

    bytes: int | None  # all weight files together
    files: int
    parameters: int | None  # the index's metadata.total_parameters, where the writer recorded it
    dtype: str | None  # config.json's dtype (torch_dtype before transformers 5)
    quantization: str | None  # config.json's quantization_config.quant_method (mxfp4, fp8, gptq, awq, bitsandbytes)

    def describe(self) -> str:
        size = human_bytes(self.bytes) if self.bytes is not None else "size unknown"
        kind = " ".join(filter(None, [self.dtype, self.quantization and f"{self.quantization}-quantised"]))
        return f"ships {size} of safetensors in {self.files} file{'s' * (self.files != 1)}" + (f", {kind}" if kind else "")


@dataclass(frozen=True)
class HubConfig:
    model_id: str
    revision: str  # as asked ("main" when the recipe names none)
    commit: str
    config: dict
    weights: ShippedWeights | None  # None: no safetensors on the hub (only .bin or other formats)
    where: str  # which copy was used

    @property
    def source(self) -> str:
        """What the user is told the plan's architecture came from."""
        return self.where + (f"; {self.weights.describe()}" if self.weights else "")

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("where")
        return json.dumps(data, indent=1) + "\n"


def is_hub_id(model_id: str) -> bool:
    """``org/name`` as the hub spells repository ids (a bare name is no longer a hub id)."""
    return "/" in model_id and bool(HUB_ID.match(model_id))


def _kept_dir(model_id: str, revision: str) -> Path:
    from tuner.home import tuner_home

    return tuner_home() / KEPT_DIR / model_id.replace("/", "--") / quote(revision, safe="")


def _read_kept(model_id: str, revision: str) -> HubConfig | None:
    from tuner.build_once import is_built

    folder = _kept_dir(model_id, revision)
    if not is_built(folder):
        return None
    try:
        data = json.loads((folder / KEPT_FILE).read_text(encoding="utf-8"))
        weights = data["weights"] and ShippedWeights(**data["weights"])
        return HubConfig(data["model_id"], data["revision"], data["commit"], data["config"], weights,
                         f"the hub's config.json (commit {data['commit'][:12]}), kept by tuner in {folder}")
    except (OSError, ValueError, KeyError, TypeError):  # damaged: fetched again
        return None


def hub_config(model_id: str, revision: str | None = None) -> HubConfig | None:
    """A hub model's config.json and shipped weights: tuner's kept copy, else fetched from the hub (and kept); when
    offline, the Hugging Face cache's copy.  None for a name that is not a hub id, and offline when nothing is on
    this machine; :class:`HubError` when the hub was asked and could not answer.

    Asked once per process (per home and hub): validate, the kernels and the plan each read the model's config, and
    all of them name the source as it was the first time ("fetched now", not "kept" by the first of them)."""
    import os

    from tuner.home import tuner_home

    return _hub_config(model_id, revision, str(tuner_home()), os.environ.get("HF_ENDPOINT"),
                       os.environ.get("HF_HUB_OFFLINE"))


@lru_cache(maxsize=64)
def _hub_config(model_id: str, revision: str | None, home: str, endpoint: str | None,
                offline: str | None) -> HubConfig | None:
    if not is_hub_id(model_id):
        return None
    revision = revision or "main"
    kept = _read_kept(model_id, revision)
    if kept is not None:
        return kept
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return _from_hub_cache(model_id, revision)
    if (model_id, revision) in _FAILED:
        raise _FAILED[model_id, revision]
    try:
        return _fetch_and_keep(model_id, revision)
    except HubError as exc:
        _FAILED[model_id, revision] = exc
        raise


def _fetch_and_keep(model_id: str, revision: str) -> HubConfig:
    """Fetched by one process of all those sharing $TUNER_HOME (ranks, machines), the others reading what it kept."""
    from tuner.build_once import build_once
    from tuner.fileio import atomic_write_text

    def fetch_into(folder: Path) -> HubConfig:
        found = _fetch(model_id, revision)
        atomic_write_text(folder / KEPT_FILE, found.to_json())
        return found

    try:
        fetched = build_once(_kept_dir(model_id, revision), fetch_into, what=f"{model_id}'s hub config.json")
    except OSError:  # a read-only or full home: fetched again next time
        return _fetch(model_id, revision)
    return fetched or _read_kept(model_id, revision) or _fetch(model_id, revision)


def _weights(config: dict, index: dict | None, single_file_bytes: int | None) -> ShippedWeights | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    dtype = config.get("dtype") or config.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
    quantization = (config.get("quantization_config") or {}).get("quant_method")
    if index is not None:
        metadata = index.get("metadata") or {}
        return ShippedWeights(metadata.get("total_size"), len(set((index.get("weight_map") or {}).values())),
                              metadata.get("total_parameters"), dtype, quantization)
    if single_file_bytes is not None:
        return ShippedWeights(single_file_bytes, 1, None, dtype, quantization)
    return None


def _read_json(path: str, limit: int) -> dict:
    from tuner.fileio import read_limited

    data = json.loads(read_limited(path, limit, pipes=False))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _fetch(model_id: str, revision: str) -> HubConfig:
    """config.json, then the index (or the single weights file's size, a HEAD request): two small requests."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError

    what = f"fetching {model_id}'s {CONFIG_FILE} (revision {revision}) from {constants.ENDPOINT}"
    try:
        # one HEAD first, without huggingface_hub's retries (half a minute when the hub cannot be reached at all);
        # then the download by the revision's name, so the cache records which commit it names (offline use)
        get_hf_file_metadata(hf_hub_url(model_id, CONFIG_FILE, revision=revision))
        config_path = hf_hub_download(model_id, CONFIG_FILE, revision=revision)
        commit = Path(config_path).parent.name  # the snapshot folder is named by its commit
        config = decoded(_read_json(config_path, MAX_CONFIG_BYTES))
        index, single = None, None
        try:
            index = _read_json(hf_hub_download(model_id, INDEX_FILE, revision=commit), MAX_INDEX_BYTES)
        except EntryNotFoundError:  # one file of weights, or none in safetensors
            try:
                single = get_hf_file_metadata(hf_hub_url(model_id, SINGLE_WEIGHTS_FILE, revision=commit)).size
            except EntryNotFoundError:
                pass
    except Exception as exc:
        raise hub_error(exc, model_id, revision, what) from None
    return HubConfig(model_id, revision, commit, config, _weights(config, index, single),
                     f"the hub's config.json (commit {commit[:12]}), fetched now from {constants.ENDPOINT}")


def _from_hub_cache(model_id: str, revision: str) -> HubConfig | None:
    from huggingface_hub import constants, try_to_load_from_cache

    repo_folder = Path(constants.HF_HUB_CACHE) / constants.REPO_ID_SEPARATOR.join(["models", *model_id.split("/")])
    if not repo_folder.is_dir():
        return None  # nothing of this model is cached: no need to load the cache reader
    config_path = try_to_load_from_cache(model_id, CONFIG_FILE, revision=revision)
    if not isinstance(config_path, str):
        return None
    try:
        config = decoded(_read_json(config_path, MAX_CONFIG_BYTES))
        index_path = try_to_load_from_cache(model_id, INDEX_FILE, revision=revision)
        index = _read_json(index_path, MAX_INDEX_BYTES) if isinstance(index_path, str) else None
    except (OSError, ValueError, RecursionError):
        return None
    single = try_to_load_from_cache(model_id, SINGLE_WEIGHTS_FILE, revision=revision)
    single_bytes = Path(single).stat().st_size if isinstance(single, str) else None
    commit = Path(config_path).parent.name
    return HubConfig(model_id, revision, commit, config, _weights(config, index, single_bytes),
                     f"the Hugging Face cache's config.json (commit {commit[:12]}; HF_HUB_OFFLINE is set)")


# a module's relative imports, as transformers reads them (dynamic_module_utils.get_relative_imports)
RELATIVE_IMPORT = re.compile(r"^\s*(?:from\s+\.(\S+)\s+import|import\s+\.(\S+))", re.MULTILINE)


def code_folder(found: HubConfig) -> Path:
    """The Hugging Face cache's snapshot of a hub model at ``found.commit`` holding its config.json and its own code
    (the modules its ``auto_map`` names, and those they import relatively), for a recipe that trusts that code:
    fetched through huggingface_hub when not cached yet, never any weights.  Offline and not cached, or a file
    the hub does not have: :class:`UnknownModelError` naming the files; the hub failing: :class:`HubError`."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    modules = {ref.rsplit(".", 1)[0] for ref in code_refs(found.config) if "--" not in ref}  # '--': another repo's
    wanted = [CONFIG_FILE] + sorted(module + ".py" for module in modules)
    model_id, revision, folder, done = found.model_id, found.commit, Path(), set()
    while wanted:
        name = wanted.pop(0)
        if name in done:
            continue
        try:
            path = Path(hf_hub_download(model_id, name, revision=revision))
        except Exception as exc:
            needed = sorted(done | {name, *wanted})
            if constants.is_offline_mode():
                raise UnknownModelError(
                    f"{model_id}: model.trust_remote_code: its own code is not in the Hugging Face cache ({name} of "
                    f"commit {revision[:12]} is missing; it needs {', '.join(needed)}) and HF_HUB_OFFLINE is set, so "
                    "the hub was not asked. Unset HF_HUB_OFFLINE to fetch those files (no weights), or fetch them "
                    f"where there is network: hf download {model_id} {' '.join(needed)} --revision {revision}"
                ) from None
            if isinstance(exc, RemoteEntryNotFoundError):
                raise UnknownModelError(
                    f"{model_id}: model.trust_remote_code: its code needs {name} (named by its config.json's auto_map "
                    f"or imported by its code), which {constants.ENDPOINT} does not have at commit {revision[:12]}: "
                    "the model's code is incomplete. Point model.id at a model whose code is complete, or at a local "
                    "folder with it.") from None
            raise hub_error(exc, model_id, revision, f"fetching {model_id}'s {name} (its own code, revision "
                            f"{revision}) from {constants.ENDPOINT}") from None
        done.add(name)
        if name == CONFIG_FILE:
            folder = path.parent  # the snapshot: the code files lie beside it
        else:
            imported = [a or b for a, b in RELATIVE_IMPORT.findall(path.read_text(encoding="utf-8", errors="replace"))]
            wanted += [module.replace(".", "/") + ".py" for module in imported if not module.startswith(".")]
    return folder


def hub_error(exc: Exception, model_id: str, revision: str, what: str) -> HubError:
    """huggingface_hub's failure while ``what`` (e.g. "downloading ...") in one paragraph: the hub's own reason and
    what to do.  Anything unforeseen is named with its type, never a traceback."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"{constants.ENDPOINT}/{model_id}"
    reason = " ".join(str(getattr(exc, "server_message", None) or exc).split())
    status = getattr(getattr(exc, "response", None), "status_code", None)
    said = f" (the hub answered {status}: {reason})" if status else f" ({reason})"
    if isinstance(exc, GatedRepoError):
        advice = (f"{model_id} is gated{said}. Accept its terms on {page} with your account, then log in on this "
                  "machine (hf auth login, or set HF_TOKEN).")
    elif isinstance(exc, RepositoryNotFoundError):
        advice = (f"{model_id}: no such model on {constants.ENDPOINT}, or a private one this token cannot see{said}. "
                  "Check the id (org/name, as on the model's page); for a private model log in (hf auth login, or "
                  "set HF_TOKEN).")
    elif isinstance(exc, RevisionNotFoundError):
        advice = f"{model_id} has no revision {revision!r}{said}; fix model.revision."
    elif isinstance(exc, RemoteEntryNotFoundError):
        advice = (f"{model_id} has no {CONFIG_FILE} on the hub{said}: it is not a transformers model; point model.id "
                  "at one that is, or at a local directory.")
    elif isinstance(exc, HfHubHTTPError) and status == 401:
        advice = f"the hub refused the token{said}: log in again (hf auth login) or fix HF_TOKEN."
    elif isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError, TimeoutError)) or \
            type(exc).__module__.startswith("httpx"):
        advice = (f"cannot reach {constants.ENDPOINT}{said}. Check the network (or HF_ENDPOINT for a mirror); on a "
                  "machine without network set HF_HUB_OFFLINE=1 to use only tuner's catalog and the local cache, or "
                  "point model.id at a local directory.")
    elif isinstance(exc, HfHubHTTPError):
        advice = f"the hub failed{said}; try again later, or point model.id at a local directory."
    else:
        advice = f"{type(exc).__name__}: {reason}"
    return HubError(f"{what}: {advice}")
