"""The Makefile's install logic, observed with `make -n` (what it would run) on a copy: no install."""

from __future__ import annotations

import os
import re
import pathlib
import shutil
import subprocess

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]


def _make(tmp_path, *args, env_set=None, dry=True):
    """Run make on a copy of the Makefile in an empty dir, with only the given environment variables set."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "MAKEFLAGS", "MFLAGS")}
    env.update(env_set or {})
    cmd = ["make", "--no-print-directory", *(["-n"] if dry else []), *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)


def test_no_active_env_creates_and_uses_dot_venv(tmp_path):
    run = _make(tmp_path, "test")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert any(l.startswith("python3 -m venv \".venv\"") for l in lines), run.stdout
    # Every install and test step runs the venv's python, never the bare interpreter.
    steps = [l for l in lines if "pip install" in l or "pytest" in l or "mkdocs" in l]
    assert len(steps) == 6, steps
    assert all(l.lstrip("@").split("NO_MKDOCS_2_WARNING=1 ")[-1].startswith(".venv/bin/python ") for l in steps), steps
    assert 'pip install -q "torch==2.13.0"' in run.stdout
    assert 'pip install -q -e ".[test,hf,peft,flower,docs,tensorboard,wandb,mlflow,models]"' in run.stdout
    # The default tier, then the docs tier (the documented commands executed), then the site built strict
    # (CI runs `make test`).
    assert steps[-3].rstrip().endswith('-m pytest -q -m "not slow and not docs"')
    assert steps[-2].rstrip().endswith("-m pytest -q -m docs")
    assert steps[-1].endswith("-m mkdocs build --strict --quiet --site-dir site")


def test_the_docs_tier_has_its_own_target(tmp_path):
    run = _make(tmp_path, "test-docs")
    assert run.returncode == 0, run.stderr
    assert [l for l in run.stdout.splitlines() if "pytest" in l] == [".venv/bin/python -m pytest -q -m docs "]


def test_demo_installs_the_runtime_and_nothing_else(tmp_path):
    run = _make(tmp_path, "demo")
    assert run.returncode == 0, run.stderr
    installs = [l for l in run.stdout.splitlines() if "pip install" in l]
    assert installs == ['.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q '
                        '"torch==2.13.0"', ".venv/bin/python -m pip install -q -e ."], installs
    # ... so the demo draws nothing (matplotlib is the plot extra): neither its commands nor the recipes they read.
    script = (REPO / "recipes" / "quickstart" / "demo.sh").read_text()
    commands = [ln.split("#")[0] for ln in script.splitlines()]
    assert not [c for c in commands if "--plot" in c]
    recipes = set(re.findall(r"recipes/quickstart/[\w.-]+\.yaml", script))
    assert len(recipes) >= 3, recipes
    for recipe in sorted(recipes):
        config = yaml.safe_load((REPO / recipe).read_text())
        sections = [config, *(v for v in config.values() if isinstance(v, dict))]
        assert not any(section.get("plot") for section in sections), f"{recipe} draws: make demo has no matplotlib"


def test_existing_dot_venv_is_not_recreated(tmp_path):
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    run = _make(tmp_path, "install")
    assert run.returncode == 0 and "-m venv" not in run.stdout
    assert ".venv/bin/python -m pip install" in run.stdout


@pytest.mark.parametrize("var", ["VIRTUAL_ENV", "CONDA_PREFIX"])
def test_active_environment_is_used_as_is(tmp_path, var):
    env_dir = tmp_path / "active-env"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "bin" / "python").write_text("")
    run = _make(tmp_path, "demo", env_set={var: str(env_dir)})
    assert run.returncode == 0, run.stderr
    assert "-m venv" not in run.stdout and ".venv" not in run.stdout
    assert f"{env_dir}/bin/python -m pip install -q -e" in run.stdout
    # The demo script's `python` is the environment's.
    assert f'PATH="{env_dir}/bin:$PATH" bash recipes/quickstart/demo.sh' in run.stdout


def test_virtual_env_wins_over_conda(tmp_path):
    run = _make(tmp_path, "install", env_set={"VIRTUAL_ENV": "/opt/v", "CONDA_PREFIX": "/opt/conda"})
    assert "/opt/v/bin/python -m pip" in run.stdout and "/opt/conda" not in run.stdout


def test_torch_override_and_dot_venv_demo_path(tmp_path):
    run = _make(tmp_path, "demo", "TORCH=torch")
    assert 'pip install -q "torch"' in run.stdout
    assert f'PATH="{tmp_path}/.venv/bin:$PATH"' in run.stdout


def test_failing_venv_creation_says_what_to_install(tmp_path):
    # A Debian python3 without python3-venv fails `-m venv`; `false` fails the same way.
    run = _make(tmp_path, "install", "PYTHON=false", dry=False)
    assert run.returncode != 0
    assert "apt install python3-venv" in run.stderr
    assert not (tmp_path / ".venv").exists()  # no half-made environment left behind


def test_gitignore_ignores_the_venv():
    assert ".venv/" in (REPO / ".gitignore").read_text().split()
