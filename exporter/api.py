"""The Python API: export, verify, check, targets and inspect. Each returns what the CLI prints or writes.

The API never prints: progress on long steps goes to the `progress` callback.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

from verifiers.errors import BadInput, ExportgateError, Incompatible, Terminated, one_line
from exporter.gelu_policy import apply_gelu_policy
from exporter.gelu_policy import check_gelu_policy
from exporter.routes import ExportRequest, check_request, route_for
from exporter.frameworks import load_source
from exporter.sources import (
    make_batches,
    parse_dynamic_axis,
    parse_input_spec,
)
from exporter.staging import Staging, companion_files, out_lock, remove_artifact, sweep_abandoned
from exporter.target_fit import fit_ir_version
from verifiers.compare import Tolerances
from verifiers.formats import detect_format
from verifiers.pipeline import (
    capture_source_sites,
    compare,
    compare_artifact,
    describe_artifact,
    input_specs_of,
    judge_gelu,
    record_artifact_facts,
    verify_artifact,
)
from verifiers.report import ArtifactInfo, Report
from verifiers.runtimes import InvalidArtifact, open_runner, runner_for

Progress = Callable[[str], None]
DEFAULT_BATCHES = 3


def _silent(_: str) -> None:
    pass


@contextlib.contextmanager
def _reported(report: Report, report_path: str | Path | None) -> Iterator[contextlib.ExitStack]:
    """Run a command's steps so that every way out leaves a report whose verdict and exit code
    are the run's own. An ExportgateError becomes its finding; an interrupt (SIGINT, SIGTERM) or
    an unforeseen error becomes a finding too and is raised again. Then the clean-ups the steps
    pushed on the yielded stack run (they see the findings), and last the report is written."""
    try:
        with contextlib.ExitStack() as stack:
            try:
                yield stack
            except ExportgateError as exc:
                report.fail(exc.kind, str(exc))
            except KeyboardInterrupt:
                report.fail("interrupted", "interrupted (SIGINT): nothing was published")
                raise
            except Terminated:
                report.fail("terminated", "terminated (SIGTERM): nothing was published")
                raise
            except Exception as exc:
                report.fail("internal", f"internal error: {one_line(exc)}")
                raise
    finally:
        if report_path is not None:
            try:
                check_writable(report_path, "--report")
                _write_report(report, report_path)
            except BadInput as exc:
                if all(f.message != str(exc) for f in report.failures):  # said once, when first found
                    report.fail("input", str(exc))


def _write_report(report: Report, report_path: str | Path) -> None:
    try:
        report.write_json(report_path)
    except OSError as exc:
        raise BadInput(f"--report {report_path}: cannot write it: {one_line(exc)}") from exc


def check_writable(path: str | Path, option: str) -> None:
    """Refuse, before any work, a file path the run could not write: a folder, a path under a
    file, or a folder this process may not write to (read-only filesystem included)."""
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{option} {path}: is a folder; give a file path")
    ancestor = path.parent
    while not ancestor.exists():
        if ancestor == ancestor.parent:
            break
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BadInput(f"{option} {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise BadInput(f"{option} {path}: {ancestor} is not writable")


def export(
    model: str,
    *,
    to: str,
    out: str | Path,
    opset: int | None = None,
    exporter: str = "auto",
    quantize: str | None = None,
    target: str | None = None,
    gelu: str = "preserve",
    matrix: str | Path | None = None,
    inputs: Sequence[str] = (),
    dynamic: Sequence[str] = (),
    atol: Sequence[str] = (),
    rtol: Sequence[str] = (),
    seed: int = 0,
    batches: int = DEFAULT_BATCHES,
    verify: bool = True,
    gelu_guard: bool = True,
    allow_nonfinite: bool = False,
    trust_source: bool = False,
    report_path: str | Path | None = None,
    progress: Progress = _silent,
) -> Report:
    """Export MODEL to `to` at `opset` (or for `target`, with GELU in the form it runs under the
    `gelu` policy), check it against the target, verify it, and publish it at `out` only if all pass."""
    out = Path(out)
    report = Report(command="export", model=model, format=to, requested_opset=opset, seed=seed,
                    batches=batches, verified=verify, quantize=quantize)
    with _reported(report, report_path) as stack:
        # Every option is checked before the model loads and before --out is touched.
        tolerances = Tolerances.parse(list(atol), list(rtol))
        tolerances.allow_nonfinite = allow_nonfinite
        _check_opset(opset)
        check_request(to, exporter, quantize)
        check_gelu_policy(gelu)
        input_specs = [parse_input_spec(s) for s in inputs]
        axes = [parse_dynamic_axis(d) for d in dynamic]
        check_writable(out, "--out")
        if report_path is not None:
            check_writable(report_path, "--report")
        if quantize is not None:
            report.notes.append(tolerances.scale_for(quantize))
        chosen = _target(target, matrix, to) if target else None
        if chosen is not None and to == "onnx":
            opset = _opset_for(chosen, opset)
            report.requested_opset = opset
        report.target = chosen.name if chosen else None
        with report.timed("load_source"):
            progress(f"loading {model}")
            source = load_source(model, input_specs, trust_source=trust_source)
        route = route_for(source.framework.name, to, exporter, quantize)
        ranks = {spec.name: len(spec.shape) for spec in source.inputs}
        for axis in axes:
            if axis.input not in source.input_names:
                raise BadInput(f"--dynamic {axis.input}:{axis.axis}: no input named {axis.input!r} "
                               f"(inputs: {', '.join(source.input_names)})")
            if not 0 <= axis.axis < ranks[axis.input]:
                raise BadInput(f"--dynamic {axis.input}:{axis.axis}: {axis.input} has {ranks[axis.input]} axes "
                               f"(0 to {ranks[axis.input] - 1})")
        feeds = make_batches(source, seed, batches)
        report.example_batch = source.example is not None
        with report.timed("reference"):
            progress(f"running the source model on {len(feeds)} batch(es)")
            reference = [source.run(feed) for feed in feeds]
        captured = None
        if verify and gelu_guard:
            with report.timed("gelu_source"):
                progress("reading the GELU sites of the source")
                captured = capture_source_sites(source, feeds[0])
        stack.enter_context(out_lock(out, progress))
        swept = sweep_abandoned(out.parent)
        if swept:
            report.notes.append(f"removed {len(swept)} staging folder(s) left by killed runs: "
                                + ", ".join(p.name for p in swept))
        staging = Staging(out, to)
        stack.callback(staging.cleanup)
        request = ExportRequest(to, opset, exporter, axes, output_names=reference[0][0], sample_inputs=feeds[0],
                                quantize=quantize)
        with report.timed("export"):
            result = route.export(source, request, staging.path, progress)
        # Only a run that really exported and then failed removes the release at --out.
        stack.callback(_remove_stale_release, report, out, to)
        report.exporter = result.exporter
        report.notes.extend(result.notes)
        # A declared flavour change makes the outputs differ from the source's: the export as it was
        # before the rewrite is compared too, so a difference of any other cause still fails.
        before_rewrite = staging.keep_copy("before-gelu-rewrite") if verify and gelu == "tanh" else None
        with report.timed("gelu_form"):
            outcome = apply_gelu_policy(staging.path, to, gelu, chosen)
        report.notes.extend(outcome.notes)
        if chosen is not None:
            report.notes.extend(filter(None, [fit_ir_version(staging.path, chosen)]))
        record_artifact_facts(report, staging.path, to)
        if chosen is not None:
            _check_target(report, staging.path, chosen)
        if verify:
            try:
                if before_rewrite is not None:
                    _compare_before_rewrite(report, before_rewrite, to, feeds, reference, tolerances, progress)
                verify_artifact(report, staging.path, to, source, feeds, reference, tolerances, progress,
                                outcome.declared, gelu_guard, captured)
            except InvalidArtifact as exc:
                message = str(exc).replace(f"{staging.path}: ", "")
                report.fail("target", f"{report.exporter} wrote an artifact that does not load: {message}")
        else:
            report.notes.append("verification skipped (--no-verify): the artifact was not run or compared")
        if report.exit_code == 0:
            # The report is written first: nothing is published that its report does not describe.
            report.artifact = artifact_info(staging.path, to, published_as=out)
            if report_path is not None:
                _write_report(report, report_path)
            try:
                staging.publish()
            except OSError as exc:
                raise BadInput(f"--out {out}: could not publish the artifact there: {one_line(exc)}") from exc
        else:
            rejected = staging.reject(Path(report_path).parent if report_path else out.parent)
            report.rejected_artifact = str(rejected)
            report.artifact = artifact_info(rejected, to)
    return report


def _remove_stale_release(report: Report, out: Path, fmt: str) -> None:
    """After a run that exported and failed: no previous release may stand at --out as if it
    were this run's."""
    if report.exit_code != 0 and remove_artifact(out, fmt):
        report.notes.append(f"removed the previous {out} (and its data files) so no stale artifact stands at --out")


