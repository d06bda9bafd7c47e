"""The Python API: export, verify, check, targets and inspect. Each returns what the CLI prints or writes.

export, verify and check are short lists of named steps (verifiers.steps runs them: progress,
timings, errors and the report); each step is a small function of the command's state below.
The API never prints: progress on long steps goes to the `progress` callback.
"""

from __future__ import annotations

import contextlib
import filecmp
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.digests import Digests, sha256
from exporter.frameworks import framework_named_by, load_source
from exporter.gelu_policy import PolicyOutcome, apply_gelu_policy, check_gelu_policy
from exporter.generation import (
    DECODE_STEPS,
    Generation,
    check_generation,
    check_generation_by_rows,
    reference_generation,
)
from exporter.model_tasks import TASKS
from exporter.options import given
from exporter import integer, localization
from exporter.routes import ExportRequest, Route, check_opset, check_request, route_for, route_with_past
from exporter.sources import InputSpec, Source, make_batches, name_symbols, parse_dynamic_axis, parse_input_spec
from exporter.sources import feeds_record, specs_of_tensors, stated_length_limit
from exporter.staging import Staging, out_lock, remove_artifact, sweep_abandoned
from exporter.target_fit import fit_ir_version
from verifiers.compare import Tolerances
from verifiers.errors import BadInput, Incompatible, about, one_line
from verifiers.formats import Artifact, artifact_format, detect_format, open_artifact
from verifiers.pipeline import (
    BEFORE_REWRITE,
    Comparison,
    compare,
    baked_size_hints,
    compare_at_sizes,
    describe_artifact,
    fixed_in_artifact,
    gelu_sensitivity,
    judge_gelu,
    load_runner,
    named_feed,
)
from verifiers.report import ArtifactInfo, Report
from verifiers.runtimes import InvalidArtifact, Runner, runtime_for
from verifiers.runtimes import isolation
from verifiers.runtimes.isolation import start_early
from verifiers.runtimes.litert_lm import teacher_forced_logits
from verifiers.sizes import DynamicAxis, SymbolSizes, artifact_axes, plan_sizes, sized_feed, undeclared_entry
from verifiers.steps import Progress, Step, run_steps, silent
from verifiers.targets import Target
from verifiers.writers import check_reports, check_writable, write_reports

DEFAULT_BATCHES = 3


@dataclass
class Checked:
    """What verify and export share once the artifact and the source are known."""

    report: Report
    progress: Progress
    tolerances: Tolerances | None = None
    source: Source | None = None
    feeds: list[dict] = field(default_factory=list)
    reference: list = field(default_factory=list)
    captured: list | str | None = None  # the source's GELU sites, why they could not be read, or None (guard off)
    artifact: Artifact | None = None
    runner: Runner | None = None
    comparison: Comparison | None = None
    artifact_sites: list | None = None
    declared: dict[str, str] | None = None
    runtime: str | None = None  # the runtime that runs the artifact; None: the one its format names
    reports: dict[str, Path] = field(default_factory=dict)
    cleanups: contextlib.ExitStack | None = None
    source_digests: Digests | None = None  # of the files the source was built from
    seed: int = 0
    axes: list[DynamicAxis] = field(default_factory=list)  # the dynamic axes verified at several sizes
    plans: list[SymbolSizes] = field(default_factory=list)  # the sizes each symbol of `axes` is tried at
    sized: dict = field(default_factory=dict)  # (symbol, size) -> (feed, the source's outputs there)
    generation: Generation | None = None  # a decoder with past: transformers' generate, step by step
    min_sqnr: float | None = None
    min_top1: float | None = None
    localize: bool | None = None  # --localize (True), --no-localize (False), else a red numeric run only
    input_specs: list[InputSpec] = field(default_factory=list)
    trust_source: bool = False
    task: str | None = None  # a transformers model folder's task (exporter.model_tasks); None: inferred


# ---- steps shared by export and verify ------------------------------------------------------------


def _reference(run: Checked) -> None:
    run.reference = [run.source.run(feed) for feed in run.feeds]
    _reference_at_sizes(run)
    task = TASKS.get(run.source.facts.get("task"))
    if task is not None and task.past:
        run.generation = reference_generation(run.source.model, run.seed)


