"""How fast the wizard answers: first screen painted, and the plan refresh after a change.

    python benchmarks/tui_startup.py            # prints the numbers; exit code 1 when over budget
    python benchmarks/tui_startup.py --tmux     # also: the wizard in a real terminal (tmux), five times: its
                                                # first frame's CPU and wall time, and when the pane shows it
    python benchmarks/tui_startup.py --steps    # also: every step switch of a demo recipe, and the longest the
                                                # event loop stalls while the Data step's preview is loading

Budget (issues 13, 31 and 49): first screen painted in under 0.5 s of CPU; plan refresh after a change under
16 ms (one frame at 60 Hz) on an idle machine; New recipe opens the Model step in under 0.5 s once the Start screen
has been shown for 2 s (the wizard prepares the step meanwhile).  The first paint is the first frame of the whole Start screen
(the app's own display call, once the highlighted entry is described: the last thing to appear), counted from
the interpreter's start of this script.  The refresh
is what a keypress costs: apply the change to the draft, validate, plan, re-check every choice on the
Method screen for refusals and repaint the fields.  ``--steps`` (issue 49 item 11): each step switch, from
``switch_mode`` until the step is mounted and painted, in a fresh process (the first Data visit loads the preview's
libraries); and a heartbeat every 5 ms on the event loop from the Data step's first paint until its example is
shown, then while another is pending through the switches to Training and Review: its longest gap is the longest the
UI could not answer a key (budget 100 ms), printed with the CPU the UI's process (all its threads) used in it.  CPU time is printed beside wall time: on a shared,
loaded machine wall time mostly measures the queue for a core, so the load average is printed too.
"""
from __future__ import annotations

import time

STARTED = time.perf_counter()
STARTED_CPU = time.process_time()  # CPU time too: on a shared, loaded machine wall time mostly measures the queue

import asyncio  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

FIRST_PAINT_BUDGET_S = 0.5
NEW_RECIPE_BUDGET_S = 0.5  # Enter on New recipe until the Model step's list is shown, after READING_S on Start
READING_S = 2.0
REFRESH_BUDGET_MS = 16.0
STALL_BUDGET_MS = 100.0  # the longest the event loop may block (a key unanswered) while a step's heavy work runs
HEARTBEAT_S = 0.005
CHANGES = [
    {"memory.gradient_checkpointing": True},
    {"memory.gradient_checkpointing": False},
    {"method.kind": "lora", "method.quantization": None},
    {"training.micro_batch_size": 8},
    {"memory.distributed": "deepspeed", "memory.zero_stage": 2},
    {"memory.offload_optimizer": "cpu"},
    {"memory.offload_optimizer": "none"},
    {"memory.distributed": "none", "memory.zero_stage": None},
    {"method.kind": "full", "method.quantization": None},
    {"training.micro_batch_size": 1},
]


def measured_app(results: dict[str, float], leave: bool = False):
    """The wizard, noting in ``results`` when its whole Start screen is first displayed (``leave``: quit soon after)."""
    from tuner.tui.app import TunerApp
    from tuner.tui.screens.start import StartScreen

    class Measured(TunerApp):
        CSS_PATH = str(Path(sys.modules[TunerApp.__module__].__file__).with_name(TunerApp.CSS_PATH))

        def _display(self, screen, renderable) -> None:
            super()._display(screen, renderable)
            # the Start screen whole: its list focused and the highlighted entry described (the last to appear)
            if (renderable is not None and isinstance(screen, StartScreen) and "first_paint_s" not in results
                    and str(screen.query_one("#about").render()).strip()):
                results["first_paint_s"] = time.perf_counter() - STARTED
                results["first_paint_cpu_s"] = time.process_time() - STARTED_CPU
                if leave:
                    self.set_timer(3.0, self.exit)  # on the pane long enough to be seen there

    return Measured(detect_hardware=False)


