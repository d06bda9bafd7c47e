"""`exportgate measure`: what an artifact (from any tool) costs in its runtime, with no source
model. The batch measured is seeded random values at the artifact's input shapes, a dynamic axis at
the size verify gives it unless --input sets the shape. --gelu-forms measures the artifact's GELUs
written in their other forms too (exporter.gelu_forms), in turn with it."""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from exporter.artifact_record import hash_in_background, record_artifact, report_artifact
from exporter.checks.measurement import measure, read_baseline
from exporter.gelu_forms import GeluForm, gelu_forms
from exporter.sources import parse_input_spec, random_array, specs_of_tensors
from verifiers.errors import BadInput
from verifiers.formats import Artifact, open_artifact
from verifiers.report import Report
from verifiers.runtimes import open_runner, runtime_for
from verifiers.steps import Progress, Step
from verifiers.writers import check_reports


@dataclass
class Measuring:
    report: Report
    progress: Progress
    options: dict[str, Any]
    reports: dict[str, Path]
    path: Path
    artifact: Artifact | None = None
    feed: dict[str, np.ndarray] = field(default_factory=dict)
    baseline: dict | None = None  # --baseline's measurement
    forms: list[GeluForm] = field(default_factory=list)  # --gelu-forms: the artifact in its other GELU forms
    cleanups: contextlib.ExitStack | None = None


def _check_options(run: Measuring) -> None:
    check_reports(run.reports)
    run.baseline = read_baseline(run.options)


def _artifact_facts(run: Measuring) -> None:
    run.artifact = open_artifact(run.path)
    record_artifact(run.report, run.artifact)
    run.cleanups.callback(report_artifact, run.report, run.artifact, hash_in_background(run.artifact))


def _seeded_batch(run: Measuring) -> None:
    """The batch: the artifact's inputs (read by its runtime, in a worker closed before the
    measurement starts its own), each --input's shape where one names it."""
    given = {spec.name: spec for spec in map(parse_input_spec, run.options["inputs"])}
    runner = open_runner(run.artifact.format.name, run.path, run.options["runtime"])
    try:
        inputs = runner.inputs
    finally:
        runner.close()
    unknown = sorted(set(given) - {info.name for info in inputs})
    if unknown:
        raise BadInput(f"--input {unknown[0]}: the artifact has no such input (it has "
                       f"{', '.join(info.name for info in inputs)})")
    rng = np.random.default_rng(run.options["seed"])
    run.feed = {spec.name: random_array(given.get(spec.name, spec), rng, None) for spec in specs_of_tensors(inputs)}
    run.report.runtime = runner.runtime


def _gelu_forms(run: Measuring) -> None:
    """The artifact written in each other GELU form it can take, in a folder of its own (removed
    at the end), for the measurement to take in turn with it."""
    folder = Path(run.cleanups.enter_context(tempfile.TemporaryDirectory(prefix="exportgate-gelu-forms-")))
    run.forms, notes = gelu_forms(run.path, run.artifact.format.name, folder)
    run.report.notes.extend(notes)


MEASURE_STEPS = (
    Step("options", _check_options),
    Step("artifact_facts", _artifact_facts),
    Step("inputs", _seeded_batch),
    Step("gelu_forms", _gelu_forms, lambda run: "writing the artifact's GELUs in their other forms",
         when=lambda run: run.options["gelu_forms"]),
    Step("measure", lambda run: measure(run.report, runtime_for(run.artifact.format.name, run.options["runtime"]),
                                        run.path, run.feed, run.options, run.baseline, run.progress, run.forms)),
)