def _check_generation(run: Checked) -> None:
    if _by_signatures(run):
        check_generation_by_rows(run.report, run.generation, run.tolerances, lambda rows: isolation.call(
            teacher_forced_logits, str(run.artifact.path), rows, runtime=run.runner.runtime,
            step="generating with the artifact", runner=run.runner))
        run.report.verified = True
    else:
        check_generation(run.report, run.runner, run.generation, run.tolerances)


def _by_signatures(run: Checked) -> bool:
    """An LLM of prefill and decode signatures: verified by generating; the source's inputs map to
    none of its signatures."""
    return run.artifact is not None and run.artifact.generates_by_signatures


def _reference_at_sizes(run: Checked) -> None:
    """The source's outputs on one seeded batch at each other size of each dynamic symbol; a size
    the source itself cannot run at is skipped (the artifact is not to blame)."""
    run.plans = plan_sizes(run.axes, run.feeds[0], stated_length_limit(run.source.model))
    for plan in run.plans:
        for size in plan.extra_sizes:
            feed = sized_feed(run.feeds[0], plan, size, run.seed)
            try:
                run.sized[(plan.symbol, size)] = (feed, run.source.run(feed)[2])
            except BadInput as exc:
                plan.skipped[size] = str(exc).replace("the source model failed on its inputs", "the source model fails")


def _generating(run: Checked) -> str:
    return f"generating with the artifact: a prefill and {DECODE_STEPS} cached decode steps"


def _localize(run: Checked) -> None:
    if run.runner is not None:
        run.runner.close()
    localization.localize(run, lambda: localization.reload_source(
        run.source.spec, run.input_specs, _default_inputs(run), run.trust_source, run.report.task))


def _default_inputs(run: Checked):
    """Input specs read off the artifact, for a source that has none (verify)."""
    return (lambda: specs_of_tensors(run.runner.inputs)) if run.runner is not None else None


def _capture_gelu(run: Checked) -> None:
    run.captured = run.source.activation_sites(run.feeds[0])


def _load_artifact(run: Checked) -> None:
    run.runner = load_runner(run.artifact, run.runtime)
    run.report.runtime = run.runner.runtime


def _compare(run: Checked) -> None:
    run.comparison = compare(run.report, run.runner, run.feeds, run.reference, run.tolerances, run.progress)
    run.report.verified = True


def _compare_at_sizes(run: Checked) -> None:
    baked_size_hints(run.report, run.artifact, run.plans)
    compare_at_sizes(run.report, run.comparison, run.plans, run.sized, run.tolerances, run.progress)


def _exported_at_sizes(run: Exported) -> None:
    """An export's axes: each declared dynamic must be dynamic in the artifact (exit 4 naming it),
    then holds at its other sizes; an axis the artifact made dynamic unasked is listed, not run
    (the source was released before the artifact existed)."""
    fixed_in_artifact(run.report, run.plans, run.runner.inputs, run.report.exporter)
    _compare_at_sizes(run)
    declared = {(a.input, a.axis) for a in run.axes}
    run.report.dynamic.extend(undeclared_entry(axis) for axis in artifact_axes(run.runner.inputs)
                              if (axis.input, axis.axis) not in declared)


def _judge_gelu(run: Checked) -> None:
    run.artifact_sites = judge_gelu(run.report, run.artifact, run.captured, run.runner, run.declared,
                                    run.progress, configured=run.source.configured)


def _gelu_sensitivity(run: Checked) -> None:
    gelu_sensitivity(run.report, run.artifact, run.artifact_sites, run.comparison, run.tolerances)


def _record_artifact(run, artifact: Artifact) -> None:
    run.artifact = artifact
    run.report.format = artifact.format.name
    artifact.record_facts(run.report)


def _check_target(run, target: Target) -> None:
    from verifiers.target_check import check_artifact, to_findings

    found = check_artifact(run.artifact, target)
    findings = to_findings(found, target, run.report.command)
    run.report.target_checks = [{"kind": i.kind, "message": f.message} for i, f in zip(found, findings)]
    run.report.failures.extend(findings)


def _record_precision(run: Checked) -> None:
    integer.record_precision(run.report, run.artifact, integer.thresholds(run.min_sqnr, run.min_top1), run.tolerances)


def _integer_artifact(run: Checked) -> bool:
    return run.report.quantization.get("mode") in integer.INTEGER_MODES


