"""``tuner serve``: a model behind an OpenAI-compatible HTTP API, through the server transformers ships
(``transformers serve``: chat completions, streamed or not, ``/v1/models``, ``/health``).

transformers' server loads one folder with ``from_pretrained`` and prompts with the tokenizer's chat template, so
tuner lays out that folder (``<run>/serve``, or a temporary one) from links, without copying weights:

- a full or merged model: its files;
- base + LoRA adapter: the base model's files, then the adapter's. transformers loads a folder that holds both a
  model and ``adapter_config.json`` as that model with the adapter applied (peft's integration in
  ``from_pretrained``); an adapter folder alone it cannot load, as it has no ``config.json``;
- the run's tokenizer on top; and when it has no chat template, ``chat_template.jinja`` holding the template
  that prompts the way the run trained (:func:`tuner.data.formats.chat_template_for`), the one ``tuner chat`` uses.
"""
from __future__ import annotations

import errno
import socket
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from tuner.fileio import FILE, LINK, DestinationRefused, atomic_write_text, check_destination
from tuner.infer.target import MODEL_CONFIG, InferenceTarget
from tuner.loading.model import ModelLoadError, cannot_load, load_tokenizer
from tuner.rundir.layout import MERGED_DIR, SERVE_DIR
from tuner.rundir.lock import RunLock

CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers saves and finds a tokenizer's chat template
REQUEST_TIMEOUT_S = 60  # default time budget of one request's generation (generate's max_time)
SHUTDOWN_S = 3  # SIGTERM or Ctrl-C: in-flight requests get this long, then are cancelled


@dataclass
class ServingFolder:
    """The folder transformers' server loads; its path is also the model name clients send."""

    path: Path
    target: InferenceTarget
    wrote_chat_template: bool  # False: the tokenizer's own template is used
    temporary: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def model_name(self) -> str:
        return str(self.path)


def merged_if_any(target: InferenceTarget) -> InferenceTarget:
    """A LoRA run whose adapter was merged (``output.save: merged`` or ``tuner merge``) is served merged."""
    merged = target.run_dir / MERGED_DIR if target.run_dir and target.adapter else None
    if merged is None or not (merged / MODEL_CONFIG).is_file():
        return target
    return replace(target, model_path=str(merged), tokenizer_path=str(merged), adapter=None)


def local_model_dir(target: InferenceTarget) -> Path:
    """The folder holding the (base) model: a local path, or the hub cache's snapshot (never downloaded here)."""
    path = Path(target.model_path)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(target.model_path, revision=target.recipe.model.revision, local_files_only=True))
    except Exception as exc:  # not cached: LocalEntryNotFoundError and friends
        raise cannot_load(target.model_path, exc) from None


def _link_contents(source: Path, folder: Path) -> None:
    for entry in source.iterdir():
        link = folder / entry.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(entry.resolve())


def check_serving_folder(folder: Path) -> None:
    """Refuse a serving folder that is not tuner's to rebuild: a link (to anywhere: its entries are not tuner's),
    or a folder holding anything but links and the chat template tuner writes (a file, or a link to the
    tokenizer's)."""
    try:
        check_destination(folder, owned=lambda name: (FILE, LINK) if name == CHAT_TEMPLATE_FILE else LINK)
    except DestinationRefused as exc:
        raise ModelLoadError(f"{exc} (tuner serve rebuilds this folder from links.)") from None


def serving_folder(target: InferenceTarget, folder: Path | None = None) -> ServingFolder:
    """Lay out the folder transformers' server loads (see the module's docstring); ``folder`` defaults to
    ``<run>/serve`` for a run (written under the run's lock), else a temporary folder removed with the returned
    object."""
    target = merged_if_any(target)
    if folder is None and target.run_dir is not None:
        with RunLock(target.run_dir):
            return _lay_out(target, target.run_dir / SERVE_DIR, None)
    temporary = tempfile.TemporaryDirectory(prefix="tuner-serve-") if folder is None else None
    return _lay_out(target, Path(temporary.name) if temporary else folder, temporary)


def _lay_out(target: InferenceTarget, folder: Path, temporary: tempfile.TemporaryDirectory | None) -> ServingFolder:
    check_serving_folder(folder)
    if folder.is_dir():  # tuner's own: links and a template, rebuilt every time (a link goes, not what it points at)
        for entry in folder.iterdir():
            entry.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    sources = [local_model_dir(target)]
    if target.adapter is not None:
        sources.append(target.adapter)
    if target.tokenizer_path not in (target.model_path, str(target.adapter)) and Path(target.tokenizer_path).is_dir():
        sources.append(Path(target.tokenizer_path))
    for source in sources:
        _link_contents(source, folder)
    tokenizer = load_tokenizer(target.recipe, str(folder))
    wrote = not tokenizer.chat_template
    if wrote:
        write_chat_template(folder, tokenizer, target.recipe.data.format)
    return ServingFolder(folder, target, wrote, temporary)


def write_chat_template(folder: Path, tokenizer, data_format: str) -> Path:
    """Save the template of the prompt format tuner trains with where transformers reads a tokenizer's template
    (and what vLLM's --chat-template takes), replacing a link of that name."""
    from tuner.data.formats import chat_template_for

    return atomic_write_text(folder / CHAT_TEMPLATE_FILE, chat_template_for(tokenizer, data_format))


