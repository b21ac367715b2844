"""Where a model's facts come from: the shipped catalog, local config.json files and hub configs (catalog/hub.py).

The planner needs a model's parameters (how many, of which kind, which PEFT adapts and bitsandbytes quantises) and
the handful of numbers that shape activations.  Both come from the model's real module tree: its inventory
(:mod:`tuner.catalog.inventory`, built on the meta device once and shipped for the catalog), read through
:func:`facts_from_config` for a catalog entry, a local directory and a cached hub config alike.  What each decoder
layer is (attention, latent attention, gated delta net; dense or MoE) comes from :mod:`tuner.catalog.layer_kinds`.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from tuner.catalog.demo import DEMO_MODEL_ID
from tuner.catalog.facts import ModelFacts, facts_from_config
from tuner.catalog.model_config import MAX_CONFIG_BYTES, ModelConfigError, UnknownModelError, code_refs, read_config
from tuner.fileio import user_path

CATALOG_FILE = Path(__file__).with_name("models.json")


@lru_cache(maxsize=1)
def _catalog() -> dict[str, dict]:
    data = json.loads(CATALOG_FILE.read_text())
    data.pop("_comment", None)
    data.pop("_aliases", None)
    return data


@lru_cache(maxsize=1)
def catalog_aliases() -> dict[str, str]:
    """Other names of a catalog entry's architecture (a release, a distillation on the same base)."""
    return json.loads(CATALOG_FILE.read_text()).get("_aliases", {})


def catalog_ids() -> list[str]:
    return list(_catalog())


def catalog_config(key: str) -> dict:
    """A catalog entry as the config.json it was copied from (its ``_source`` and other notes left out)."""
    return {name: value for name, value in _catalog()[key].items() if not name.startswith("_")}


def _catalog_key(model_id: str) -> str | None:
    """Match a hub id to the catalog, ignoring case, the org and instruct/chat suffixes of the same architecture."""
    entries = {key.lower(): key for key in _catalog()}
    entries.update({alias.lower(): key for alias, key in catalog_aliases().items()})
    short = {key.split("/")[-1].lower(): key for key in _catalog()}
    short.update({alias.split("/")[-1].lower(): key for alias, key in catalog_aliases().items()})
    wanted = model_id.strip().lower()
    candidates = [wanted, wanted.split("/")[-1]]
    for suffix in ("-instruct", "-it", "-chat"):
        candidates += [c.removesuffix(suffix) for c in candidates if c.endswith(suffix)]
    candidates += [c.replace("meta-llama-3.1", "llama-3.1").replace("meta-llama-3", "llama-3.1") for c in candidates]
    for candidate in candidates:
        if candidate in entries:
            return entries[candidate]
        if candidate in short:
            return short[candidate]
    return None


def builtin_config(model_id: str = DEMO_MODEL_ID) -> dict:
    """A built-in model's config: what tuner.loading.demo_model builds it from (its saved config.json adds only what
    save_pretrained writes), so its shipped inventory serves before and after it is built.  Raises
    :class:`UnknownModelError` for a built-in name there is not."""
    from tuner.catalog.demo import builtin_model

    try:
        return builtin_model(model_id).full_config()
    except ValueError as exc:
        raise UnknownModelError(f"{model_id}: {exc}.") from None


def builtin_configs() -> dict[str, dict]:
    """Every built-in model's config, by id."""
    from tuner.catalog.demo import BUILTIN_MODELS

    return {model_id: model.full_config() for model_id, model in BUILTIN_MODELS.items()}


demo_config = builtin_config  # the demo's (builtin:demo) by default


def model_named_at(field: str, model_id: str, trust_remote_code: bool = False) -> ModelFacts:
    """:func:`model_facts` of a model the recipe names at ``field`` beside model.id (``objective.teacher``, a reward
    model): a model it cannot read is refused naming that field, not model.id."""
    try:
        return model_facts(model_id, None, trust_remote_code)
    except UnknownModelError as exc:
        raise UnknownModelError(str(exc), field) from None


