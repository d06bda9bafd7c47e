"""Shared paths and the CLI runner. Models are built in code (fixtures/models); nothing is downloaded."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH_MODELS = REPO / "fixtures" / "models" / "torch_models.py"
KERAS_MODELS = REPO / "fixtures" / "models" / "keras_models.py"


def torch_model(name: str) -> str:
    return f"{TORCH_MODELS}:{name}"


def keras_model(name: str) -> str:
    return f"{KERAS_MODELS}:{name}"


def run_cli(*args, cwd, prelude: str = "") -> subprocess.CompletedProcess:
    """Run `exportgate ARGS` in a fresh interpreter; `prelude` runs first (e.g. to hide a module)."""
    code = f"{prelude}\nfrom exporter.cli import main\nmain()"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600,
    )


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(*args, cwd=tmp_path, **kw)
