"""One run contract: every front door (``tuner run``, ``tuner demo``, the wizard) prepares, launches, follows and
reports a run through the two functions here, and nothing else launches training, so the rules cannot drift apart.

``prepare_run`` makes every check first — the memory plan, the output disk, the data, resume compatibility, the run
directory and its lock — and only then writes the run directory.  A refusal the user may override (a plan that does
not fit, a small disk, an existing directory) is a :class:`RunRefused`; the front door offers the override
(``--force``, or "Launch anyway" in the wizard).  ``follow_run`` launches the one-machine command, follows the event
stream, stops every rank on Ctrl-C, SIGTERM or SIGHUP (or when the wizard asks), explains a failure and ends with
the run's summary; a multi-machine run is never launched as one machine's share.
"""
from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from tuner.doctor.libraries import require_trackers
from tuner.fileio import DestinationRefused
from tuner.launch.failures import explain_failure, raised_at, rank_errors
from tuner.launch.runner import Launch, log_tail
from tuner.loading.hub_download import HubDownload, plan_download
from tuner.planner.items import MemoryPlan
from tuner.recipe.io import validate_recipe, with_output_dir
from tuner.recipe.schema import STREAM_SHUFFLE_BUFFER, Recipe
from tuner.recipe.source import RecipeError
from tuner.render.launch_command import launch_argv, shell_command
from tuner.render.launch_script import has_slurm_script, node_commands
from tuner.render.run_directory import (
    check_run_directory,
    earlier_run_outputs,
    holds_only_rendered_files,
    move_earlier_run_aside,
    write_run_directory,
)
from tuner.rundir.checkpoints import (CheckpointRefused, check_resumable, checkpoint_states, incomplete_reason,
                                      latest_complete_checkpoint, resume_checkpoint)
from tuner.rundir.events import BAD_INPUT, Error, Event, read_events
from tuner.rundir.layout import (CHECKPOINTS_DIR, ELASTIC_LOG_DIR, EVENTS_FILE, LAUNCH_SCRIPT, LOCK_FILE, MERGED_DIR,
                                 MODEL_SNAPSHOT, PREVIOUS_RUNS_DIR, SLURM_SCRIPT)
from tuner.rundir.lock import RunLock, RunLocked
from tuner.rundir.manifest import amend, check_owned
from tuner.rundir.summary import RunSummary, summarize_run

EXIT_SIGNAL_BASE = 128  # a run stopped by signal N exits 128 + N, as a shell reports it
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # beside SIGINT (KeyboardInterrupt): each stops every rank
POLL_S = 0.25
STOP_GRACE_S = 20.0  # after SIGINT, the time ranks get to save before SIGTERM


class RunRefused(RecipeError):
    """A check refused the launch; the front door's explicit override launches anyway."""