def _diagnose_layers(run: Checked, float_model: Path) -> None:
    feeds = [named_feed(run.runner, feed) for feed in run.feeds]
    integer.diagnose_layers(run.report, run.artifact, float_model, feeds, run.tolerances.integer, run.runner,
                            run.progress)


def _sensitivity_applies(run: Checked) -> bool:
    return run.artifact_sites is not None and run.artifact.gelu_rewritable


def _reading_sources(run: Checked) -> str:
    return f"running the source model on {len(run.feeds)} batch(es)"


# ---- export ----------------------------------------------------------------------------------------


@dataclass
class Exported(Checked):
    model: str = ""
    to: str = ""
    out: Path = Path()
    opset: int | None = None
    exporter: str = "auto"
    quantize: str | None = None
    io: str = "float"
    calibration: str | None = None
    allow_float_ops: bool = False
    target_name: str | None = None
    gelu: str = "preserve"
    matrix: str | Path | None = None
    inputs: Sequence[str] = ()
    dynamic: Sequence[str] = ()
    atol: Sequence[str] = ()
    rtol: Sequence[str] = ()
    batches: int = DEFAULT_BATCHES
    verify: bool = True
    gelu_guard: bool = True
    allow_nonfinite: bool = False
    # found along the way
    target: Target | None = None
    route: Route | None = None
    request: ExportRequest | None = None
    calibration_feeds: list[dict] = field(default_factory=list)  # --quantize int8
    staging: Staging | None = None
    before_rewrite: Path | None = None
    outcome: PolicyOutcome | None = None
    digests: Digests | None = None
    loads: bool = True  # false once the exporter's artifact failed to load: the rest of verification is skipped

    @property
    def verifying(self) -> bool:
        return self.verify and self.loads


def _export_options(run: Exported) -> None:
    """Every option is checked before the model loads and before --out is touched; an error
    carries the option it is about."""
    run.tolerances = Tolerances.parse(list(run.atol), list(run.rtol))
    run.tolerances.allow_nonfinite = run.allow_nonfinite
    check_request(run.to, run.exporter, run.quantize)
    with about("opset"):
        check_opset(run.to, run.opset, framework_named_by(run.model))
    integer.check_integer_options(run.quantize, run.io, run.calibration, run.allow_float_ops)
    with about("gelu"):
        check_gelu_policy(run.gelu)
    with about("inputs"):
        run.input_specs = [parse_input_spec(s) for s in run.inputs]
    with about("dynamic"):
        run.axes = [parse_dynamic_axis(d) for d in run.dynamic]
    with about("out"):
        check_writable(run.out, "--out")
    check_reports(run.reports)
    if run.quantize not in (None, "int8"):  # int8 is judged by SQNR and top-1 (integer.record_precision)
        run.report.notes.append(run.tolerances.scale_for(run.quantize))
    if run.target_name:
        with about("target"):
            run.target = _target(run.target_name, run.matrix, run.to)
        run.report.target = run.target.name
        if run.target.max_opset is not None:
            with about("opset"):
                run.opset = run.report.requested_opset = _opset_for(run.target, run.opset)


def _load_source(run: Exported) -> None:
    run.source = load_source(run.model, run.input_specs, trust_source=run.trust_source, task=run.task)
    _record_source(run)
    _check_beside(run)
    run.route = route_for(run.source.framework.name, run.to, run.exporter, run.quantize)
    check_opset(run.to, run.opset, run.route.framework)
    _check_task_route(run)
    ranks = {spec.name: len(spec.shape) for spec in run.source.inputs}
    for axis in run.axes:
        if axis.input not in run.source.input_names:
            raise BadInput(f"--dynamic {axis.input}:{axis.axis}: no input named {axis.input!r} "
                           f"(inputs: {', '.join(run.source.input_names)})")
        if not 0 <= axis.axis < ranks[axis.input]:
            raise BadInput(f"--dynamic {axis.input}:{axis.axis}: {axis.input} has {ranks[axis.input]} axes "
                           f"(0 to {ranks[axis.input] - 1})")
    run.feeds = make_batches(run.source, run.seed, run.batches)
    run.report.example_batch = run.source.example is not None
    run.report.feeds = feeds_record(run.source, run.feeds, run.seed)
    run.axes = name_symbols([*_declared_dynamic(run), *run.axes], run.feeds[0])
    if run.quantize == "int8":
        run.calibration_feeds, calibration = integer.calibration_feeds(run.source, run.calibration, run.seed,
                                                                        run.axes)
        run.report.quantization["calibration"] = calibration
        if calibration["random"]:
            run.report.notes.append(integer.random_calibration_note(calibration))
        if "cast" in calibration:
            run.report.notes.append(integer.cast_calibration_note(calibration))