def verify(
    artifact: str | Path,
    *,
    source: str,
    inputs: Sequence[str] = (),
    atol: Sequence[str] = (),
    rtol: Sequence[str] = (),
    seed: int = 0,
    batches: int = DEFAULT_BATCHES,
    gelu_guard: bool = True,
    allow_nonfinite: bool = False,
    trust_source: bool = False,
    report_path: str | Path | None = None,
    progress: Progress = _silent,
) -> Report:
    """Verify an existing artifact (from exportgate or any other tool) against its source model."""
    artifact = Path(artifact)
    report = Report(command="verify", model=source, seed=seed, batches=batches)
    with _reported(report, report_path):
        tolerances = Tolerances.parse(list(atol), list(rtol))
        tolerances.allow_nonfinite = allow_nonfinite
        input_specs = [parse_input_spec(s) for s in inputs]
        if report_path is not None:
            check_writable(report_path, "--report")
        fmt = detect_format(artifact)
        report.format = fmt
        report.artifact = artifact_info(artifact, fmt)
        record_artifact_facts(report, artifact, fmt)
        with report.timed("load_artifact"):
            progress(f"loading {artifact} in {runner_for(fmt).runtime}")
            runner = open_runner(fmt, artifact)
        with report.timed("load_source"):
            progress(f"loading {source}")
            src = load_source(source, input_specs, default_inputs=input_specs_of(runner), trust_source=trust_source)
        feeds = make_batches(src, seed, batches)
        report.example_batch = src.example is not None
        with report.timed("reference"):
            progress(f"running the source model on {len(feeds)} batch(es)")
            reference = [src.run(feed) for feed in feeds]
        comparison = compare(report, runner, feeds, reference, tolerances, progress)
        judge_gelu(report, src, artifact, fmt, feeds[0], comparison, tolerances, progress, enabled=gelu_guard)
    return report


