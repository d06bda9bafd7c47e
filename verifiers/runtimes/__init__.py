"""Runtimes that load an artifact and run it on CPU, found by name in a lazy registry.

Every runner has the same interface: `Runner(model)` loads (and validates) an artifact given as a
path, or as the bytes of a model built in memory from one (a variant) whose external data, if it
has any, lies in `data_folder`; `inputs` and `outputs` describe its tensors; `run_all`
maps input names to arrays and returns the outputs of every variant (way the runtime runs it).
`infer` is what callers use: it checks the feed against the input metadata, then runs and times it.

The first runtime registered for a format runs its artifacts by default; `verify --runtime NAME`
picks another registered for the same format. `Runner.probe` makes a runner for a probe model (one
GELU site cut out of an artifact) and `Runner.run_probe` runs one, so the GELU guard measures in the
runtime that runs the artifact. A new runtime is one module and one line in RUNTIMES
(or, outside exportgate, an entry point in the "exportgate.runtimes" group).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from verifiers.errors import BadInput, ExportgateError
from verifiers.registry import LazyRegistry

if TYPE_CHECKING:  # arrays pass through; a worker imports numpy with its runtime, not before
    import numpy as np


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: list[int | str | None]
    dtype: str
    # (scale, zero point) of an integer tensor that holds quantized real values, else None.
    quantization: tuple[float, int] | None = None


class InvalidArtifact(ExportgateError):
    """The artifact fails validation or will not load. Exit 2 for a file given to verify; for an
    export, the exporter wrote something broken and the route reports it."""

    kind = "input"


class ProbeFailed(Exception):
    """The runtime would not build or run a GELU probe (its own error, first line): that site's
    measurement is inconclusive and the verdict rests on the site's structure."""