@lru_cache(maxsize=64)
def model_facts(model_id: str, revision: str | None = None, trust_remote_code: bool = False) -> ModelFacts:
    """Architecture facts for a recipe's ``model.id``: a built-in model, a local directory, the catalog, or the hub's
    config.json (:mod:`tuner.catalog.hub`: kept under $TUNER_HOME once fetched; offline, the Hugging Face cache).

    Raises :class:`UnknownModelError` naming what was tried (:class:`~tuner.catalog.hub.HubError` when the hub was
    asked and could not answer).
    """
    if model_id.startswith("builtin:"):
        return facts_from_config(builtin_config(model_id), model_id, "tuner's built-in model")
    path = user_path(model_id)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise UnknownModelError(f"{model_id}: the directory has no config.json; point at a saved Hugging Face model.")
        try:
            config = read_config(config_file)
        except ModelConfigError as exc:
            raise UnknownModelError(str(exc)) from None
        return facts_from_config(config, model_id, f"{config_file}", trust_remote_code,
                                 path if trust_remote_code and code_refs(config) else None)
    if model_id.count("/") > 1 or model_id.startswith((".", "/", "~")):  # a path (a hub id is org/name)
        raise UnknownModelError(f"{model_id}: no such directory; point it at a folder save_pretrained wrote, "
                                "such as a finished run's final/ or merged/, or train that run first.")
    key = _catalog_key(model_id)
    if key is not None:
        return facts_from_config(catalog_config(key), model_id, f"tuner catalog ({key})")
    from tuner.catalog.hub import hub_config, is_hub_id

    found = hub_config(model_id, revision)  # kept by tuner, else its config.json from the hub (offline: the HF cache)
    if found is not None:
        from tuner.catalog.hub import code_folder

        folder = code_folder(found) if trust_remote_code and code_refs(found.config) else None
        return facts_from_config(found.config, model_id, found.source, trust_remote_code, folder)
    why = ("not kept by tuner nor in the local Hugging Face cache, and HF_HUB_OFFLINE is set so the hub was not "
           "asked. Unset HF_HUB_OFFLINE to fetch its config.json" if is_hub_id(model_id) else
           "and not a hub id (org/name). Give the hub id")
    raise UnknownModelError(
        f"{model_id}: no architecture facts: not a local directory, not in tuner's catalog, {why}, point model.id "
        f"at a directory with config.json, or use one of: {', '.join(catalog_ids())}.")


def model_config(model_id: str, revision: str | None = None, trust_remote_code: bool = False) -> dict:
    """The config.json mapping of ``model_id`` as :func:`model_facts` finds it (builtin:demo, a local directory, the
    catalog entry, the config.json tuner keeps for a hub model), for building the model's real classes from it."""
    if model_id.startswith("builtin:"):
        return builtin_config(model_id)
    path = user_path(model_id)
    if path.is_dir():
        try:
            return read_config(path / "config.json")
        except ModelConfigError as exc:
            raise UnknownModelError(str(exc)) from None
    key = _catalog_key(model_id)
    if key is not None:
        return catalog_config(key)
    from tuner.catalog.hub import hub_config

    found = hub_config(model_id, revision)
    if found is None:
        model_facts(model_id, revision, trust_remote_code)  # raises UnknownModelError, naming what was tried
    return dict(found.config)


CODE_CONFIGS = ("config.json", "tokenizer_config.json")  # where a model names the classes it ships (auto_map)


def _local_or_cached(model_id: str, revision: str | None, name: str) -> Path | None:
    """``name`` in the local model folder ``model_id``, or in the Hugging Face cache's copy of it; None if neither."""
    try:
        folder = Path(model_id).expanduser()
        if folder.is_dir():
            return folder / name if (folder / name).is_file() else None
    except (OSError, RuntimeError):  # a name too long for the filesystem, ~user of no one
        return None
    if "/" not in model_id:
        return None
    from huggingface_hub import constants  # a few ms; try_to_load_from_cache brings the HTTP client (~0.2 s)

    repo_folder = constants.REPO_ID_SEPARATOR.join(["models", *model_id.split("/")])  # its repo_folder_name
    if not (Path(constants.HF_HUB_CACHE) / repo_folder).is_dir():
        return None  # nothing of this model is cached: no need to load the cache reader
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_id, name, revision=revision)
    except Exception:  # not a valid hub id: nothing cached under it
        return None
    return Path(cached) if isinstance(cached, str) else None


