"""The CLI runner and the environment of every interpreter the tests start. Models are built in
code (fixtures/models); nothing is downloaded."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# What a child interpreter inherits from the machine, read once as the suite starts. Nothing else
# of the pytest process's environment passes: tests and the frameworks they load set variables
# in-process (TF_CPP_MIN_LOG_LEVEL, KERAS_BACKEND), and the shell or a CI runner may export any
# (GITHUB_ACTIONS and GITHUB_STEP_SUMMARY would make children annotate and write job summaries).
_MACHINE = {name: os.environ[name] for name in ("PATH", "HOME", "TMPDIR") if name in os.environ}


def child_env(**variables: str) -> dict[str, str]:
    """The environment of an interpreter a test starts: the machine's PATH, HOME and TMPDIR, a UTF-8
    locale, exportgate on PYTHONPATH, and `variables` (the test's own, stated where it starts it)."""
    return {**_MACHINE, "LANG": "C.UTF-8", "PYTHONPATH": str(REPO), **variables}


def run_cli(*args, cwd, prelude: str = "", timeout: float = 600, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess:
    """Run `exportgate ARGS` in a fresh interpreter with child_env(**env); `prelude` runs first
    (e.g. to hide a module)."""
    code = f"{prelude}\nfrom exporter.cli import main\nmain()"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], cwd=cwd, env=child_env(**(env or {})), capture_output=True,
        text=True, timeout=timeout,
    )


@pytest.fixture
def cli(tmp_path):
    return lambda *args, **kw: run_cli(*args, cwd=tmp_path, **kw)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Whatever a test, or the exportgate code it calls, sets in os.environ is undone after it: the
    next test on this worker starts from the same environment whichever ran before."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)
