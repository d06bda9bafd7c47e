"""`exportgate export`: the options checked before anything loads, the source loaded and run, the
export staged beside --out, the GELU policy applied, the target checked, then the artifact judged
by the checks verify shares (exporter.checks), and published at --out only if all pass."""

from __future__ import annotations

import filecmp
from dataclasses import dataclass, field
from pathlib import Path

from exporter import quantization
from exporter.artifact_record import artifact_info, hash_in_background, record_artifact
from exporter.checks import JUDGING_STEPS, PRECISION_STEPS, SOURCE_STEPS
from exporter.checks.data import CALIBRATION_PART, PART_NAMES, VERIFICATION_PART, data_set, read_data
from exporter.checks.gelu import Gelu
from exporter.checks.outputs import compare_outputs
from exporter.checks.sizes import Sizes
from exporter.checks.target import check_target, target_named
from exporter.digests import Digests
from exporter.frameworks import framework_named_by, load_source
from exporter.gelu_policy import PolicyOutcome, apply_gelu_policy, check_gelu_policy
from exporter.model_tasks import TASKS
from exporter.routes import ExportRequest, Route, check_opset, check_request, route_for, route_with_past
from exporter.sources import name_symbols, parse_dynamic_axis
from exporter.staging import Staging, out_lock, remove_artifact, sweep_abandoned
from exporter.target_fit import fit_ir_version
from exporter.verification import (
    Verification,
    load_artifact,
    make_feeds,
    parse_checking_options,
    record_source,
    report_source_files,
    runs_the_artifact,
)
from verifiers.errors import BadInput, Incompatible, about, one_line
from verifiers.formats import artifact_format
from verifiers.judging import BEFORE_REWRITE
from verifiers.report import Report
from verifiers.runtimes import InvalidArtifact, runtime_for
from verifiers.runtimes.isolation import start_early
from verifiers.sizes import DynamicAxis
from verifiers.steps import Step
from verifiers.targets import Target
from verifiers.writers import check_reports, check_writable, write_reports


@dataclass
class Export(Verification):
    """A Verification of the artifact an export makes, and what the export finds on the way."""

    model: str = ""
    out: Path = Path()
    opset: int | None = None  # --opset, or the highest the target loads
    target: Target | None = None
    route: Route | None = None
    request: ExportRequest | None = None
    # --quantize int8: the batches it calibrates on; fp16 (ONNX): those its values are measured on
    calibration_feeds: list[dict] = field(default_factory=list)
    staging: Staging | None = None
    before_rewrite: Path | None = None  # the export before the --gelu rewrite, compared too
    outcome: PolicyOutcome | None = None
    digests: Digests | None = None

    def float_twin(self) -> Path:
        return quantization.float_twin(self.route, self.source, self.request, self.staging.folder / "float-twin",
                                  self.staging.path.name, self.progress)

    def failed_to_load(self, error: InvalidArtifact) -> None:
        """The exporter wrote an artifact that does not load: its failure (exit 4), and the rest of
        the verification is skipped."""
        self.loads = False
        message = str(error).replace(f"{self.staging.path}: ", "")
        self.report.fail("target", f"{self.report.exporter} wrote an artifact that does not load: {message}")


def check_options(run: Export) -> None:
    """Every option is checked before the model loads and before --out is touched; an error
    carries the option it is about."""
    options = run.options
    parse_checking_options(run)
    check_request(options["to"], options["exporter"], options["quantize"])
    with about("opset"):
        check_opset(options["to"], run.opset, framework_named_by(run.model))
    quantization.check_integer_options(options["quantize"], options["io"], options["calibration"],
                                       options["allow_float_ops"], options["keep_fp32"], options["to"])
    with about("gelu"):
        check_gelu_policy(options["gelu"])
    with about("dynamic"):
        run.of(Sizes).axes = [parse_dynamic_axis(d) for d in options["dynamic"]]
    with about("out"):
        check_writable(run.out, "--out")
    check_reports(run.reports)
    if options["quantize"] not in (None, "int8"):  # int8 is judged by SQNR and top-1 (exporter.checks.quantization)
        run.report.notes.append(run.tolerances.scale_for(options["quantize"]))
    if options["target"]:
        with about("target"):
            run.target = target_named(options["target"], options["matrix"], options["to"])
        run.report.target = run.target.name
        if run.target.max_opset is not None:
            with about("opset"):
                run.opset = run.report.requested_opset = _opset_for(run.target, run.opset)


