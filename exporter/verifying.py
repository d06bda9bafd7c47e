"""`exportgate verify`: an artifact from exportgate or any other tool, loading in its runtime's
worker while its source loads and runs, then judged by the checks export shares
(exporter.checks)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from exporter import quantization
from exporter.artifact_record import hash_in_background, record_artifact, report_artifact
from exporter.frameworks import load_source
from exporter.model_tasks import TASKS
from exporter.routes import ExportRequest, route_for
from exporter.sources import specs_of_tensors
from exporter.checks import JUDGING_STEPS, PRECISION_STEPS, SOURCE_STEPS
from exporter.checks.data import read_data
from exporter.checks.sizes import Sizes
from exporter.verification import Verification, make_feeds, parse_checking_options, record_source
from verifiers.errors import BadInput, about
from verifiers.formats import detect_format, open_artifact
from verifiers.judging import load_runner
from verifiers.runtimes import runtime_for
from verifiers.runtimes.isolation import start_early
from verifiers.sizes import artifact_axes
from verifiers.steps import Step
from verifiers.writers import check_reports


@dataclass
class Verify(Verification):
    """A Verification of an artifact given as a file, against the source model `model`."""

    path: Path = Path()
    model: str = ""

    def float_twin(self) -> Path:
        """The source exported unquantized to the artifact's format, in a folder removed at the end."""
        folder = Path(self.cleanups.enter_context(tempfile.TemporaryDirectory(prefix="exportgate-float-twin-")))
        fmt = self.artifact.format.name
        request = ExportRequest(fmt, self.report.actual_opset, output_names=self.reference[0][0],
                                sample_inputs=self.feeds[0])
        return quantization.float_twin(route_for(self.source.framework.name, fmt), self.source, request, folder,
                                  self.path.name, self.progress)


def _check_options(run: Verify) -> None:
    parse_checking_options(run)
    check_reports(run.reports)
    run.cleanups.callback(start_early(runtime_for(detect_format(run.path).name, run.options["runtime"])))


def _artifact_facts(run: Verify) -> None:
    """The artifact's facts; its digests are hashed beside the verification and reported at the end."""
    run.artifact = open_artifact(run.path)
    record_artifact(run.report, run.artifact)
    run.cleanups.callback(report_artifact, run.report, run.artifact, hash_in_background(run.artifact))


def _open_artifact(run: Verify) -> None:
    """Start loading the artifact in its runtime's worker: it loads while the source loads and runs."""
    run.runner = load_runner(run.artifact, run.options["runtime"], wait=False)
    run.report.runtime = run.runner.runtime


def _load_source(run: Verify) -> None:
    run.source = load_source(run.model, run.input_specs, default_inputs=lambda: specs_of_tensors(run.runner.inputs),
                             trust_source=run.options["trust_source"], task=run.options["task"])
    record_source(run)
    if run.options["task"] is None:
        _check_inferred_task(run)
    axes = run.of(Sizes).axes = artifact_axes(run.runner.inputs)
    data = None
    if run.options["data"]:
        with about("data"):
            data = read_data(run, {(a.input, a.axis) for a in axes})
    make_feeds(run, data)


def _check_inferred_task(run: Verify) -> None:
    """A model folder's task inferred from its config must be the artifact's: one takes a KV cache
    and the other not (a decoder exported for text-generation, verified against a causal LM's
    inferred text-generation-with-past) is exit 2 naming the tasks that fit."""
    from exporter.model_folders import tasks_with_cache
    from exporter.model_tasks import PAST

    task = TASKS.get(run.source.facts.get("task"))
    if task is None or run.artifact.generates_by_signatures:
        return
    cached = any(tensor.name.startswith(PAST) for tensor in run.runner.inputs)
    if cached == task.past:
        return
    fitting = tasks_with_cache(run.source.facts["model_type"], cached, task)
    raise BadInput(f"{run.path} {'takes' if cached else 'takes no'} KV cache ({PAST}N.*), but {task.name}, the task "
                   f"{run.model}'s config infers, {'does' if task.past else 'does not'}: give --task "
                   f"{' or '.join(fitting) or 'for the artifact'}")


VERIFY_STEPS = (
    Step("options", _check_options),
    Step("artifact_facts", _artifact_facts),
    Step("open_artifact", _open_artifact,
         message=lambda run: f"loading {run.path} in "
                             f"{runtime_for(run.artifact.format.name, run.options['runtime']).runtime}"),
    Step("load_source", _load_source, message=lambda run: f"loading {run.model}"),
    *SOURCE_STEPS,
    *PRECISION_STEPS,
    *JUDGING_STEPS,
)