def custom_code(model_id: str, revision: str | None = None) -> list[str]:
    """The classes a model ships as Python code (``auto_map`` in its config.json or tokenizer_config.json), read
    from a local folder or the Hugging Face cache without running anything; empty when there are none (or the
    model is not on this machine yet)."""
    from tuner.fileio import read_limited

    if model_id.startswith("builtin:"):
        return []
    found: set[str] = set()
    for name in CODE_CONFIGS:
        path = _local_or_cached(model_id, revision, name)
        try:
            if path and path.stat().st_size > MAX_CONFIG_BYTES:  # a tokenizer_config.json with a large vocabulary
                found.update(streamed_code_refs(path))
                continue
            config = json.loads(read_limited(path, MAX_CONFIG_BYTES, pipes=False)) if path else None
        except (OSError, ValueError, RecursionError):
            continue  # unreadable here; loading it reports that in its own words
        found.update(code_refs(config))
    return sorted(found)


# "auto_map" as a JSON string, each letter maybe written as a \u escape ("auto\u005fmap" is auto_map too: no other
# escape gives a letter or an underscore)
_AUTO_MAP = re.compile(rb'"((?:[a-z_]|\\u[0-9a-fA-F]{4}){8})"')
SCAN_CHUNK = 1 << 20
_SCAN_OVERLAP = 64  # more than a match can span (8 escaped letters and the quotes)
UNREADABLE_AUTO_MAP = "(an auto_map tuner could not read)"
_SPACE = b" \t\r\n"


def streamed_code_refs(path: Path) -> set[str]:
    """:func:`code_refs` of a JSON file of any size, in bounded memory: the file is scanned in chunks for the string
    ``auto_map``; where it is a key (a colon follows, after any white space) only its value is decoded, at most
    ``MAX_CONFIG_BYTES`` of it (a larger or broken one still counts as code, named :data:`UNREADABLE_AUTO_MAP`).
    Text inside another string cannot match: its quotes would be escaped."""
    found: set[str] = set()
    with open(path, "rb") as stream:
        base, window = 0, b""  # window: the file's bytes from offset base on, read so far
        while True:
            chunk = stream.read(SCAN_CHUNK)
            window += chunk
            # a match starting before limit lies whole in the window; the later ones are matched in the next
            limit = len(window) if not chunk else max(len(window) - _SCAN_OVERLAP, 0)
            for match in _AUTO_MAP.finditer(window):
                if match.start() >= limit:
                    break
                try:
                    spelled = json.loads(b'"' + match.group(1) + b'"')
                except ValueError:
                    continue
                if spelled == "auto_map":
                    found.update(_value_refs(path, base + match.end()))
            if not chunk:
                return found
            window, base = window[limit:], base + limit


def _value_refs(path: Path, offset: int) -> set[str]:
    """The classes of the ``auto_map`` value after ``offset`` (just past the key), or none when no colon follows
    (the string was a value, not a key)."""
    with open(path, "rb") as stream:
        stream.seek(offset)
        colon = False
        while block := stream.read(SCAN_CHUNK):  # white space of any length, then ":", then more
            rest = block.lstrip(_SPACE)
            if rest and not colon:
                if rest[:1] != b":":
                    return set()
                colon, rest = True, rest[1:].lstrip(_SPACE)
            if rest:
                stream.seek(stream.tell() - len(rest))
                break
        text = stream.read(MAX_CONFIG_BYTES).decode("utf-8", errors="replace")
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return {UNREADABLE_AUTO_MAP}
    return code_refs({"auto_map": value}) or ({UNREADABLE_AUTO_MAP} if value else set())