def _declared_dynamic(run: Exported) -> list[DynamicAxis]:
    """The axes the model declares dynamic (Keras None, a model folder's task axes), unless the
    target takes or the route exports static shapes only: then they are exported at their example
    sizes (an axis asked for with --dynamic is checked, and refused)."""
    static = (f"{run.target.name} takes" if run.target is not None and run.target.static_shapes
              else f"{'/'.join(run.route.exporters)} exports" if run.route.static_shapes else None)
    if static is None or not run.source.dynamic:
        return run.source.dynamic
    axes = ", ".join(f"{a.input} axis {a.axis}" for a in run.source.dynamic)
    run.report.notes.append(f"{static} static shapes only: {axes}, dynamic in the model, exported at the example size")
    return []


def _check_task_route(run: Exported) -> None:
    """A task with past needs a cache that grows from nothing, step by step: a route that exports
    fixed sizes hands it to the format's LLM route (routes.WITH_PAST), and without one it is exit 4
    naming model type, task and route."""
    task = TASKS.get(run.source.facts.get("task"))
    if task is None or not task.past:
        return
    past = route_with_past(run.route, task.call, run.exporter, run.quantize)
    if past is None:
        raise Incompatible(f"model type {run.source.facts['model_type']}, task {task.name}: the "
                           f"{run.route.framework} -> {run.to} route ({'/'.join(run.route.exporters)}) exports fixed "
                           "sizes, a KV cache grows from an empty prefill step by step, and no LLM route here writes "
                           f"this model's; export for {task.name.removesuffix('-with-past')} (no cache) or to onnx")
    run.route = past


def _check_beside(run: Exported) -> None:
    """The files published beside the artifact must not replace another model's: a file of the same
    name and other content in --out's folder stops the run before anything is written."""
    for file in run.source.beside:
        there = run.out.parent / file.name
        if there.exists() and not (there.is_file() and filecmp.cmp(file, there, shallow=False)):
            raise BadInput(f"--out {run.out}: {there} exists and is not {file}, which is published beside the "
                           "artifact; give --out in a folder of its own")


def _record_source(run: Checked) -> None:
    """What the report says of the source: a model folder's model type and task, and the files it
    was built from (hashed beside the rest of the run)."""
    run.report.model_type = run.source.facts.get("model_type")
    run.report.task = run.source.facts.get("task")
    run.report.notes.extend(run.source.notes)
    _hash_source_files(run)


def _hash_source_files(run: Checked) -> None:
    """Hash the files the source was built from beside the rest of the run; the report lists them
    when it is written, also when a later step fails."""
    run.source_digests = Digests(run.source.files)
    run.cleanups.callback(_report_source_files, run)


def _report_source_files(run: Checked) -> None:
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


def _stage(run: Exported) -> None:
    """Take --out's lock, sweep what killed runs left, and open a staging folder beside --out."""
    run.cleanups.enter_context(out_lock(run.out, run.progress))
    swept = sweep_abandoned(run.out.parent)
    if swept:
        run.report.notes.append(f"removed {len(swept)} staging folder(s) left by killed runs: "
                                + ", ".join(p.name for p in swept))
    run.staging = Staging(run.out, run.to)
    run.cleanups.callback(run.staging.cleanup)


def _export(run: Exported) -> None:
    run.request = ExportRequest(run.to, run.opset, run.exporter, run.axes, output_names=run.reference[0][0],
                                sample_inputs=run.feeds[0], quantize=run.quantize, io=run.io,
                                calibration=run.calibration_feeds, allow_float=run.allow_float_ops)
    result = run.route.export(run.source, run.request, run.staging.path, run.progress)
    if result.quantization:
        run.report.quantization.update(result.quantization)
    # Only a run that really exported and then failed removes the release at --out.
    run.cleanups.callback(_remove_stale_release, run.report, run.out, run.to)
    run.report.exporter = result.exporter
    run.report.notes.extend(result.notes)
    run.report.dynamic_hints.extend(result.hints)
    # A declared flavour change makes the outputs differ from the source's: the export as it was
    # before the rewrite is compared too, so a difference of any other cause still fails.
    if run.verify and run.gelu == "tanh":
        run.before_rewrite = run.staging.keep_copy("before-gelu-rewrite")