class RunInterrupted(BaseException):
    """SIGTERM or SIGHUP arrived while a run was followed (raised like KeyboardInterrupt is for SIGINT)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@dataclass
class PreparedRun:
    """A checked recipe whose run directory is written; ``lock`` is held until the run is followed to its end."""

    recipe: Recipe
    run_dir: Path
    machine_commands: list[str]  # the command each machine runs, in rank order
    notes: list[str] = field(default_factory=list)  # say these before launching (tight plan, resume point, overrides)
    lock: RunLock | None = None

    @property
    def launchable(self) -> bool:
        """A one-machine run; a multi-machine run starts on every machine (see :meth:`machine_lines`)."""
        return len(self.machine_commands) == 1

    @property
    def command(self) -> str:
        return shell_command(launch_argv(self.run_dir))

    def machine_lines(self) -> list[str]:
        count = len(self.machine_commands)
        lines = [f"{self.run_dir}: a run on {count} machines starts on each of them; run on machine N "
                 f"`{self.run_dir / LAUNCH_SCRIPT} N`"
                 + (f", or submit `sbatch {self.run_dir / SLURM_SCRIPT}` on a Slurm cluster:" if has_slurm_script(self.recipe) else ":")]
        return lines + [f"  machine {rank}: {command}" for rank, command in enumerate(self.machine_commands)]

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


@dataclass
class RunOutcome:
    run_dir: Path
    exit_code: int
    status: str  # finished, failed, stopped
    lines: list[str]  # what to tell the user: the summary, the failure, or where it stopped and how to continue
    summary: RunSummary | None = None
    last_checkpoint: Path | None = None


def _memory_check(recipe: Recipe) -> tuple[MemoryPlan, list[str], str | None]:
    """(the plan, its refusal lines, or [] when it fits; a note for a tight plan)."""
    from tuner.catalog.hub import HubError
    from tuner.catalog.model_config import UnknownModelError
    from tuner.planner import advise, plan

    try:
        memory = plan(recipe)
    except HubError:  # the hub was asked and could not answer (exit 1), not a recipe error
        raise
    except UnknownModelError as exc:
        raise RecipeError([f"{exc.field}: {exc}"]) from None
    device = memory.limiting  # the device that decides the verdict: a GPU, the CPU, or a machine's host RAM
    usage = f"{device.total_gib:.1f} GiB of {device.capacity_gib or 0:.1f} GiB, {device.phase}"
    if memory.verdict == "tight":
        return memory, [], f"note: the plan is tight on {device.name} ({usage}); an out-of-memory stop is possible."
    if memory.verdict != "does not fit":
        return memory, [], None
    where = f"each {device.name}" if device.kind == "gpu" else device.name
    lines = [f"predicted not to fit: {memory.missing_gib:.1f} GiB missing on {where} (needs {usage})."]
    advice = advise(recipe)
    if advice and advice[0].fits:
        lines.append(f"cheapest fix: {advice[0].summary()}")
        lines += [f"  - {reason}" for reason in advice[0].reasons]
        lines.append("every option: `tuner plan RECIPE --advise`.")
    elif advice:
        lines += [f"  - {reason}" for reason in advice[0].reasons]
    return memory, lines, None


def _disk_check(recipe: Recipe, memory: MemoryPlan, download: HubDownload | None) -> list[str]:
    """A full or read-only disk found now, not at the first checkpoint hours in; a download that cannot fit is
    refused before its first byte."""
    from tuner.free_space import disk_room

    disk = disk_room(recipe, memory, download)
    return [f"output.dir: {disk.detail}.", f"{disk.fix}."] if disk.status == "fail" else []


def _check_data(recipe: Recipe) -> str:
    """Every data problem (columns, rows, encodings, sizes) as a DataError naming the file and line, before launch;
    returns the note saying how many samples the run trains on.  Quietly: datasets' progress bars would bury the
    refusals printed after them."""
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    from tuner.data.prepare import check_data

    shown = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        data = check_data(recipe)
    finally:
        if shown:
            enable_progress_bar()
    _check_image_model(recipe, data.data_format)
    if data.streamed:
        return (f"data: {data.train} {data.data_format} samples, streamed (read and tokenised as training goes, "
                f"shuffled within {STREAM_SHUFFLE_BUFFER:,}; nothing prepared or cached)")
    held_out = f", {data.held_out} held out for evaluation" if data.held_out else ""
    return f"data: {data.train} {data.data_format} samples to train on{held_out}"


def _check_image_model(recipe: Recipe, data_format: str) -> None:
    """Image-text data needs a model transformers builds as image-text (its config, read without building it), and
    a model folder here whose processor loads: what it lacks (a file, a library) said once now, not by every rank
    after launch.  A hub model's processor is checked where it is downloaded; a built-in's is tuner's own."""
    from tuner.catalog.demo import is_builtin
    from tuner.catalog.model_config import UnknownModelError
    from tuner.catalog.model_classes import IMAGE_TEXT, auto_class_for
    from tuner.catalog.models import model_config
    from tuner.data.images import is_image_format
    from tuner.data.sources import DataError
    from tuner.fileio import user_path
    from tuner.loading.model import load_processor

    if not is_image_format(data_format):
        return
    try:
        config = model_config(recipe.model.id, recipe.model.revision, recipe.model.trust_remote_code)
    except UnknownModelError:
        return  # transformers meets the model's own checks at load
    if auto_class_for(config) != IMAGE_TEXT:
        raise DataError(f"data.format: {data_format} is image-text data, and {recipe.model.id} "
                        f"({config.get('model_type')}) is a text-only model; give model.id an image-text model (one "
                        "AutoModelForImageTextToText builds, e.g. builtin:demo-vlm), or use text data.")
    if not is_builtin(recipe.model.id) and user_path(recipe.model.id).is_dir():
        load_processor(recipe)