class Runner:
    runtime: str  # its name in RUNTIMES, and the distribution whose version the report records
    formats: tuple[str, ...]  # artifact formats it runs
    variants: tuple[str, ...] = ("default",)  # ways it runs an artifact; the first is the one that ships
    # For an artifact that computes below float32: what each variant computes in, by variant (one
    # named here and absent from `variants` could not run, and says why).
    arithmetic: dict[str, str] = {}
    notes: list[str] = []  # what the load found and let pass (the report's notes)
    # --precision-hint values it takes (a runtime that picks its inference precision by itself), and
    # the precision its first variant computed a float32 artifact's values at.
    precision_hints: tuple[str, ...] = ()
    precision: str = "float32"
    imports: tuple[str, ...] = ()  # modules its loads import (a worker started early imports them ahead)

    def __init__(self, model: Path | bytes, data_folder: Path | None = None):
        raise NotImplementedError

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]

    @classmethod
    def probe(cls, model: bytes, variant: str | None = None) -> Runner:
        """A runner for a probe model, running it as written (no graph rewrites, one thread) in one
        variant (the first when None); the runtime's own errors are raised as they are."""
        raise NotImplementedError(f"{cls.runtime} cannot run GELU probes")

    @classmethod
    def run_probe(cls, model: bytes, x: np.ndarray, variant: str | None = None) -> np.ndarray:
        """The first output of a probe model (see `probe`) fed `x` at its one input; a runtime that
        tells its refusals apart from other errors raises ProbeFailed for them."""
        runner = cls.probe(model, variant)
        return runner.run({runner.inputs[0].name: x})[0]

    @classmethod
    def run_inspection(cls, model: bytes, feed: dict[str, np.ndarray], keep: list[str],
                       data_folder: Path | None = None) -> dict[str, np.ndarray]:
        """Run a model built to look inside an artifact (verifiers.localization) as written, with no
        graph rewrite and no delegate, and return the tensors `keep` by id (an ONNX graph output's
        name, a TFLite tensor's index); its external data, if any, lies in `data_folder`."""
        raise NotImplementedError(f"{cls.runtime} cannot run a model to look inside it")

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def timed_call(self, variant: str, feed: dict[str, np.ndarray]) -> Callable[[], object]:
        """A call that runs `variant` on `feed` with as little of exportgate around the runtime's own
        call as it can (verifiers.measurement times it)."""
        return lambda: self.run_each({variant: feed})

    def profile(self, feed: dict[str, np.ndarray], runs: int) -> dict[tuple[str, str], float]:
        """Milliseconds per run spent in each node, by (node name, op type) as the runtime's own
        profiler names them, over `runs` runs of `feed` in the way that ships; empty where the
        runtime has no profiler to read."""
        return {}

    def run_all(self, feed: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
        """Outputs of every variant, by variant name."""
        return {self.variants[0]: self.run(feed)}

    def run_each(self, feeds: dict[str, dict[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
        """Each variant named in `feeds` on its own feed (a generation's steps: each variant carries
        its own cache)."""
        return {variant: self.run_all(feed)[variant] for variant, feed in feeds.items()}

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
        """`run_all` on a feed checked against the inputs (names, dtypes, shapes), timed in
        `run_seconds`."""
        self.check_feed(feed)
        start = time.perf_counter()
        try:
            return self.run_all(feed)
        finally:
            self.run_seconds = getattr(self, "run_seconds", 0.0) + time.perf_counter() - start

    def check_feed(self, feed: dict[str, np.ndarray]) -> None:
        """BadInput when the feed does not fit the inputs: a runtime that resizes inputs (LiteRT)
        would run it anyway and only the outputs would be wrong."""
        missing = [i.name for i in self.inputs if i.name not in feed]
        if missing:
            raise BadInput(f"no value for the artifact's input(s) {', '.join(missing)}")
        for info in self.inputs:
            value = feed[info.name]
            if value.dtype.name != info.dtype:
                raise BadInput(f"input {info.name}: the artifact takes {info.dtype}, the source {value.dtype.name}")
            mismatch = shape_mismatch(info.shape, list(value.shape))
            if mismatch:
                raise BadInput(f"input {info.name}: {mismatch}")


def shape_mismatch(declared: list, fed: list[int]) -> str | None:
    """Why an input of the declared shape (None or a name for a dynamic axis) cannot take an
    array of shape `fed`, or None; a permutation of the same sizes is named as a layout."""
    shown = [d if isinstance(d, int) else "?" for d in declared]
    if len(declared) != len(fed):
        return f"the artifact takes rank {len(declared)} {shown}, the source feeds rank {len(fed)} {fed}"
    axes = [i for i, (d, f) in enumerate(zip(declared, fed)) if isinstance(d, int) and d >= 0 and d != f]
    if not axes:
        return None
    which = f"axis {axes[0]} differs" if len(axes) == 1 else f"axes {', '.join(map(str, axes))} differ"
    message = f"the artifact takes {shown}, the source feeds {fed} ({which})"
    if all(isinstance(d, int) for d in declared) and sorted(declared) != sorted(fed):
        return message
    perm = _layout_permutation(declared, fed)
    if perm is not None:
        message += f"; the same sizes in another order: the artifact's layout looks like the source's transposed by {perm}"
    return message


def _layout_permutation(declared: list, fed: list[int]) -> list[int] | None:
    """A permutation p with declared[i] == fed[p[i]] (dynamic axes match anything), keeping equal
    sizes in their order (NCHW from NHWC is [0, 3, 1, 2]); None when there is none."""
    used: set[int] = set()
    perm = []
    for dim in declared:
        candidates = [j for j in range(len(fed)) if j not in used and (not isinstance(dim, int) or fed[j] == dim)]
        if not candidates:
            return None
        j = candidates[0]
        used.add(j)
        perm.append(j)
    return perm


# Threads a runner may use for the artifact's own runs (--threads); 0 leaves it to the runtime. The
# runtime worker sets it from the run's limits (verifiers.runtimes.isolation.serve); probes and
# inspections keep one thread or the runtime's default.
run_threads = 0
# The inference precision a runtime that picks one runs at (--precision-hint; "" leaves it to the
# runtime), set in the worker like run_threads.
run_precision = ""

# Runtimes installed as plug-ins add themselves under the "exportgate.runtimes" entry-point group.
RUNTIMES: LazyRegistry[type[Runner]] = LazyRegistry("runtime", {
    "onnxruntime": "verifiers.runtimes.onnxruntime_runner:OnnxRuntimeRunner",
    "ai-edge-litert": "verifiers.runtimes.litert_runner:LiteRtRunner",
    "openvino": "verifiers.runtimes.openvino_runner:OpenVinoRunner",
}, plugins="exportgate.runtimes")


def runtime_for(fmt: str, name: str | None = None) -> type[Runner]:
    """The runner class called `name` (when None, the first registered for `fmt`); BadInput when no
    runtime of that name is registered or it does not run `fmt` artifacts."""
    if name is None:
        name = next((n for n in RUNTIMES if fmt in RUNTIMES[n].formats), None)
        if name is None:
            raise BadInput(f"no runtime here runs {fmt} artifacts")
    runner = RUNTIMES.get_or_fail(name, "--runtime")
    if fmt not in runner.formats:
        runs = [n for n in RUNTIMES if fmt in RUNTIMES[n].formats]
        raise BadInput(f"--runtime {name}: runs {', '.join(runner.formats)} artifacts, not {fmt} "
                       f"(for {fmt}: {', '.join(runs)})")
    return runner


def open_runner(fmt: str, model: Path | bytes, runtime: str | None = None, wait: bool = True) -> Runner:
    """The runtime `runtime` (the format's default when None, see runtime_for) loading `model` in a worker process
    (verifiers.runtimes.isolation), so a runtime that crashes or hangs on the artifact gives a
    verdict, not a dead exportgate. With `wait` False the load goes on while the caller does other
    work, until the runner is first used (or its `wait_loaded`)."""
    from verifiers.runtimes.isolation import LIMITS, IsolatedRunner

    runner_class = runtime_for(fmt, runtime)
    hint = LIMITS.get().precision
    if hint and hint not in runner_class.precision_hints:
        takes = f"takes {', '.join(runner_class.precision_hints)}" if runner_class.precision_hints else "picks none"
        with_one = [n for n in RUNTIMES if RUNTIMES[n].precision_hints and fmt in RUNTIMES[n].formats]
        raise BadInput(f"--precision-hint {hint}: {runner_class.runtime} {takes}"
                       + (f" (--runtime {with_one[0]} takes one)" if with_one and not runner_class.precision_hints else ""))
    return IsolatedRunner(runner_class, model, wait=wait)


def run_model(runner_class: type[Runner], model: Path | bytes, feeds: list[dict[str, np.ndarray]],
              data_folder: Path | None = None) -> list[list[np.ndarray]]:
    """`runner_class(model, data_folder)` on every feed (a module-level function, for a runtime
    worker: a variant of an artifact runs beside it)."""
    runner = runner_class(model, data_folder)
    return [runner.run(feed) for feed in feeds]
