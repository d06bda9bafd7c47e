"""Runtimes that load an artifact and run it on CPU, one runner per artifact format, found through a registry.

Every runner has the same interface: `Runner(path)` loads (and validates) the artifact, `inputs` and
`outputs` describe its tensors, `run(feed)` maps input names to arrays and returns the outputs in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verifiers.errors import ExportgateError


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: list[int | str | None]
    dtype: str


class InvalidArtifact(ExportgateError):
    """The artifact fails validation or will not load. Exit 2 for a file given to verify; for an
    export, the exporter wrote something broken and the route reports it."""

    kind = "input"


class Runner:
    format: str
    runtime: str  # distribution name, for the report
    variants: tuple[str, ...] = ("default",)  # ways it runs an artifact; the first is the one that ships

    def __init__(self, path: Path):
        raise NotImplementedError

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def run_all(self, feed: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
        """Outputs of every variant, by variant name."""
        return {self.variants[0]: self.run(feed)}


RUNNERS: dict[str, type[Runner]] = {}


def register(cls: type[Runner]) -> type[Runner]:
    RUNNERS[cls.format] = cls
    return cls


def runner_for(fmt: str) -> type[Runner]:
    try:
        return RUNNERS[fmt]
    except KeyError:
        raise ExportgateError(f"no runtime here runs {fmt} artifacts", kind="target") from None


def open_runner(fmt: str, path: Path) -> Runner:
    """The runner for `fmt` loading `path` in a worker process (verifiers.runtimes.isolation), so
    a runtime that crashes or hangs on the artifact gives a verdict, not a dead exportgate."""
    from verifiers.runtimes.isolation import IsolatedRunner

    return IsolatedRunner(runner_for(fmt), path)


from verifiers.runtimes import litert_runner, onnxruntime_runner  # noqa: F401  (registration)