def _resume_notes(recipe: Recipe, run_dir: Path, verify: bool = False) -> list[str]:
    """Which checkpoint the ranks will resume from and why newer ones are skipped; refuses an incompatible one.
    ``verify`` reads every byte of that checkpoint, here once: the ranks repeat only the cheap checks, so one whose
    bytes are damaged is refused rather than skipped (they would pick it)."""
    resume = recipe.training.resume
    if resume == "never":
        return []
    if resume != "auto":  # a checkpoint named explicitly: damaged or incompatible, it is refused now, not by a rank
        return [f"resuming from {resume_checkpoint(recipe, run_dir, recipe.world_size, verify)}"]
    notes = []
    for checkpoint, problem in checkpoint_states(run_dir / CHECKPOINTS_DIR):
        if problem is None:
            damaged = incomplete_reason(checkpoint, verify=True) if verify else None
            if damaged:
                raise RecipeError([f"--verify: {checkpoint}: {damaged}. Move it out of {run_dir / CHECKPOINTS_DIR} "
                                   "to resume from the one before, or name one with --set training.resume=PATH."])
            check_resumable(recipe, checkpoint, recipe.world_size)
            return notes + [f"resuming from {checkpoint}" + (" (verified: every byte read)" if verify else "")]
        notes.append(f"skipping {checkpoint}: {problem}")
    return notes + [f"no complete checkpoint in {run_dir / CHECKPOINTS_DIR}: starting from the beginning"]


def _say_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prepare_run(recipe: Recipe, *, force: bool = False, resume: bool = False, verify: bool = False,
                dry_run: bool = False, output_dir: str | Path | None = None,
                say: Callable[[str], None] = _say_on_stderr, progress: bool = True) -> PreparedRun:
    """Check everything, then write the run directory (and hold its lock unless ``dry_run``); a hub model is
    downloaded once, here, before any rank starts (``say`` the line, and with ``progress`` a bar on stderr).

    ``force`` is the user's explicit override of the plan, disk and existing-directory refusals: a new run in the
    directory of an earlier one first moves the earlier run's outputs (checkpoints, events, log, final model ...) into
    ``previous/N/``, so the new run neither deletes them (the Trainer's checkpoint rotation would) nor mixes with them
    (events, a later resume).  ``resume`` continues from the newest complete checkpoint; ``verify`` first reads
    every byte of it (recorded SHA-256, zip CRCs).  Raises RecipeError/DataError
    for what cannot be overridden, HubError when the hub refuses the model, and :class:`RunRefused` (all overridable
    refusals at once) for the rest; nothing is written before.
    """
    if resume and recipe.training.resume == "never":
        data = recipe.model_dump(mode="json")
        data["training"]["resume"] = "auto"
        recipe = validate_recipe(data)
    if output_dir is not None:
        recipe = with_output_dir(recipe, output_dir)
    run_dir = Path(recipe.output.dir)
    resuming = recipe.training.resume != "never"
    if run_dir.exists() and not run_dir.is_dir():
        raise RecipeError([f"output.dir: {run_dir} is a file, not a directory; choose another output.dir."])
    check_run_directory(run_dir)  # in every mode: files tuner did not write are never replaced, links never followed
    if resuming and (run_dir / MERGED_DIR).is_dir():  # a resumed LoRA run saving merged replaces it at its end
        try:
            check_owned(run_dir / MERGED_DIR)
        except DestinationRefused as exc:
            raise RecipeError([str(exc)]) from None
    memory, refusals, tight = _memory_check(recipe)
    model = recipe.model  # a hub model's commit and files, asked now: a gated or missing model stops here
    download = plan_download(model.id, _recorded_commit(run_dir, model.id) if resuming else model.revision,
                             model.trust_remote_code)
    refusals += _disk_check(recipe, memory, download)
    # what `tuner run --dry-run` left (rendered files, no run yet) is replaced without asking
    dry_run_left = holds_only_rendered_files(run_dir)
    if run_dir.is_dir() and any(run_dir.iterdir()) and not (resuming or dry_run_left):
        refusals.append(f"{run_dir}: the run directory already exists; overriding starts a new run there and moves "
                        f"the earlier run's checkpoints, events and log into {run_dir / PREVIOUS_RUNS_DIR}/N/ (resume "
                        "continues it instead, or change output.dir).")
    try:
        notes = _resume_notes(recipe, run_dir, verify) if resuming else []
    except CheckpointRefused as exc:
        raise RecipeError(exc.lines) from None
    require_trackers(recipe)  # a tracker training.report_to names must be installed: said now, not by every rank
    data_note = _check_data(recipe)
    if refusals and not force:
        raise RunRefused(refusals)
    notes = [data_note] + ([tight] if tight else []) + [f"launching anyway: {line}" for line in refusals] + notes
    if download is not None and dry_run:
        notes.append(f"on launch: {download.describe()}")
    lock = RunLock(run_dir)
    try:
        lock.acquire()
        if not (resuming or dry_run or dry_run_left) and earlier_run_outputs(run_dir):  # a probe's folder: replaced
            notes.append(f"the earlier run in {run_dir} was moved to {move_earlier_run_aside(run_dir)}")
        write_run_directory(recipe, force=force or dry_run_left, keep_existing=resuming)
        if download is not None and not dry_run:
            _download_for_run(download, run_dir, recipe.hardware.machines, say, progress)
            amend(run_dir, written=[MODEL_SNAPSHOT])
        elif (run_dir / MODEL_SNAPSHOT).exists():  # the ranks load what model.id names; a record of another model
            (run_dir / MODEL_SNAPSHOT).unlink()   # must not redirect them (tuner's own: check_run_directory proved it)
            amend(run_dir, removed=[MODEL_SNAPSHOT])
    except RunLocked as exc:
        raise RecipeError([str(exc)]) from None
    except BaseException:
        lock.release()
        raise
    prepared = PreparedRun(recipe, run_dir, node_commands(recipe, run_dir), notes, lock)
    if dry_run or not prepared.launchable:
        prepared.release()  # nothing launches from this process
    return prepared


