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

from tuner.fileio import DestinationRefused, atomic_write_text, check_destination
from tuner.infer.target import MODEL_CONFIG, InferenceTarget
from tuner.loading.model import ModelLoadError, cannot_load, load_tokenizer
from tuner.rundir.layout import MERGED_DIR, SERVE_DIR
from tuner.rundir.manifest import amend, check_owned
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
    or a folder holding anything but links (removing one loses no bytes) and the chat template its manifest proves
    tuner wrote (a file of that name with other bytes is the user's)."""
    try:
        check_destination(folder)
        check_owned(folder, kept=lambda entry, owned: entry.is_symlink())
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

    path = atomic_write_text(folder / CHAT_TEMPLATE_FILE, chat_template_for(tokenizer, data_format))
    amend(folder, written=[CHAT_TEMPLATE_FILE])  # proved tuner's by its bytes, as every file tuner writes
    return path


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
    ``serve`` extra names (pyproject.toml): tuner's server reaches into ``transformers serve`` (its settings, its
    model manager and app, wrapped by tuner's limits), which changes between releases (:func:`transformers_server`)."""
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


MODEL_PROCESS_RELEASE = "5.25"  # transformers' server from here on loads the model in a process of its own


def prepare_model(model, processor, request_timeout_s: float) -> tuple[int | None, int]:
    """Run where the model is: give its generation config the time budget every request's ``generate`` inherits,
    and return its context and vocabulary size (for :class:`~tuner.infer.request_limits.Limits`)."""
    from tuner.infer.generate import model_context

    tokenizer = getattr(processor, "tokenizer", processor)
    model.generation_config.max_time = float(request_timeout_s)
    vocab = getattr(model.config.get_text_config(), "vocab_size", None) or len(tokenizer)
    return model_context(model, tokenizer), vocab


def model_placement(model, processor, context: int, facts):
    """Run where the model is: the placement report of the served model at batch 1 (see :func:`placement_of`)."""
    from tuner.infer.placement import placement_of

    return placement_of(model, 1, context, facts=facts)


def model_dtype(model, processor) -> str:
    """Run where the model is: the dtype its weights were loaded in, e.g. ``torch.float32``."""
    return str(model.dtype)


def transformers_server(installed: str | None, **options):
    """transformers' server for the ``installed`` release, loaded, not yet listening, as one interface: its
    ``tokenizer``, ``in_model(function, *args)`` (``function(model, processor, *args)`` run where the model is),
    ``server`` (uvicorn's, whose ``config.app`` is the FastAPI app) and ``close()``.  Before
    :data:`MODEL_PROCESS_RELEASE` the model is in this process; from it, in the process transformers starts for it."""
    from packaging.version import Version

    if installed is not None and Version(installed).release >= Version(MODEL_PROCESS_RELEASE).release:
        return _ModelProcessServer(**options)
    return _in_process_server(**options)


def _in_process_server(**options):
    """transformers 5.24: ``Serve`` loads the model here and builds uvicorn's server; ``non_blocking`` would start
    it in a thread, here it runs in the main thread, where uvicorn handles the signals."""
    from transformers.cli.serve import Serve

    class InProcess(Serve):
        def start_server(self) -> None:
            pass

        @property
        def tokenizer(self):
            processor = self._loaded()[1]
            return getattr(processor, "tokenizer", processor)

        def _loaded(self):
            manager = self._model_manager  # the force_model it preloaded, from its cache: (model, processor)
            return manager.load_model_and_processor(manager.process_model_name(manager.force_model))

        def in_model(self, function, *args):
            return function(*self._loaded(), *args)

        def close(self) -> None:
            self._generation_state.shutdown()
            self._model_manager.shutdown()

    return InProcess(**options, non_blocking=True)


class _ModelProcessServer:
    """transformers 5.25: ``Serve`` serves as it is built, so only its settings are taken from it (``run`` does
    nothing); the model manager starts the model's process and waits for the model, and the app holds the route
    tuner serves (chat completions, with ``/v1/models`` and ``/health``) the way ``Serve.run`` builds it.  Only those
    routes pass :class:`~tuner.infer.request_limits.RequestLimits`, so the other handlers are not built."""

    def __init__(self, **options):
        import uvicorn
        from transformers.cli.serve import Serve
        from transformers.cli.serving.chat_completion import ChatCompletionHandler
        from transformers.cli.serving.model_manager import ModelManager
        from transformers.cli.serving.server import build_server

        class Settings(Serve):
            def run(self, socket=None, engine_connection=None) -> None:
                pass

        settings = Settings(**options)
        try:
            self._manager = ModelManager(settings.loader, settings.generation_state, force_model=settings.force_model)
        except RuntimeError as exc:  # the model's process could not load it (its log says why)
            raise ValueError(str(exc)) from None
        self._engine = self._manager.get_engine(None)
        self.tokenizer = getattr(self._engine.processor, "tokenizer", self._engine.processor)
        chat = ChatCompletionHandler(model_manager=self._manager, generation_state=settings.generation_state,
                                     chat_template_kwargs=settings.chat_template_kwargs)
        app = build_server(self._manager, chat, None, None, None, None)

        async def stop_if_the_model_died() -> None:
            if self._manager.is_dead:
                self.server.should_exit = True

        self.server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                                    callback_notify=stop_if_the_model_died, timeout_notify=5))

    def in_model(self, function, *args):
        import asyncio

        return asyncio.run(self._engine.submit(function, *args))

    def close(self) -> None:
        self._manager.shutdown()