def _opset_for(target: Target, opset: int | None) -> int:
    """The requested opset, checked against the target; by default the highest the target loads,
    up to 20 (Gelu-20, and the last opset both torch exporters honour)."""
    if opset is None:
        return min(target.max_opset, 20)
    if opset > target.max_opset:
        raise Incompatible(f"--opset {opset}: {target.name} loads opsets up to {target.max_opset}", kind="opset")
    return opset


def _load_source(run: Export) -> None:
    options = run.options
    run.source = load_source(run.model, run.input_specs, trust_source=options["trust_source"], task=options["task"])
    record_source(run)
    _check_beside(run)
    run.route = route_for(run.source.framework.name, options["to"], options["exporter"], options["quantize"])
    check_opset(options["to"], run.opset, run.route.framework)
    _check_task_route(run)
    ranks = {spec.name: len(spec.shape) for spec in run.source.inputs}
    sizes = run.of(Sizes)
    for axis in sizes.axes:
        if axis.input not in run.source.input_names:
            raise BadInput(f"--dynamic {axis.input}:{axis.axis}: no input named {axis.input!r} "
                           f"(inputs: {', '.join(run.source.input_names)})")
        if not 0 <= axis.axis < ranks[axis.input]:
            raise BadInput(f"--dynamic {axis.input}:{axis.axis}: {axis.input} has {ranks[axis.input]} axes "
                           f"(0 to {ranks[axis.input] - 1})")
    declared = _declared_dynamic(run)
    dynamic = {(a.input, a.axis) for a in [*declared, *sizes.axes]}
    data = calibration_data = None
    # An int8 export on --data alone calibrates on some samples and is verified on the others.
    split = options["data"] is not None and options["quantize"] == "int8" and options["calibration"] is None
    if options["data"]:
        with about("data"):
            data = read_data(run, dynamic, VERIFICATION_PART if split else None)
            calibration_data = data_set(run, dynamic, CALIBRATION_PART) if split else None
    make_feeds(run, data)
    sizes.axes = name_symbols([*declared, *sizes.axes], run.feeds[0])
    if options["quantize"] == "fp16" and options["to"] == "onnx":  # the batches its values are measured on
        measured = (data, f"--data {options['data']}") if data is not None else None
        run.calibration_feeds, run.report.quantization["measured_on"] = quantization.calibration_feeds(
            run.source, options["calibration"], options["seed"], sizes.axes, measured)
    if options["quantize"] == "int8":
        part = (calibration_data, f"{options['data']} ({PART_NAMES[CALIBRATION_PART]} samples)") if split else None
        run.calibration_feeds, calibration = quantization.calibration_feeds(run.source, options["calibration"],
                                                                        options["seed"], sizes.axes, part)
        if split:
            run.report.notes.append(f"int8: calibrated on the {PART_NAMES[CALIBRATION_PART]} samples of --data "
                                    f"({calibration_data.samples}), verified on the {PART_NAMES[VERIFICATION_PART]} "
                                    f"({data.samples}): give --calibration to calibrate on other data")
        run.report.quantization["calibration"] = calibration
        if calibration["random"]:
            run.report.notes.append(quantization.random_calibration_note(calibration))
        if "cast" in calibration:
            run.report.notes.append(quantization.cast_calibration_note(calibration))


def _declared_dynamic(run: Export) -> list[DynamicAxis]:
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


def _check_task_route(run: Export) -> None:
    """A task with past needs a cache that grows from nothing, step by step: a route that exports
    fixed sizes hands it to the format's LLM route (routes.WITH_PAST), and without one it is exit 4
    naming model type, task and route."""
    task = TASKS.get(run.source.facts.get("task"))
    if task is None or not task.past:
        return
    past = route_with_past(run.route, task.call, run.options["exporter"], run.options["quantize"])
    if past is None:
        raise Incompatible(f"model type {run.source.facts['model_type']}, task {task.name}: the "
                           f"{run.route.framework} -> {run.options['to']} route ({'/'.join(run.route.exporters)}) "
                           "exports fixed sizes, a KV cache grows from an empty prefill step by step, and no LLM "
                           f"route here writes this model's; export for {task.name.removesuffix('-with-past')} (no "
                           "cache) or to onnx")
    run.route = past


def _check_beside(run: Export) -> None:
    """The files published beside the artifact must not replace another model's: a file of the same
    name and other content in --out's folder stops the run before anything is written."""
    for file in run.source.beside:
        there = run.out.parent / file.name
        if there.exists() and not (there.is_file() and filecmp.cmp(file, there, shallow=False)):
            raise BadInput(f"--out {run.out}: {there} exists and is not {file}, which is published beside the "
                           "artifact; give --out in a folder of its own")