def _gelu_form(run: Exported) -> None:
    run.outcome = apply_gelu_policy(run.staging.path, run.to, run.gelu, run.target)
    run.declared = run.outcome.declared
    run.report.notes.extend(run.outcome.notes)
    if run.target is not None:
        run.report.notes.extend(filter(None, [fit_ir_version(run.staging.path, run.target)]))


def _exported_artifact(run: Exported) -> None:
    _record_artifact(run, artifact_format(run.to).open(run.staging.path))
    run.digests = _hash_in_background(run)


def _compare_before_rewrite(run: Exported) -> None:
    scratch = Report(command="export")
    before = Checked(scratch, run.progress, run.tolerances, feeds=run.feeds, reference=run.reference,
                     artifact=artifact_format(run.to).open(run.before_rewrite))
    _load_artifact(before)
    _compare(before)
    for finding in scratch.failures:
        finding.message = f"before the --gelu rewrite: {finding.message}"
        finding.data["compared"] = BEFORE_REWRITE
        run.report.failures.append(finding)


def _exported_float_twin(run: Exported) -> Path:
    return integer.float_twin(run.route, run.source, run.request, run.staging.folder / "float-twin",
                              run.staging.path.name, run.progress)


def _exported_artifact_loads(step):
    """A verification step of an export: an artifact the exporter wrote that does not load is the
    exporter's failure (exit 4), and the rest of verification is skipped."""
    def run_step(run: Exported) -> None:
        try:
            step(run)
        except InvalidArtifact as exc:
            run.loads = False
            message = str(exc).replace(f"{run.staging.path}: ", "")
            run.report.fail("target", f"{run.report.exporter} wrote an artifact that does not load: {message}")
    return run_step


def _publish(run: Exported) -> None:
    """Publish the artifact at --out when every check passed, else keep it as NAME.rejected."""
    if not run.verify:
        run.report.notes.append("verification skipped (--no-verify): the artifact was not run or compared")
    if run.report.exit_code == 0:
        # The report is written first: nothing is published that its report does not describe.
        run.report.artifact = artifact_info(run.artifact, published_as=run.out, digests=run.digests)
        run.report.published_beside = [file.name for file in run.source.beside]
        _report_source_files(run)
        write_reports(run.report, run.reports)
        try:
            run.staging.publish(run.artifact.companion_files(), run.source.beside)
        except OSError as exc:
            raise BadInput(f"--out {run.out}: could not publish the artifact there: {one_line(exc)}") from exc
    else:
        report_file = run.reports.get("json") or next(iter(run.reports.values()), None)
        rejected = run.staging.reject(report_file.parent if report_file else run.out.parent,
                                      run.artifact.companion_files())
        run.report.rejected_artifact = str(rejected)
        run.report.artifact = artifact_info(artifact_format(run.to).open(rejected))