def inspect(artifact: str | Path) -> dict[str, Any]:
    """Format, opsets, op counts, inputs and outputs, and the GELU sites with their claimed and
    measured flavours, without importing torch or TensorFlow."""
    fmt = detect_format(artifact)
    return describe_artifact(Path(artifact), fmt)


def _compare_before_rewrite(report, path, fmt, feeds, reference, tolerances, progress) -> None:
    scratch = Report(command="export")
    progress("comparing the export as it was before the --gelu rewrite")
    compare_artifact(scratch, path, fmt, feeds, reference, tolerances, progress)
    report.timings["compare_before_rewrite"] = sum(scratch.timings.values())
    for finding in scratch.failures:
        finding.message = f"before the --gelu rewrite: {finding.message}"
        report.failures.append(finding)


def check(
    artifact: str | Path, *, target: str, matrix: str | Path | None = None, report_path: str | Path | None = None,
) -> Report:
    """Every incompatibility of an artifact (from any tool) with a target; exit 4 when there is one."""
    artifact = Path(artifact)
    report = Report(command="check", target=target)
    with _reported(report, report_path):
        if report_path is not None:
            check_writable(report_path, "--report")
        fmt = detect_format(artifact)
        report.format = fmt
        report.artifact = artifact_info(artifact, fmt)
        record_artifact_facts(report, artifact, fmt)
        _check_target(report, artifact, _target(target, matrix, None))
    return report


def targets(matrix: str | Path | None = None) -> list[dict[str, Any]]:
    """The known targets (the packaged matrix plus `matrix`), as `exportgate targets` lists them."""
    from dataclasses import asdict

    from exporter.targets import load_targets

    return [asdict(t) for t in load_targets(Path(matrix) if matrix else None).values()]


def _target(name: str, matrix: str | Path | None, fmt: str | None):
    from exporter.targets import get_target, load_targets

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


def _check_target(report: Report, path: Path, target) -> None:
    from verifiers.target_check import check_artifact, to_findings

    with report.timed("target_check"):
        found = check_artifact(path, target)
    report.target_checks = [{"kind": i.kind, "message": i.message} for i in found]
    report.failures.extend(to_findings(found))


def artifact_info(path: Path, fmt: str, published_as: Path | None = None) -> ArtifactInfo:
    """Path, hashes and sizes of an artifact and its data files (refusing data files it may not
    name); `published_as` is where it will stand once published (the same names beside it)."""
    shown = Path(published_as) if published_as is not None else path
    data_files = [
        {"path": str(shown.parent / name), "sha256": _sha256(path.parent / name),
         "size_bytes": (path.parent / name).stat().st_size}
        for name in companion_files(path, fmt)
    ]
    return ArtifactInfo(str(shown), fmt, _sha256(path), path.stat().st_size, data_files)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_opset(opset: int | None) -> None:
    if opset is not None and opset < 1:
        raise BadInput(f"--opset {opset}: must be a positive opset number")