async def measure() -> dict[str, float]:
    from tuner.tui.app import TunerApp  # noqa: F401  (timed on its own)
    from tuner.tui.messages import FieldEdited

    imported = time.perf_counter() - STARTED
    results: dict[str, float] = {"import_s": imported, "import_cpu_s": time.process_time() - STARTED_CPU}
    app = measured_app(results)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        await asyncio.sleep(READING_S)  # a person reads the Start screen
        start, start_cpu = time.perf_counter(), time.process_time()
        await pilot.press("enter")  # New recipe
        listing = app.screen.query_one("#model-list") if app.current_mode == "model" else None
        while listing is None or not listing.option_count:
            await pilot.pause(0.01)
            listing = app.screen.query_one("#model-list") if app.current_mode == "model" else None
        results["new_recipe_s"] = time.perf_counter() - start
        results["new_recipe_cpu_s"] = time.process_time() - start_cpu
        app.switch_mode("method")
        await pilot.pause()
        timings, cpu = [], []
        for _ in range(3):
            for change in CHANGES:
                start, start_cpu = time.perf_counter(), time.process_time()
                app.on_field_edited(FieldEdited(change))
                timings.append((time.perf_counter() - start) * 1000)
                cpu.append((time.process_time() - start_cpu) * 1000)
                await pilot.pause()
        results["refresh_median_ms"] = statistics.median(timings)
        results["refresh_max_ms"] = max(timings)
        results["refresh_cpu_median_ms"] = statistics.median(cpu)
    return results


async def measure_steps() -> dict[str, float]:
    """Each step switch of the demo recipe (ms until mounted and painted), and the event loop's longest gap while
    the Data step's preview loads and through the switch to Training that follows."""
    from textual.widgets import Static

    from tuner.recipe.io import parse_yaml, read_recipe_text
    from tuner.recipe.registry import builtin_path
    from tuner.tui.app import TunerApp
    from tuner.tui.draft import Draft

    app = TunerApp(draft=Draft(parse_yaml(read_recipe_text(builtin_path("demo")))[0]), detect_hardware=False)
    results: dict[str, float] = {}
    gaps: list[float] = []
    beating = asyncio.Event()

    async def heartbeat() -> None:
        loop = asyncio.get_running_loop()
        last, last_cpu = loop.time(), time.process_time()
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            now, cpu = loop.time(), time.process_time()
            if beating.is_set():  # (wall, CPU of this process, all its threads) between two beats
                gaps.append((now - last - HEARTBEAT_S, cpu - last_cpu))
            last, last_cpu = now, cpu

    def longest(gaps: list[tuple[float, float]]) -> tuple[float, float]:
        """The longest gap between beats (ms) and the CPU this process used in it (ms): on a loaded machine a
        long gap with little CPU is the queue for a core, not work on the UI's process."""
        wall, cpu = max(gaps, default=(0.0, 0.0))
        return wall * 1000, cpu * 1000

    async def switch(pilot, mode: str) -> None:
        start, start_cpu = time.perf_counter(), time.process_time()
        await app.switch_mode(mode)
        await pilot.pause()
        results[f"switch_{mode}_ms"] = (time.perf_counter() - start) * 1000
        results[f"cpu_{mode}_ms"] = (time.process_time() - start_cpu) * 1000

    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        beat = asyncio.ensure_future(heartbeat())
        for mode in ("model", "hardware", "method"):
            await switch(pilot, mode)
        await switch(pilot, "data")
        beating.set()  # from the Data step painted until its example is shown: the preview's cost to the UI
        started = time.perf_counter()
        while not str(app.screen.query_one("#preview-format", Static).render()).startswith("format"):
            if time.perf_counter() - started > 300:
                raise RuntimeError("the Data step's preview never came")
            await asyncio.sleep(0.05)
        results["preview_s"] = time.perf_counter() - started
        results["stall_preview_ms"], results["stall_preview_cpu_ms"] = longest(gaps)
        gaps.clear()
        app.screen.preview_key = None  # a new question (as an edit of the data asks): a preview pending again
        app.screen.sync()
        await pilot.pause()
        await switch(pilot, "training")
        await switch(pilot, "review")
        results["stall_switch_ms"], results["stall_switch_cpu_ms"] = longest(gaps)
        beat.cancel()
    return results