EXPORT_STEPS = (
    Step("options", _export_options),
    Step("start_runtime", lambda run: run.cleanups.callback(start_early(runtime_for(run.to))),
         when=lambda run: run.verify),
    Step("load_source", _load_source, message=lambda run: f"loading {run.model}"),
    Step("reference", _reference, message=_reading_sources),
    Step("gelu_source", _capture_gelu, message=lambda run: "reading the GELU sites of the source",
         when=lambda run: run.verify and run.gelu_guard),
    Step("stage", _stage),
    Step("export", _export),
    # Only the artifact runs from here on; an int8 export keeps the source for its float twin.
    Step("release_source", lambda run: run.source.release(),
         when=lambda run: run.quantize != "int8" and not run.localize),
    Step("gelu_form", _gelu_form),
    Step("artifact_facts", _exported_artifact),
    Step("precision", _record_precision),
    Step("target_check", lambda run: _check_target(run, run.target), when=lambda run: run.target is not None),
    Step("compare_before_rewrite", _exported_artifact_loads(_compare_before_rewrite),
         message=lambda run: "comparing the export as it was before the --gelu rewrite",
         when=lambda run: run.verifying and run.before_rewrite is not None),
    Step("load_artifact", _exported_artifact_loads(_load_artifact),
         message=lambda run: f"loading the artifact in {runtime_for(run.to).runtime}", when=lambda run: run.verifying),
    Step("compare", _exported_artifact_loads(_compare), when=lambda run: run.verifying and not _by_signatures(run),
         timed=False),
    Step("sizes", _exported_artifact_loads(_exported_at_sizes), when=lambda run: run.verifying and not _by_signatures(run),
         timed=False),
    Step("generate", _exported_artifact_loads(_check_generation), message=_generating,
         when=lambda run: run.verifying and run.generation is not None),
    Step("layers", lambda run: _diagnose_layers(run, _exported_float_twin(run)),
         when=lambda run: run.verifying and run.quantize == "int8" and bool(integer.weak_outputs(run.report))),
    Step("gelu", _exported_artifact_loads(_judge_gelu),
         message=lambda run: run.gelu_guard and "finding the GELU sites of the source and measuring the artifact's",
         when=lambda run: run.verifying),
    Step("gelu_sensitivity", _exported_artifact_loads(_gelu_sensitivity),
         when=lambda run: run.verifying and not _by_signatures(run) and _sensitivity_applies(run)),
    # Last of the checks: the artifact's runner goes first, its memory with it.
    Step("localize", _exported_artifact_loads(_localize), message=lambda run: "localising the divergence",
         when=lambda run: run.verifying and not _by_signatures(run) and localization.wanted(run.localize, run.report)),
    Step("publish", _publish),
)


def export(model: str, *, report_path: str | Path | None = None, reports: Mapping[str, str | Path] | None = None,
           progress: Progress = silent, **options: Any) -> Report:
    """Export MODEL to `to` at `opset` (or for `target`, with GELU in the form it runs under the
    `gelu` policy), check it against the target, verify it, and publish it at `out` only if all pass.
    The options are `exportgate export`'s, by name (exporter.options)."""
    options = given("export", options)
    full_lists = options.pop("full_lists")
    report = Report(command="export", model=model, format=options["to"], requested_opset=options["opset"],
                    seed=options["seed"], batches=options["batches"], quantize=options["quantize"],
                    full_lists=full_lists)
    run = Exported(report, progress, model=model, out=Path(options.pop("out")), target_name=options.pop("target"),
                   reports=_reports(report_path, reports), **options)
    return run_steps(report, EXPORT_STEPS, run, progress, run.reports)


def check_export_options(model: str, **options: Any) -> None:
    """Every check `export(model, **options)` makes of its options before the model loads (BadInput,
    Incompatible, naming the option), without loading, running or writing anything."""
    options = given("export", options)
    report = Report(command="export", full_lists=options.pop("full_lists"))
    run = Exported(report, silent, model=model, out=Path(options.pop("out")), target_name=options.pop("target"),
                   **options)
    _export_options(run)


def _remove_stale_release(report: Report, out: Path, fmt: str) -> None:
    """After a run that exported and failed: no previous release may stand at --out as if it
    were this run's."""
    if report.exit_code != 0 and remove_artifact(out, fmt):
        report.notes.append(f"removed the previous {out} (and its data files) so no stale artifact stands at --out")


# ---- verify ----------------------------------------------------------------------------------------


@dataclass
class Verified(Checked):
    path: Path = Path()
    model: str = ""
    inputs: Sequence[str] = ()
    atol: Sequence[str] = ()
    rtol: Sequence[str] = ()
    batches: int = DEFAULT_BATCHES
    gelu_guard: bool = True
    allow_nonfinite: bool = False


def _verify_options(run: Verified) -> None:
    run.tolerances = Tolerances.parse(list(run.atol), list(run.rtol))
    run.tolerances.allow_nonfinite = run.allow_nonfinite
    run.input_specs = [parse_input_spec(s) for s in run.inputs]
    check_reports(run.reports)
    run.cleanups.callback(start_early(runtime_for(detect_format(run.path).name, run.runtime)))


def _verified_artifact(run: Verified) -> None:
    """The artifact's facts; its digests are hashed beside the verification and reported at the end."""
    _record_artifact(run, open_artifact(run.path))
    run.cleanups.callback(_report_artifact, run, _hash_in_background(run))


