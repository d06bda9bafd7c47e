"""The CLI runner. Models are built in code (fixtures/models); nothing is downloaded."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args, cwd, prelude: str = "", timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `exportgate ARGS` in a fresh interpreter; `prelude` runs first (e.g. to hide a module)."""
    code = f"{prelude}\nfrom exporter.cli import main\nmain()"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(*args, cwd=tmp_path, **kw)