def _stage(run: Export) -> None:
    """Take --out's lock, sweep what killed runs left, and open a staging folder beside --out."""
    run.cleanups.enter_context(out_lock(run.out, run.progress))
    swept = sweep_abandoned(run.out.parent)
    if swept:
        run.report.notes.append(f"removed {len(swept)} staging folder(s) left by killed runs: "
                                + ", ".join(p.name for p in swept))
    run.staging = Staging(run.out, run.options["to"])
    run.cleanups.callback(run.staging.cleanup)


def _export(run: Export) -> None:
    options = run.options
    run.request = ExportRequest(options["to"], run.opset, options["exporter"], run.of(Sizes).axes,
                                output_names=run.reference[0][0], sample_inputs=run.feeds[0],
                                quantize=options["quantize"], io=options["io"], calibration=run.calibration_feeds,
                                keep_fp32=list(options["keep_fp32"]), allow_float=options["allow_float_ops"])
    result = run.route.export(run.source, run.request, run.staging.path, run.progress)
    if result.quantization:
        run.report.quantization.update(result.quantization)
    # Only a run that really exported and then failed removes the release at --out.
    run.cleanups.callback(_remove_stale_release, run.report, run.out, options["to"])
    run.report.exporter = result.exporter
    run.report.notes.extend(result.notes)
    run.report.dynamic_hints.extend(result.hints)
    # A declared flavour change makes the outputs differ from the source's: the export as it was
    # before the rewrite is compared too, so a difference of any other cause still fails.
    if run.verifying and options["gelu"] == "tanh":
        run.before_rewrite = run.staging.keep_copy("before-gelu-rewrite")


def _remove_stale_release(report: Report, out: Path, fmt: str) -> None:
    """After a run that exported and failed: no previous release may stand at --out as if it
    were this run's."""
    if report.exit_code != 0 and remove_artifact(out, fmt):
        report.notes.append(f"removed the previous {out} (and its data files) so no stale artifact stands at --out")


def _gelu_form(run: Export) -> None:
    run.outcome = apply_gelu_policy(run.staging.path, run.options["to"], run.options["gelu"], run.target)
    run.of(Gelu).declared = run.outcome.declared
    run.report.notes.extend(run.outcome.notes)
    if run.target is not None:
        run.report.notes.extend(filter(None, [fit_ir_version(run.staging.path, run.target)]))


def _artifact_facts(run: Export) -> None:
    run.artifact = artifact_format(run.options["to"]).open(run.staging.path)
    record_artifact(run.report, run.artifact)
    run.digests = hash_in_background(run.artifact)


def _compare_before_rewrite(run: Export) -> None:
    scratch = Report(command="export")
    before = Verification(scratch, run.progress, run.options, tolerances=run.tolerances, feeds=run.feeds,
                          reference=run.reference, artifact=artifact_format(run.options["to"]).open(run.before_rewrite))
    load_artifact(before)
    compare_outputs(before)
    for finding in scratch.failures:
        finding.message = f"before the --gelu rewrite: {finding.message}"
        finding.data["compared"] = BEFORE_REWRITE
        run.report.failures.append(finding)


def _publish(run: Export) -> None:
    """Publish the artifact at --out when every check passed, else keep it as NAME.rejected."""
    if not run.verifying:
        run.report.notes.append("verification skipped (--no-verify): the artifact was not run or compared")
    if run.report.exit_code == 0:
        # The report is written first: nothing is published that its report does not describe.
        run.report.artifact = artifact_info(run.artifact, published_as=run.out, digests=run.digests)
        run.report.published_beside = [file.name for file in run.source.beside]
        report_source_files(run)
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
        run.report.artifact = artifact_info(artifact_format(run.options["to"]).open(rejected))


EXPORT_STEPS = (
    Step("options", check_options),
    Step("start_runtime", lambda run: run.cleanups.callback(start_early(runtime_for(run.options["to"]))),
         when=lambda run: run.verifying),
    Step("load_source", _load_source, message=lambda run: f"loading {run.model}"),
    *SOURCE_STEPS,
    Step("stage", _stage),
    Step("export", _export),
    Step("gelu_form", _gelu_form),
    Step("artifact_facts", _artifact_facts),
    *PRECISION_STEPS,
    Step("target_check", lambda run: check_target(run.report, run.artifact, run.target),
         when=lambda run: run.target is not None),
    Step("compare_before_rewrite", runs_the_artifact(_compare_before_rewrite),
         message=lambda run: "comparing the export as it was before the --gelu rewrite",
         when=lambda run: run.active and run.before_rewrite is not None),
    *JUDGING_STEPS,
    Step("publish", _publish),
)