def _report_artifact(run: Verified | Checking, digests: Digests) -> None:
    try:
        run.report.artifact = artifact_info(run.artifact, digests=digests)
    except OSError as exc:
        run.report.fail("input", f"{run.path}: could not be read to hash it: {one_line(exc)}")


def _verified_source(run: Verified) -> None:
    run.source = load_source(run.model, run.input_specs, default_inputs=lambda: specs_of_tensors(run.runner.inputs),
                             trust_source=run.trust_source, task=run.task)
    _record_source(run)
    if run.task is None:
        _check_inferred_task(run)
    run.feeds = make_batches(run.source, run.seed, run.batches)
    run.report.example_batch = run.source.example is not None
    run.report.feeds = feeds_record(run.source, run.feeds, run.seed)
    run.axes = artifact_axes(run.runner.inputs)


def _check_inferred_task(run: Verified) -> None:
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


def _verified_float_twin(run: Verified) -> Path:
    """The source exported unquantized to the artifact's format, in a folder removed at the end."""
    import tempfile

    folder = Path(run.cleanups.enter_context(tempfile.TemporaryDirectory(prefix="exportgate-float-twin-")))
    fmt = run.artifact.format.name
    request = ExportRequest(fmt, run.report.actual_opset, output_names=run.reference[0][0],
                            sample_inputs=run.feeds[0])
    return integer.float_twin(route_for(run.source.framework.name, fmt), run.source, request, folder,
                              run.path.name, run.progress)


def _open_artifact(run: Verified) -> None:
    """Start loading the artifact in its runtime's worker: it loads while the source loads and runs."""
    run.runner = load_runner(run.artifact, run.runtime, wait=False)
    run.report.runtime = run.runner.runtime


VERIFY_STEPS = (
    Step("options", _verify_options),
    Step("artifact_facts", _verified_artifact),
    Step("open_artifact", _open_artifact,
         message=lambda run: f"loading {run.path} in {runtime_for(run.artifact.format.name, run.runtime).runtime}"),
    Step("load_source", _verified_source, message=lambda run: f"loading {run.model}"),
    Step("reference", _reference, message=_reading_sources),
    Step("gelu_source", _capture_gelu, when=lambda run: run.gelu_guard),
    Step("precision", _record_precision),
    # Only the artifact runs from here on; an int8 artifact's source stays for its float twin.
    Step("release_source", lambda run: run.source.release(),
         when=lambda run: not _integer_artifact(run) and not run.localize),
    Step("load_artifact", lambda run: run.runner.wait_loaded()),  # what is left of the load
    Step("compare", _compare, when=lambda run: not _by_signatures(run), timed=False),
    Step("sizes", _compare_at_sizes, when=lambda run: not _by_signatures(run), timed=False),
    Step("generate", _check_generation, message=_generating, when=lambda run: run.generation is not None),
    Step("layers", lambda run: _diagnose_layers(run, _verified_float_twin(run)),
         when=lambda run: _integer_artifact(run) and bool(integer.weak_outputs(run.report))),
    Step("gelu", _judge_gelu,
         message=lambda run: run.gelu_guard and "finding the GELU sites of the source and measuring the artifact's"),
    Step("gelu_sensitivity", _gelu_sensitivity, when=lambda run: not _by_signatures(run) and _sensitivity_applies(run)),
    # Last: the artifact's runner goes first, its memory with it.
    Step("localize", _localize, message=lambda run: "localising the divergence",
         when=lambda run: not _by_signatures(run) and localization.wanted(run.localize, run.report)),
)


def verify(artifact: str | Path, *, report_path: str | Path | None = None,
           reports: Mapping[str, str | Path] | None = None, progress: Progress = silent, **options: Any) -> Report:
    """Verify an existing artifact (from exportgate or any other tool) against its source model,
    run in `runtime` (by default the one its format names: onnxruntime, ai-edge-litert). The
    options are `exportgate verify`'s, by name (exporter.options)."""
    options = given("verify", options)
    report = Report(command="verify", model=options["source"], seed=options["seed"], batches=options["batches"],
                    full_lists=options.pop("full_lists"))
    run = Verified(report, progress, path=Path(artifact), model=options.pop("source"),
                   reports=_reports(report_path, reports), **options)
    return run_steps(report, VERIFY_STEPS, run, progress, run.reports)


