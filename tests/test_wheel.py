"""tuner as a user installs it: the sdist and the wheel built from this checkout (the wheel from the sdist, so the
sdist is complete), the wheel installed, not editable, into a fresh virtual environment, and every command run from
a folder outside the checkout with no source path anywhere.

The fresh environment takes its dependencies from this test's own (their folder on its path, without running that
folder's .pth files, so the checkout's editable finder is not there): what is tested is the wheel, not pip's
resolution of the same pins, which `make install` does already; installing torch and transformers again cost CI
minutes.

Every other Python version ``requires-python`` admits that this machine has (python3.X on PATH, or pyenv's) runs
the torch-free core — validate, plan, render, recipes, presets — from the same wheel (and `tuner`, `tuner demo`,
`tuner run` there end with one line naming what to install): a CPU torch wheel exists here
for Python 3.11 only, and PyPI's torch for Linux is a multi-GB CUDA build.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

PIP_QUIET = ["--quiet", "--no-compile", "--disable-pip-version-check"]  # bytecode is compiled on first import


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build``: the sdist, then the wheel built from the unpacked sdist; from a copy of the checkout's
    files (as a clean clone holds them), so building writes nothing into the checkout others test from."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def user_venv(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment (no system site packages) holding the built wheel, its dependencies read from this
    environment's site-packages as plain path entries."""
    import sysconfig

    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(site) / "dependencies-from-the-test-environment.pth").write_text("".join(f"{path}\n" for path in ours))
    installed = subprocess.run([str(python), "-m", "pip", "install", *PIP_QUIET, "--no-deps",
                                str(next(dist.glob("*.whl")))], capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv


def user_env(home: Path, venv: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "TUNER_HOME": str(home), "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}


@pytest.mark.slow
def test_the_wheel_holds_the_package_its_recipes_and_nothing_of_the_repository(dist):
    names = zipfile.ZipFile(next(dist.glob("*.whl"))).namelist()
    assert all(name.startswith(("tuner/", "tuner-")) for name in names), sorted(
        name for name in names if not name.startswith(("tuner/", "tuner-")))
    assert {"tuner/recipes/demo.yaml", "tuner/recipes/llama3.1/8b-lora.yaml", "tuner/catalog/models.json",
            "tuner/tui/app.tcss"} <= set(names)
    with tarfile.open(next(dist.glob("*.tar.gz"))) as sdist:
        tops = {Path(name).parts[1] for name in sdist.getnames() if len(Path(name).parts) > 1}
    assert "tuner" in tops and not tops & {"tests", "benchmarks", "docs", ".ci"}, tops


@pytest.mark.slow
def test_the_installed_wheel_plans_demos_and_trains_from_outside_the_checkout(user_venv, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = user_env(tmp_path / "home", user_venv)

    def tuner(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["tuner", *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    where = subprocess.run(["python", "-c", "import tuner; print(tuner.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(user_venv), where.stdout  # the installed copy, not this checkout

    version = tuner("--version")
    assert version.returncode == 0 and version.stdout.startswith("tuner "), version.stderr
    listed = tuner("recipes", "ls")
    assert listed.returncode == 0 and "demo-lora" in listed.stdout and "llama3.1/8b-lora" in listed.stdout
    planned = tuner("plan", "llama3.1/8b-lora")
    assert planned.returncode == 0 and "fits" in planned.stdout, planned.stdout + planned.stderr
    demo = tuner("demo")
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert "exact match" in demo.stdout
    trained = list((work / "runs").glob("demo-*/final/config.json"))  # by ranks that imported this tuner: no
    assert len(trained) == 1, sorted((work / "runs").rglob("*"))  # source path reaches them


# what validate, plan, render and recipes import (torch, transformers and the rest only load to train or infer)
CORE_DEPENDENCIES = ("pydantic", "PyYAML", "rich", "platformdirs", "psutil", "huggingface_hub")
OTHER_PYTHONS = ("3.12", "3.13")  # beside 3.11, which runs the whole suite


def interpreter(version: str) -> str | None:
    """pyenv's Python ``version``, else python3.X on PATH; only one that runs (a pyenv shim may not)."""
    candidates = [*map(str, sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))),
                  shutil.which(f"python{version}")]
    for python in filter(None, candidates):
        if subprocess.run([python, "-c", "pass"], capture_output=True, timeout=60).returncode == 0:
            return python
    return None


def test_the_python_floor_is_the_oldest_version_tested():
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    tested = [sys.version_info[:2], *(tuple(map(int, version.split("."))) for version in OTHER_PYTHONS)]
    assert requires == ">={}.{}".format(*min(tested)), requires


@pytest.mark.slow
@pytest.mark.parametrize("version", OTHER_PYTHONS)
def test_the_torch_free_core_runs_on_each_newer_python(version, dist, tmp_path):
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (python{version} on PATH or under ~/.pyenv/versions)")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    core = [spec for spec in declared if spec.split(">")[0].split("<")[0].split("=")[0].strip() in CORE_DEPENDENCIES]
    assert len(core) == len(CORE_DEPENDENCIES), core
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", *PIP_QUIET]
    for what in (core, ["--no-deps", str(next(dist.glob("*.whl")))]):
        installed = subprocess.run([*pip, *what], capture_output=True, text=True, timeout=900)
        assert installed.returncode == 0, installed.stderr[-3000:]
    env = user_env(tmp_path / "home", venv)
    for args in (["--version"], ["recipes", "ls"], ["validate", "demo"], ["plan", "llama3.1/8b-lora"],
                 ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "1xA100-80GB", "--method", "qlora"],
                 ["render", "llama3.1/8b-full-zero3", "-o", str(tmp_path / "rendered")],  # (recipes check builds
                 ["presets", "cp", str(tmp_path / "presets")]):  # each model with torch: not the core's)
        done = subprocess.run(["tuner", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"tuner {' '.join(args)} on Python {version}:\n{done.stdout[-1500:]}{done.stderr[-3000:]}"
    assert (tmp_path / "rendered" / "deepspeed.json").is_file() and (tmp_path / "presets" / "zero3.json").is_file()
    for args, needs in (([], "'textual"), (["demo"], "'datasets"), (["run", "demo"], "'torch")):  # beyond the core:
        done = subprocess.run(["tuner", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)  # one line naming what to install, nothing written
        assert done.returncode == 1 and done.stderr.count("\n") == 1, f"tuner {' '.join(args)}: {done.stderr[-3000:]}"
        assert done.stderr.startswith("error: ") and "pip install" in done.stderr and needs in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()