def in_tmux(times: int = 5) -> list[dict[str, float]]:
    """This script's ``--in-terminal`` run in a 120x36 tmux pane, ``times`` times: CPU and wall time from the
    interpreter's start to the whole Start screen's first frame written to a real terminal, and the wall time from
    starting the pane until tmux shows it."""
    import json
    import shutil
    import subprocess
    import tempfile
    import uuid

    if shutil.which("tmux") is None:
        return []
    runs = []
    for _ in range(times):
        tmux = ["tmux", "-L", f"tuner-bench-{uuid.uuid4().hex[:8]}"]
        with tempfile.TemporaryDirectory() as cwd:
            out = Path(cwd) / "paint.json"
            started = time.perf_counter()
            subprocess.run([*tmux, "new-session", "-d", "-x", "120", "-y", "36", "-c", cwd,
                            f"env -u COLUMNS -u LINES TERM=xterm-256color {sys.executable} {__file__} "
                            f"--in-terminal {out}; sleep 30"], check=True)
            try:
                while "Built-in recipe: demo" not in subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True,
                                                                     text=True).stdout:
                    if time.perf_counter() - started > 60:
                        raise RuntimeError("the Start screen never showed")
                    time.sleep(0.01)
                shown = time.perf_counter() - started
                while not out.exists():
                    time.sleep(0.01)
                runs.append({**json.loads(out.read_text()), "pane_s": shown})
            finally:
                subprocess.run([*tmux, "kill-server"], capture_output=True)
    return runs


def main() -> int:
    if "--in-terminal" in sys.argv:  # run by in_tmux: the real app in a real terminal, until its first frame
        import json

        results: dict[str, float] = {}
        measured_app(results, leave=True).run()
        out = Path(sys.argv[sys.argv.index("--in-terminal") + 1])
        out.with_suffix(".tmp").write_text(json.dumps(results))
        os.replace(out.with_suffix(".tmp"), out)  # whole, or not there yet
        return 0
    load_before = os.getloadavg()
    results = asyncio.run(measure())
    print(f"load average before: {' '.join(f'{load:.2f}' for load in load_before)} on {os.cpu_count()} cores")
    print(f"import tuner.tui.app:        {results['import_s'] * 1000:7.0f} ms, "
          f"{results['import_cpu_s'] * 1000:.0f} ms of CPU")
    print(f"first screen painted:        {results['first_paint_s'] * 1000:7.0f} ms   "
          f"(budget {FIRST_PAINT_BUDGET_S * 1000:.0f} ms), {results['first_paint_cpu_s'] * 1000:.0f} ms of CPU")
    print(f"new recipe -> Model step:    {results['new_recipe_s'] * 1000:7.0f} ms   "
          f"(budget {NEW_RECIPE_BUDGET_S * 1000:.0f} ms, after {READING_S:.0f} s on Start), "
          f"{results['new_recipe_cpu_s'] * 1000:.0f} ms of CPU in the UI's process")
    print(f"plan refresh after a change: {results['refresh_median_ms']:7.1f} ms median, "
          f"{results['refresh_max_ms']:.1f} ms max   (budget {REFRESH_BUDGET_MS:.0f} ms), "
          f"{results['refresh_cpu_median_ms']:.1f} ms of CPU (median)")
    if "--steps" in sys.argv:
        steps = asyncio.run(measure_steps())
        print("step switches, ms (of CPU): " + ", ".join(
            f"{name[7:-3]} {value:.0f} ({steps[f'cpu_{name[7:]}']:.0f})" for name, value in steps.items()
            if name.startswith("switch_")))
        print(f"data preview shown after:    {steps['preview_s'] * 1000:7.0f} ms")
        print(f"longest event-loop stall:    {steps['stall_preview_ms']:7.0f} ms while the preview loaded "
              f"({steps['stall_preview_cpu_ms']:.0f} ms of the UI process's CPU in it), "
              f"{steps['stall_switch_ms']:.0f} ms while one was pending and the step switched to Training and Review "
              f"({steps['stall_switch_cpu_ms']:.0f} ms of CPU)   (budget {STALL_BUDGET_MS:.0f} ms)")
        results.update(steps)
    if "--tmux" in sys.argv:
        for run in in_tmux():
            print(f"in tmux: first frame {run['first_paint_s'] * 1000:.0f} ms, {run['first_paint_cpu_s'] * 1000:.0f} "
                  f"ms of CPU; on the pane {run['pane_s'] * 1000:.0f} ms after the pane was started")
    print(f"load average after: {' '.join(f'{load:.2f}' for load in os.getloadavg())} on {os.cpu_count()} cores")
    ok = (results["first_paint_cpu_s"] < FIRST_PAINT_BUDGET_S and results["refresh_cpu_median_ms"] < REFRESH_BUDGET_MS
          and results["new_recipe_s"] < NEW_RECIPE_BUDGET_S
          and max(results.get("stall_preview_cpu_ms", 0.0), results.get("stall_switch_cpu_ms", 0.0)) < STALL_BUDGET_MS)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