# ---- check and inspect -----------------------------------------------------------------------------


@dataclass
class Checking:
    report: Report
    path: Path
    target_name: str
    matrix: str | Path | None
    reports: dict[str, Path]
    artifact: Artifact | None = None
    cleanups: contextlib.ExitStack | None = None


def _check_options(run: Checking) -> None:
    check_reports(run.reports)


def _checked_artifact(run: Checking) -> None:
    """The artifact's facts; its digests are hashed beside the target check and reported at the end."""
    _record_artifact(run, open_artifact(run.path))
    run.cleanups.callback(_report_artifact, run, _hash_in_background(run))


CHECK_STEPS = (
    Step("options", _check_options),
    Step("artifact_facts", _checked_artifact),
    Step("target_check", lambda run: _check_target(run, _target(run.target_name, run.matrix, None))),
)


def check(artifact: str | Path, *, report_path: str | Path | None = None,
          reports: Mapping[str, str | Path] | None = None, **options: Any) -> Report:
    """Every incompatibility of an artifact (from any tool) with a target; exit 4 when there is one.
    The options are `exportgate check`'s, by name (exporter.options)."""
    options = given("check", options)
    report = Report(command="check", target=options["target"], full_lists=options["full_lists"])
    run = Checking(report, Path(artifact), options["target"], options["matrix"], _reports(report_path, reports))
    return run_steps(report, CHECK_STEPS, run, silent, run.reports)


def inspect(artifact: str | Path) -> dict[str, Any]:
    """Format, opsets, op counts, inputs and outputs, and the GELU sites with their claimed and
    measured flavours, without importing torch or TensorFlow."""
    return describe_artifact(artifact)


def targets(matrix: str | Path | None = None) -> list[dict[str, Any]]:
    """The known targets (the packaged matrix plus `matrix`), as `exportgate targets` lists them."""
    from dataclasses import asdict

    from verifiers.target_matrix import load_targets

    return [asdict(t) for t in load_targets(Path(matrix) if matrix else None).values()]


def _target(name: str, matrix: str | Path | None, fmt: str | None):
    from verifiers.target_matrix import get_target, load_targets

    chosen = get_target(name, load_targets(Path(matrix) if matrix else None))
    if fmt is not None and chosen.format != fmt:
        raise BadInput(f"--target {name} runs {chosen.format} artifacts, not {fmt} (use --to {chosen.format})")
    return chosen


def _opset_for(target, opset: int | None) -> int:
    """The requested opset, checked against the target; by default the highest the target loads,
    up to 20 (Gelu-20, and the last opset both torch exporters honour)."""
    if opset is None:
        return min(target.max_opset, 20)
    if opset > target.max_opset:
        raise Incompatible(f"--opset {opset}: {target.name} loads opsets up to {target.max_opset}", kind="opset")
    return opset


def artifact_info(artifact: Artifact, published_as: Path | None = None, digests: Digests | None = None) -> ArtifactInfo:
    """Path, hashes and sizes of an artifact and its data files (refusing data files it may not
    name); `published_as` is where it will stand once published (the same names beside it);
    `digests`, when the hashing started earlier."""
    path = artifact.path
    hashed = digests.sha256 if digests is not None else sha256
    shown = Path(published_as) if published_as is not None else path
    data_files = [
        {"path": str(shown.parent / name), "sha256": hashed(path.parent / name),
         "size_bytes": (path.parent / name).stat().st_size}
        for name in artifact.companion_files()
    ]
    return ArtifactInfo(str(shown), artifact.format.name, hashed(path), path.stat().st_size, data_files)


def _hash_in_background(run) -> Digests:
    """Start hashing the artifact's files: they are final from here on."""
    return Digests([run.artifact.path, *(run.artifact.path.parent / name for name in run.artifact.companion_files())])


def _reports(report_path: str | Path | None, reports: Mapping[str, str | Path] | None) -> dict[str, Path]:
    """The report files asked for, by writer name (verifiers.writers): `report_path` is the JSON one."""
    paths = {name: Path(path) for name, path in (reports or {}).items()}
    if report_path is not None:
        paths["json"] = Path(report_path)
    return paths