class Server:
    """transformers' OpenAI-compatible server for one folder: the model is loaded when this is built, and the
    server listens from :meth:`run` until Ctrl-C or SIGTERM (uvicorn's own graceful shutdown, cut to
    :data:`SHUTDOWN_S`).  Bounded by the library's own means: each request's ``generate`` stops after
    ``request_timeout_s`` (``max_time``), tuner's :class:`~tuner.infer.request_limits.RequestLimits` checks every
    request in front of it (and caps those served at once), and its protocol
    (:mod:`tuner.infer.connection_limits`) closes a connection whose first request's headers are late."""

    def __init__(self, served: ServingFolder, host: str, port: int, bits: int | None = None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S):
        import torch

        from tuner.catalog.model_classes import installed_transformers_version
        from tuner.infer.load import inference_dtype

        recipe = served.target.recipe
        # transformers' server puts the model on a GPU when there is one, else on the CPU
        dtype, self.dtype_note = inference_dtype(served.target, on_gpu=torch.cuda.is_available())
        try:
            self._serve = transformers_server(
                installed_transformers_version(), force_model=served.model_name, host=host, port=port, dtype=dtype,
                quantization={4: "bnb-4bit", 8: "bnb-8bit"}.get(bits), trust_remote_code=recipe.model.trust_remote_code,
                log_level="warning")
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"transformers serve cannot load {served.model_name}: {exc}") from None
        self.served = served
        self.url = f"http://{host}:{port}/v1"
        self.limits = self._bound(recipe.inference.max_new_tokens, request_timeout_s)

    def _bound(self, default_max_tokens: int, request_timeout_s: float):
        from tuner.data.chat_template import chat_ids
        from tuner.infer.connection_limits import BoundedH11Protocol
        from tuner.infer.request_limits import Limits, RequestLimits, message_text

        tokenizer = self._serve.tokenizer
        context, vocab_size = self._serve.in_model(prepare_model, float(request_timeout_s))

        def count_tokens(messages: list[dict], tools) -> int:  # the server renders the same, once this returned
            plain = [{"role": message["role"], "content": message_text(message)} for message in messages]
            return len(chat_ids(tokenizer, plain, add_generation_prompt=True, tools=tools))

        limits = Limits(context, default_max_tokens, vocab_size, count_tokens, float(request_timeout_s),
                        self._image_bound())
        config = self._serve.server.config
        config.app = RequestLimits(config.app, limits)
        config.http = BoundedH11Protocol
        config.limit_concurrency = None  # it counted idle sockets; RequestLimits counts requests
        config.timeout_graceful_shutdown = SHUTDOWN_S
        return limits

    def _image_bound(self) -> int | None:
        """data.max_image_pixels for an image-text model (its image_url parts are checked against it); None for a
        causal LM, which is sent text only."""
        import json

        from tuner.loading.model import is_image_text

        config = json.loads((self.served.path / MODEL_CONFIG).read_text())
        return self.served.target.recipe.data.max_image_pixels if is_image_text(config) else None

    def placement(self, context: int, facts=None):
        """Where the served model's weights are and the KV cache of one ``context``-token conversation."""
        return self._serve.in_model(model_placement, context, facts)

    def dtype(self) -> str:
        return self._serve.in_model(model_dtype)

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