def _recorded_commit(run_dir: Path, model_id: str) -> str | None:
    """The commit a resumed run trained on so far, so it continues on the same weights even if the hub moved on."""
    try:
        recorded = json.loads((run_dir / MODEL_SNAPSHOT).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("commit"), str):
        return None  # damaged: resolved afresh
    return recorded["commit"] if recorded.get("model_id") == model_id else None


def _download_for_run(download: HubDownload, run_dir: Path, machines: int, say, progress: bool) -> None:
    """On one machine the model is downloaded now; on several, each machine's launch.sh downloads that commit before
    its rendezvous.  The run directory records which commit and files every rank loads."""
    from tuner.fileio import atomic_write_text
    from tuner.loading.hub_download import download as fetch

    if machines == 1:
        say(download.describe())
        fetch(download, progress=progress)
    else:
        say(f"model: {download.model_id} (commit {download.commit[:12]}) is downloaded on each machine by its "
            f"launch.sh before the rendezvous (once, when the machines share a Hugging Face cache)")
    atomic_write_text(run_dir / MODEL_SNAPSHOT, download.to_json())


@contextlib.contextmanager
def signals_stop_the_run() -> Iterator[None]:
    """In the main thread, SIGTERM and SIGHUP raise :class:`RunInterrupted` while a run is followed, and SIGINT
    raises KeyboardInterrupt; the ranks run in their own session, so tuner must stop them itself.

    SIGINT's handler is set here, not inherited: a process started with SIGINT ignored (a background job of a
    non-interactive shell, a worker of a parallel test runner) gets no KeyboardInterrupt from Python, and such a
    tuner would ignore Ctrl-C and never stop its ranks; a stop signal blocked by the parent is unblocked likewise."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise RunInterrupted(signum)

    handlers = {signal.SIGINT: signal.default_int_handler, **{sig: interrupt for sig in STOP_SIGNALS}}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, handlers)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def follow_run(prepared: PreparedRun, *, on_update: Callable[[list[Event], list[str]], None] | None = None,
               stop: threading.Event | None = None, say: Callable[[str], None] = _say_on_stderr,
               stop_grace_s: float = STOP_GRACE_S) -> RunOutcome:
    """Launch the run and follow it to its end; ``on_update(events, log_lines)`` gets what arrives.

    Ctrl-C, SIGTERM, SIGHUP (main thread) or ``stop.set()`` (another thread) stop every rank (SIGINT, then harder
    after ``stop_grace_s``, the time ranks get to save) and the outcome names the last complete checkpoint.  The run
    directory's lock is released at the end.
    """
    if not prepared.launchable:
        prepared.release()
        raise RecipeError(prepared.machine_lines())
    run_dir = prepared.run_dir
    since, start = time.time(), time.monotonic()
    stopped_by: str | None = None
    signum = signal.SIGINT
    launch: Launch | None = None
    try:
        with signals_stop_the_run():
            try:
                launch = Launch(launch_argv(run_dir), run_dir)  # its --log_dir keeps each rank's error file here
                while (code := launch.wait(POLL_S)) is None:
                    _deliver(launch, on_update)
                    if stop is not None and stop.is_set():
                        stopped_by = "stopped on request"
                        break
            except KeyboardInterrupt:
                stopped_by = "interrupted (Ctrl-C)"
            except RunInterrupted as exc:
                signum = exc.signum
                stopped_by = f"stopped by {signal.Signals(signum).name}"
            if launch is None:  # interrupted before the process started
                raise KeyboardInterrupt
            if stopped_by:
                say("stopping every rank ...")
                code = _stop(launch, stop_grace_s)
            launch.finish()
            _deliver(launch, on_update)
    finally:
        prepared.release()
    wall_s = time.monotonic() - start
    if stopped_by:
        return _stopped(prepared, EXIT_SIGNAL_BASE + signum, stopped_by)
    if code != 0:
        lines = _explain(run_dir, since, log_tail(launch.log_path), code) + [f"full log: {launch.log_path}"]
        return RunOutcome(run_dir, _failed_code(run_dir, since, code), "failed", lines + _log_problem(launch))
    summary = summarize_run(run_dir, since=since, wall_s=wall_s)
    lines = summary.lines() if summary else [f"finished; see {run_dir}"]
    return RunOutcome(run_dir, 0, "finished", lines + _log_problem(launch), summary)


def _log_problem(launch: Launch) -> list[str]:
    return [launch.log_problem] if launch.log_problem else []


def _explain(run_dir: Path, since: float, log: list[str], code: int) -> list[str]:
    """Why the launch failed: the ranks' error events of this launch and their elastic error files first."""
    errors = rank_errors(read_events(run_dir / EVENTS_FILE), since)
    return explain_failure(errors, raised_at(run_dir / ELASTIC_LOG_DIR, since), log, code)


