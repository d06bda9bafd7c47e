"""Checking an artifact against its source: the steps export and verify share, in one place.

A `Verification` is what those steps read and write: the command's options, the source's side
(its feeds and outputs, the other sizes of its dynamic axes, its GELU sites, a generation) and
the artifact's (the artifact, its runner, what the comparison and the GELU guard found).
SOURCE_STEPS run the source; PRECISION_STEPS read the artifact's precision and let the source go
when nothing needs it more; JUDGING_STEPS judge the artifact against the source (its outputs at
every size, a generation, an int8 artifact's layers, every GELU, how sensitive the tolerance is to
the GELU flavour, and where a red run first departs). export (exporter.exporting)
and verify (exporter.verifying) put their own steps around them, as subclasses that say how the
int8 float twin is made and what an artifact that does not load means.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter import localization, quantization
from exporter.digests import Digests
from exporter.generation import (
    DECODE_STEPS,
    Generation,
    check_generation,
    check_generation_by_rows,
    reference_generation,
)
from exporter.model_tasks import TASKS
from exporter.sources import InputSpec, Source, make_batches, parse_input_spec, specs_of_tensors
from exporter.sources import feeds_record, stated_length_limit
from verifiers.compare import Tolerances
from verifiers.errors import BadInput, about
from verifiers.formats import Artifact
from verifiers.judging import (
    Comparison,
    baked_size_hints,
    compare,
    compare_at_sizes,
    fixed_in_artifact,
    gelu_sensitivity,
    judge_gelu,
    load_runner,
    named_feed,
)
from verifiers.report import Report
from verifiers.runtimes import InvalidArtifact, Runner, isolation, runtime_for
from verifiers.runtimes.litert_lm import teacher_forced_logits
from verifiers.sizes import DynamicAxis, SymbolSizes, artifact_axes, plan_sizes, sized_feed, undeclared_entry
from verifiers.steps import Progress, Step


@dataclass
class Verification:
    """The state of one artifact checked against its source (see the module's docstring)."""

    report: Report
    progress: Progress
    options: Mapping[str, Any]  # the command's options by name, defaults filled (exporter.options.given)
    reports: dict[str, Path] = field(default_factory=dict)  # the report files asked for, by writer name
    cleanups: contextlib.ExitStack | None = None  # run after the last step (verifiers.steps.run_steps)
    tolerances: Tolerances | None = None
    input_specs: list[InputSpec] = field(default_factory=list)  # --input
    # The source's side.
    source: Source | None = None
    source_digests: Digests | None = None  # of the files the source was built from
    feeds: list[dict] = field(default_factory=list)
    reference: list = field(default_factory=list)  # the source's (names, feed, outputs) on each feed
    axes: list[DynamicAxis] = field(default_factory=list)  # the dynamic axes verified at several sizes
    plans: list[SymbolSizes] = field(default_factory=list)  # the sizes each symbol of `axes` is tried at
    sized: dict = field(default_factory=dict)  # (symbol, size) -> (feed, the source's outputs there)
    generation: Generation | None = None  # a decoder with past: transformers' generate, step by step
    captured: list | str | None = None  # the source's GELU sites, why they could not be read, or None (guard off)
    # The artifact's side.
    artifact: Artifact | None = None
    runner: Runner | None = None
    comparison: Comparison | None = None
    artifact_sites: list | None = None
    declared: dict[str, str] | None = None  # GELU flavour changes the user asked for (export --gelu)
    verifying: bool = True  # export --no-verify: False
    loads: bool = True  # False once an exported artifact failed to load: the rest is skipped

    @property
    def active(self) -> bool:
        """Whether the artifact is run and judged."""
        return self.verifying and self.loads

    def float_twin(self) -> Path:
        """The source exported unquantized to the artifact's format (an int8 artifact's layers are
        compared with it)."""
        raise NotImplementedError

    def failed_to_load(self, error: InvalidArtifact) -> None:
        """An artifact that does not load, found on the way: what the file given to verify is (exit
        2) unless an exporter made it."""
        raise error


def parse_checking_options(run: Verification) -> None:
    """The options every verification reads: tolerances and --input."""
    options = run.options
    run.tolerances = Tolerances.parse(list(options["atol"]), list(options["rtol"]))
    run.tolerances.allow_nonfinite = options["allow_nonfinite"]
    with about("inputs"):
        run.input_specs = [parse_input_spec(spec) for spec in options["inputs"]]


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


def make_feeds(run: Verification) -> None:
    """The seeded batches the source and the artifact run on, recorded in the report."""
    run.feeds = make_batches(run.source, run.options["seed"], run.options["batches"])
    run.report.example_batch = run.source.example is not None
    run.report.feeds = feeds_record(run.source, run.feeds, run.options["seed"])


def _reference(run: Verification) -> None:
    run.reference = [run.source.run(feed) for feed in run.feeds]
    _reference_at_sizes(run)
    task = TASKS.get(run.source.facts.get("task"))
    if task is not None and task.past:
        run.generation = reference_generation(run.source.model, run.options["seed"])


def _reference_at_sizes(run: Verification) -> None:
    """The source's outputs on one seeded batch at each other size of each dynamic symbol; a size
    the source itself cannot run at is skipped (the artifact is not to blame)."""
    run.plans = plan_sizes(run.axes, run.feeds[0], stated_length_limit(run.source.model))
    for plan in run.plans:
        for size in plan.extra_sizes:
            feed = sized_feed(run.feeds[0], plan, size, run.options["seed"])
            try:
                run.sized[(plan.symbol, size)] = (feed, run.source.run(feed)[2])
            except BadInput as exc:
                plan.skipped[size] = str(exc).replace("the source model failed on its inputs", "the source model fails")


def _capture_gelu(run: Verification) -> None:
    run.captured = run.source.activation_sites(run.feeds[0])


SOURCE_STEPS = (
    Step("reference", _reference, message=lambda run: f"running the source model on {len(run.feeds)} batch(es)"),
    Step("gelu_source", _capture_gelu, message=lambda run: "reading the GELU sites of the source",
         when=lambda run: run.active and run.options["gelu_guard"]),
)


# ---- the artifact's side ------------------------------------------------------------------------


def _record_precision(run: Verification) -> None:
    thresholds = quantization.thresholds(run.options["min_sqnr"], run.options["min_top1"])
    quantization.record_precision(run.report, run.artifact, thresholds, run.tolerances)


def _integer_artifact(run: Verification) -> bool:
    return run.report.quantization.get("mode") in quantization.INTEGER_MODES


def _release_source(run: Verification) -> bool:
    """Only the artifact runs from here on; an int8 artifact keeps its source for the float twin,
    and a run that localises for its trace."""
    return not _integer_artifact(run) and not run.options["localize"]


def _by_signatures(run: Verification) -> bool:
    """An LLM of prefill and decode signatures: verified by generating; the source's inputs map to
    none of its signatures."""
    return run.artifact is not None and run.artifact.generates_by_signatures


def load_artifact(run: Verification) -> None:
    """The artifact in its runtime's worker: loaded now, or the rest of a load started earlier."""
    if run.runner is None:
        run.runner = load_runner(run.artifact, run.options.get("runtime"))
    else:
        run.runner.wait_loaded()
    run.report.runtime = run.runner.runtime


def _loading_message(run: Verification) -> str | None:
    if run.runner is not None:  # started earlier, with its own message
        return None
    return f"loading the artifact in {runtime_for(run.artifact.format.name, run.options.get('runtime')).runtime}"


def compare_outputs(run: Verification) -> None:
    run.comparison = compare(run.report, run.runner, run.feeds, run.reference, run.tolerances, run.progress)
    run.report.verified = True


def _sizes(run: Verification) -> None:
    """Each dynamic axis at its other sizes: one the source declared that came out static fails
    (exit 4 naming it), the others run there; an axis the artifact made dynamic unasked is listed,
    not run (the source's outputs there were not computed)."""
    fixed_in_artifact(run.report, run.plans, run.runner.inputs, run.report.exporter)
    baked_size_hints(run.report, run.artifact, run.plans)
    compare_at_sizes(run.report, run.comparison, run.plans, run.sized, run.tolerances, run.progress)
    declared = {(a.input, a.axis) for a in run.axes}
    run.report.dynamic.extend(undeclared_entry(axis) for axis in artifact_axes(run.runner.inputs)
                              if (axis.input, axis.axis) not in declared)


def _check_generation(run: Verification) -> None:
    if _by_signatures(run):
        check_generation_by_rows(run.report, run.generation, run.tolerances, lambda rows: isolation.call(
            teacher_forced_logits, str(run.artifact.path), rows, runtime=run.runner.runtime,
            step="generating with the artifact", runner=run.runner))
        run.report.verified = True
    else:
        check_generation(run.report, run.runner, run.generation, run.tolerances)


def _diagnose_layers(run: Verification) -> None:
    feeds = [named_feed(run.runner, feed) for feed in run.feeds]
    quantization.diagnose_layers(run.report, run.artifact, run.float_twin(), feeds, run.tolerances.integer, run.runner,
                            run.progress)


def _judge_gelu(run: Verification) -> None:
    run.artifact_sites = judge_gelu(run.report, run.artifact, run.captured, run.runner, run.declared,
                                    run.progress, configured=run.source.configured)


def _gelu_sensitivity(run: Verification) -> None:
    gelu_sensitivity(run.report, run.artifact, run.artifact_sites, run.comparison, run.tolerances)


def _sensitivity_applies(run: Verification) -> bool:
    return run.artifact_sites is not None and run.artifact.gelu_rewritable


def _localize(run: Verification) -> None:
    runner = run.runner
    runner.close()  # its memory goes first; its inputs, outputs and runtime are what is asked of it

    def default_inputs() -> list[InputSpec]:  # for a source without input specs (verify)
        return specs_of_tensors(runner.inputs)

    localization.localize(run.report, run.source, run.feeds, run.reference, run.sized, run.artifact,
                          run.comparison, run.progress, reload=lambda: localization.reload_source(
                              run.source.spec, run.input_specs, default_inputs, run.options["trust_source"],
                              run.report.task))


def runs_the_artifact(step):
    """A step that runs the artifact: an artifact that does not load there goes to
    `failed_to_load`."""
    def run_step(run: Verification) -> None:
        try:
            step(run)
        except InvalidArtifact as error:
            run.failed_to_load(error)
    return run_step


PRECISION_STEPS = (
    Step("precision", _record_precision),
    Step("release_source", lambda run: run.source.release(), when=_release_source),
)

JUDGING_STEPS = (
    Step("load_artifact", runs_the_artifact(load_artifact), message=_loading_message, when=lambda run: run.active),
    Step("compare", runs_the_artifact(compare_outputs), when=lambda run: run.active and not _by_signatures(run),
         timed=False),
    Step("sizes", runs_the_artifact(_sizes), when=lambda run: run.active and not _by_signatures(run), timed=False),
    Step("generate", runs_the_artifact(_check_generation),
         message=lambda run: f"generating with the artifact: a prefill and {DECODE_STEPS} cached decode steps",
         when=lambda run: run.active and run.generation is not None),
    Step("layers", _diagnose_layers,
         when=lambda run: run.active and _integer_artifact(run) and bool(quantization.weak_outputs(run.report))),
    Step("gelu", runs_the_artifact(_judge_gelu),
         message=lambda run: run.options["gelu_guard"] and "finding the GELU sites of the source and measuring "
                                                          "the artifact's",
         when=lambda run: run.active),
    Step("gelu_sensitivity", runs_the_artifact(_gelu_sensitivity),
         when=lambda run: run.active and not _by_signatures(run) and _sensitivity_applies(run)),
    # Last of the checks: the artifact's runner goes first, its memory with it.
    Step("localize", runs_the_artifact(_localize), message=lambda run: "localising the divergence",
         when=lambda run: run.active and not _by_signatures(run)
         and localization.wanted(run.options["localize"], run.report)),
)
