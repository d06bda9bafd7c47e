"""The CLI fixture, the environment every test starts from, and what a test does when a tool it
needs is missing. Models are built in code (fixtures/models); nothing is downloaded; every child
process starts through fixtures/children.py."""

import os
from typing import NoReturn

import pytest

from fixtures.children import REPO, child_env, run_cli  # noqa: F401 - re-exported for the tests

REQUIRE_TOOLS = "EXPORTGATE_REQUIRE_TOOLS"  # .ci/run sets it: it installs every tool a test needs


def tool_missing(what: str) -> NoReturn:
    """A tool a test needs is not on this machine: the test fails where REQUIRE_TOOLS is set (CI
    installs every tool), and elsewhere skips saying what to install."""
    if os.environ.get(REQUIRE_TOOLS):
        pytest.fail(f"{what} ({REQUIRE_TOOLS} is set: a missing tool is a failure)")
    pytest.skip(what)


@pytest.fixture
def cli(tmp_path):
    """`exportgate ARGS` in tmp_path, run in this interpreter (fixtures.cli_in_process): the
    CLI's parsing, output and exit code; with `prelude` or `timeout`, in a child process."""
    from fixtures.cli_in_process import run_cli_here

    def run(*args, prelude: str = "", timeout: float | None = None, env: dict[str, str] | None = None):
        if prelude or timeout is not None:
            return run_cli(*args, cwd=tmp_path, prelude=prelude, env=env, **({"timeout": timeout} if timeout else {}))
        return run_cli_here(*args, cwd=tmp_path, env=env)

    return run


@pytest.fixture(scope="session")
def shared_artifact(tmp_path_factory):
    """`shared_artifact(destination, spec, name, **options)`: the artifact exportgate exports from
    `spec` with `options`, built once per test run for every worker (fixtures.artifact_cache), copied
    into `destination`; returns the copy's path."""
    from fixtures.artifact_cache import built, copy_into

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-artifacts"

    def copy(destination, spec: str, name: str, **options):
        copy_into(built(root, spec, name, **options), destination)
        return destination / name

    return copy


@pytest.fixture(autouse=True)
def _environment_restored():
    """Whatever a test, or the exportgate code it calls, sets in os.environ is undone after it: the
    next test on this worker starts from the same environment whichever ran before."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)
