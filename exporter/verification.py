"""What every check of an artifact against its source stands on (the checks are exporter.checks).

A `Verification` is the run's common ground: the command's options, the source's side (the source,
its seeded feeds and its outputs on them) and the artifact's (the artifact and the runner that runs
it in its runtime's worker). What a single concern keeps (the outputs' comparison, the other sizes
of the dynamic axes, a generation, the GELU sites) is that concern's own state, made by its check
and reached with `run.of(State)`. A `Check` is one concern: the steps it runs on the source while
it is loaded, the steps that judge the artifact, and whether it needs the source once the artifact
is made. export (exporter.exporting) and verify (exporter.verifying) put their own steps in front
of the checks, as subclasses that say how the int8 float twin is made and what an artifact that
does not load means.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from exporter.digests import Digests
from exporter.feed_files import DataSet
from exporter.sources import InputSpec, Source, feeds_record, make_batches, parse_input_spec
from verifiers.compare import Tolerances
from verifiers.errors import BadInput, about
from verifiers.formats import Artifact
from verifiers.judging import load_runner
from verifiers.report import Report
from verifiers.runtimes import InvalidArtifact, Runner, runtime_for
from verifiers.steps import Progress, Step

State = TypeVar("State")


@dataclass
class Verification:
    """The common ground of one artifact checked against its source (see the module's docstring)."""

    report: Report
    progress: Progress
    options: Mapping[str, Any]  # the command's options by name, defaults filled (exporter.options.given)
    reports: dict[str, Path] = field(default_factory=dict)  # the report files asked for, by writer name
    cleanups: contextlib.ExitStack | None = None  # run after the last step (verifiers.steps.run_steps)
    tolerances: Tolerances | None = None
    input_specs: list[InputSpec] = field(default_factory=list)  # --input
    source: Source | None = None
    source_digests: Digests | None = None  # of the files the source was built from
    feeds: list[dict] = field(default_factory=list)
    reference: list = field(default_factory=list)  # the source's (names, feed, outputs) on each feed
    artifact: Artifact | None = None
    runner: Runner | None = None
    verifying: bool = True  # export --no-verify: False
    loads: bool = True  # False once an exported artifact failed to load: the rest is skipped
    states: dict[type, Any] = field(default_factory=dict)  # each check's own state, by its type

    def of(self, kind: type[State]) -> State:
        """The state of the check that keeps a `kind` (made on first use)."""
        if kind not in self.states:
            self.states[kind] = kind()
        return self.states[kind]

    @property
    def active(self) -> bool:
        """Whether the artifact is run and judged."""
        return self.verifying and self.loads

    @property
    def by_signatures(self) -> bool:
        """An LLM of prefill and decode signatures: verified by generating; the source's inputs map
        to none of its signatures."""
        return self.artifact is not None and self.artifact.generates_by_signatures

    def float_twin(self) -> Path:
        """The source exported unquantized to the artifact's format (an int8 artifact's layers are
        compared with it)."""
        raise NotImplementedError

    def failed_to_load(self, error: InvalidArtifact) -> None:
        """An artifact that does not load, found on the way: what the file given to verify is (exit
        2) unless an exporter made it."""
        raise error


@dataclass(frozen=True)
class Check:
    """One concern of a verification: its steps on the source (run before the source is let go),
    its steps on the artifact (after it loaded), and `keeps_source(run)`: whether it needs the
    source after the artifact is made."""

    name: str
    on_source: tuple[Step, ...] = ()
    on_artifact: tuple[Step, ...] = ()
    keeps_source: Callable[[Verification], bool] | None = None


def runs_the_artifact(step):
    """A step that runs the artifact: an artifact that does not load there goes to
    `failed_to_load`."""
    def run_step(run: Verification) -> None:
        try:
            step(run)
        except InvalidArtifact as error:
            run.failed_to_load(error)
    return run_step


def parse_checking_options(run: Verification) -> None:
    """The options every verification reads: tolerances and --input."""
    options = run.options
    run.tolerances = Tolerances.parse(list(options["atol"]), list(options["rtol"]))
    run.tolerances.allow_nonfinite = options["allow_nonfinite"]
    with about("inputs"):
        run.input_specs = [parse_input_spec(spec) for spec in options["inputs"]]
    if options["data_cast"] and not options["data"]:
        raise BadInput("--data-cast casts the arrays of --data: give --data too", option="data_cast")



def record_source(run: Verification) -> None:
    """What the report says of the source: a model folder's model type and task, and the files it
    was built from (hashed beside the rest of the run, listed when the report is written, also
    when a later step fails)."""
    run.report.model_type = run.source.facts.get("model_type")
    run.report.task = run.source.facts.get("task")
    run.report.notes.extend(run.source.notes)
    run.source_digests = Digests(run.source.files)
    run.cleanups.callback(report_source_files, run)


def report_source_files(run: Verification) -> None:
    """Each file the source was built from, its path relative to the working directory when it
    lies under it (a report read on another machine names the project's files, not this one's)."""
    here = Path.cwd().resolve()
    listed = []
    for path in run.source.files:
        with contextlib.suppress(OSError):  # a file the model read and removed was not an input
            shown = path.relative_to(here) if path.is_relative_to(here) else path
            listed.append({"path": str(shown), "sha256": run.source_digests.sha256(path),
                           "size_bytes": path.stat().st_size})
    run.report.source_files = listed


# Seeded random batches besides the example inputs, unless --batches says otherwise (none with --data).
DEFAULT_BATCHES = 3


def make_feeds(run: Verification, data: DataSet | None = None) -> None:
    """The batches every check runs the source and the artifact on, recorded in the report: the
    example inputs and the seeded random batches; with --data (`data`), the random ones only when
    --batches asks, and the data's first batch when nothing else is left."""
    batches = run.options["batches"]
    if batches is None:
        batches = 0 if data is not None else DEFAULT_BATCHES
    run.report.batches = batches
    run.report.example_batch = run.source.example is not None
    if data is not None and not batches and not run.report.example_batch:
        first = next(data.batches_of())
        run.feeds = [first.feed]
        [record] = feeds_record(run.source, run.feeds, run.options["seed"])
        record["origin"] = f"--data {data.spec}, samples {', '.join(map(str, first.numbers))}"
        run.report.feeds = [record]
        return
    run.feeds = make_batches(run.source, run.options["seed"], batches)
    run.report.feeds = feeds_record(run.source, run.feeds, run.options["seed"])


def load_artifact(run: Verification) -> None:
    """The artifact in its runtime's worker: loaded now, or the rest of a load started earlier."""
    if run.runner is None:
        run.runner = load_runner(run.artifact, run.options.get("runtime"))
    else:
        run.runner.wait_loaded()
    run.report.runtime = run.runner.runtime
    run.report.notes.extend(run.runner.notes)
    run.report.arithmetic = dict(run.runner.arithmetic)
    _tolerate_runtime_precision(run)
    unexercised = {variant: what for variant, what in run.runner.arithmetic.items() if variant not in run.runner.variants}
    for variant, what in unexercised.items():  # never green on a run that computed float16 in float32 alone
        run.report.fail("runtime", f"the artifact computes in {variant}, and {variant} arithmetic was {what}; "
                                   f"{run.runner.runtime} computed it in float32 alone: verify it where {variant} runs",
                        data={"variant": variant})


# A runtime's own inference precision below float32, as --quantize names the tolerances for it.
_PRECISION_TOLERANCES = {"float16": "fp16", "bfloat16": "bf16"}


def _tolerate_runtime_precision(run: Verification) -> None:
    """A runtime that computed at bfloat16 or float16 by itself (OpenVINO's default on some CPUs)
    is judged with that precision's tolerances, unless --atol or --rtol were given."""
    scaled = _PRECISION_TOLERANCES.get(run.runner.precision)
    if scaled is None or run.tolerances is None or run.tolerances.atol is not None or run.tolerances.rtol is not None:
        return
    run.tolerances.scale_for(scaled)
    run.report.notes.append(f"{run.runner.precision} tolerances, {run.runner.runtime} computing at {run.runner.precision}: "
                            f"atol {run.tolerances.atol:g}, rtol {run.tolerances.rtol:g} (--atol and --rtol set others)")


def _loading_message(run: Verification) -> str | None:
    if run.runner is not None:  # started earlier, with its own message
        return None
    return f"loading the artifact in {runtime_for(run.artifact.format.name, run.options.get('runtime')).runtime}"


LOAD_ARTIFACT = Step("load_artifact", runs_the_artifact(load_artifact), message=_loading_message,
                     when=lambda run: run.active)