def require_server() -> None:
    """transformers' server needs its extra (FastAPI, uvicorn, openai's types) and a transformers release whose
    server tuner drives (:func:`unsupported_server_transformers`)."""
    from transformers.utils.import_utils import is_serve_available

    from tuner.catalog.model_classes import installed_transformers_version

    if not is_serve_available():
        raise ModelLoadError("tuner serve runs transformers' server, whose packages are not installed: "
                             "pip install 'tuner[serve]' (transformers[serving]).")
    problem = unsupported_server_transformers(installed_transformers_version())
    if problem:
        raise ModelLoadError(problem)


def unsupported_server_transformers(installed: str | None) -> str | None:
    """Why tuner serve cannot drive the ``installed`` transformers, or None.  Its releases are the ones tuner's
    ``serve`` extra names (pyproject.toml): tuner's server reaches into ``transformers serve`` (the model in this
    process, its app wrapped by tuner's limits), which transformers 5.25 rebuilt around a model process of its own."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        declared = [Requirement(line) for line in requires("tuner") or ()]
    except PackageNotFoundError:  # run from a checkout that is not installed: nothing declared to hold it to
        return None
    wanted = next((r.specifier for r in declared if r.name == "transformers" and r.marker
                   and r.marker.evaluate({"extra": "serve"})), None)
    if wanted is None or installed is None or wanted.contains(installed, prereleases=True):
        return None
    return (f"tuner serve drives the server of transformers {wanted} and transformers {installed} is installed: "
            "pip install 'tuner[serve]' (it installs a release tuner serves with).")


def check_port_free(host: str, port: int) -> None:
    """Refuse a taken port before minutes of model loading, not after."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(exc.errno, "the address is in use (another server?); choose another with --port",
                              f"{host}:{port}") from None
            raise


class Server:
    """transformers' OpenAI-compatible server for one folder: the model is loaded when this is built, and the
    server listens from :meth:`run` until Ctrl-C or SIGTERM (uvicorn's own graceful shutdown, cut to
    :data:`SHUTDOWN_S`).  Bounded by the library's own means: each request's ``generate`` stops after
    ``request_timeout_s`` (``max_time``), tuner's :class:`~tuner.infer.request_limits.RequestLimits` checks every
    request in front of it (and caps those served at once), and its protocol
    (:mod:`tuner.infer.connection_limits`) closes a connection whose first request's headers are late."""

    def __init__(self, served: ServingFolder, host: str, port: int, bits: int | None = None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S):
        from transformers.cli.serve import Serve

        class Prepared(Serve):
            """Serve as ``transformers serve`` builds it, not yet listening: ``non_blocking`` would start it in a
            thread; here it runs in the main thread, where uvicorn handles the signals."""

            def start_server(self) -> None:
                pass

            def loaded(self):
                manager = self._model_manager  # the force_model it preloaded, from its cache: (model, processor)
                return manager.load_model_and_processor(manager.process_model_name(manager.force_model))

            def close(self) -> None:
                self._generation_state.shutdown()
                self._model_manager.shutdown()

        import torch

        from tuner.infer.load import inference_dtype

        recipe = served.target.recipe
        # transformers' server puts the model on a GPU when there is one, else on the CPU
        dtype, self.dtype_note = inference_dtype(served.target, on_gpu=torch.cuda.is_available())
        try:
            self._serve = Prepared(
                force_model=served.model_name, host=host, port=port, dtype=dtype,
                quantization={4: "bnb-4bit", 8: "bnb-8bit"}.get(bits), trust_remote_code=recipe.model.trust_remote_code,
                log_level="warning", non_blocking=True)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"transformers serve cannot load {served.model_name}: {exc}") from None
        self.served = served
        self.url = f"http://{host}:{port}/v1"
        self.limits = self._bound(recipe.inference.max_new_tokens, request_timeout_s)

    def _bound(self, default_max_tokens: int, request_timeout_s: float):
        from tuner.data.chat_template import chat_ids
        from tuner.infer.connection_limits import BoundedH11Protocol
        from tuner.infer.generate import model_context
        from tuner.infer.request_limits import Limits, RequestLimits, message_text

        model, processor = self._serve.loaded()
        tokenizer = getattr(processor, "tokenizer", processor)
        model.generation_config.max_time = float(request_timeout_s)  # each request's copy inherits the budget

        def count_tokens(messages: list[dict], tools) -> int:  # the server renders the same, once this returned
            plain = [{"role": message["role"], "content": message_text(message)} for message in messages]
            return len(chat_ids(tokenizer, plain, add_generation_prompt=True, tools=tools))

        text_config = model.config.get_text_config()
        limits = Limits(model_context(model, tokenizer), default_max_tokens,
                        getattr(text_config, "vocab_size", None) or len(tokenizer), count_tokens,
                        float(request_timeout_s))
        config = self._serve.server.config
        config.app = RequestLimits(config.app, limits)
        config.http = BoundedH11Protocol
        config.limit_concurrency = None  # it counted idle sockets; RequestLimits counts requests
        config.timeout_graceful_shutdown = SHUTDOWN_S
        return limits

    def model(self):
        return self._serve.loaded()[0]

    def run(self) -> None:
        """Listen until Ctrl-C (uvicorn shuts down gracefully, then passes the interrupt on) or SIGTERM."""
        try:
            self._serve.server.run()
        except KeyboardInterrupt:
            print("server stopped", file=sys.stderr)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the generation workers and let the model go (a server that never listened too)."""
        self._serve.close()