def _failed_code(run_dir: Path, since: float, code: int) -> int:
    """The launch's exit code, but 2 when the first rank to speak blamed the input (its error event's kind), as
    that rank exited: the launcher reports every failed rank as 1."""
    errors = [event for event in read_events(run_dir / EVENTS_FILE)
              if isinstance(event, Error) and (event.time or 0) >= since]
    return 2 if errors and errors[0].error_kind == BAD_INPUT else code


def _deliver(launch: Launch, on_update) -> None:
    events, lines = launch.poll_events(), launch.new_lines()
    if on_update and (events or lines):
        on_update(events, lines)


def _stop(launch: Launch, grace_s: float) -> int:
    """Stop every rank; a second interrupt while they save skips the grace period."""
    try:
        return launch.stop(grace_s)
    except (KeyboardInterrupt, RunInterrupted):
        return launch.stop(grace_s=0)


def _stopped(prepared: PreparedRun, exit_code: int, how: str) -> RunOutcome:
    run_dir, lock = prepared.run_dir, prepared.run_dir / LOCK_FILE
    checkpoint = latest_complete_checkpoint(run_dir / CHECKPOINTS_DIR)
    if checkpoint is not None:
        lines = [f"{how}; last complete checkpoint: {checkpoint}.",
                 f"Continue with: tuner run {shlex.quote(str(lock))} --resume"]
    else:
        lines = [f"{how}; no complete checkpoint was saved (training.save_steps sets how often).",
                 f"Start again with: tuner run {shlex.quote(str(lock))} --force"]
    return RunOutcome(run_dir, exit_code, "stopped", lines, last_checkpoint=checkpoint)
