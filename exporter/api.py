"""The Python API: export, verify and inspect. Each returns what the CLI prints or writes.

The API never prints: progress on long steps goes to the `progress` callback.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

import numpy as np

from exporter.errors import BadInput, ExportgateError, one_line
from exporter.routes import ExportRequest, route_for
from exporter.sources import (
    InputSpec, load_source, make_batches, parse_dynamic_axis, parse_input_spec,
)
from exporter.staging import Staging, companion_files, remove_artifact
from verifiers.compare import Tolerances, compare_outputs, match_outputs
from verifiers.formats import detect_format
from verifiers.onnx_model import default_opset, describe as describe_onnx, load_structure
from verifiers.report import ArtifactInfo, Report
from verifiers.runtimes import InvalidArtifact, Runner, runner_for

Progress = Callable[[str], None]
DEFAULT_BATCHES = 3
DESCRIBERS = {"onnx": describe_onnx}


def _silent(_: str) -> None:
    pass


@contextlib.contextmanager
def _timed(report: Report, step: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        report.timings[step] = round(time.perf_counter() - start, 4)


def export(
    model: str,
    *,
    to: str,
    out: str | Path,
    opset: int | None = None,
    exporter: str = "auto",
    inputs: Sequence[str] = (),
    dynamic: Sequence[str] = (),
    atol: Sequence[str] = (),
    rtol: Sequence[str] = (),
    seed: int = 0,
    batches: int = DEFAULT_BATCHES,
    verify: bool = True,
    report_path: str | Path | None = None,
    progress: Progress = _silent,
) -> Report:
    """Export MODEL to `to` at `opset`, verify the artifact, and publish it at `out` only if it passes."""
    out = Path(out)
    report = Report(command="export", model=model, format=to, requested_opset=opset, seed=seed,
                    batches=batches, verified=verify)
    staging = None
    try:
        tolerances = Tolerances.parse(list(atol), list(rtol))
        _check_opset(opset)
        with _timed(report, "load_source"):
            progress(f"loading {model}")
            source = load_source(model, [parse_input_spec(s) for s in inputs])
        route = route_for(source.framework.name, to, exporter)
        axes = [parse_dynamic_axis(d) for d in dynamic]
        for axis in axes:
            if axis.input not in source.input_names:
                raise BadInput(f"--dynamic {axis.input}:{axis.axis}: no input named {axis.input!r} "
                               f"(inputs: {', '.join(source.input_names)})")
        feeds = make_batches(source, seed, batches)
        report.example_batch = source.example is not None
        with _timed(report, "reference"):
            progress(f"running the source model on {len(feeds)} batch(es)")
            reference = [source.run(feed) for feed in feeds]
        staging = Staging(out, to)
        request = ExportRequest(to, opset, exporter, axes, output_names=reference[0][0], sample_inputs=feeds[0])
        with _timed(report, "export"):
            result = route.export(source, request, staging.path, progress)
        report.exporter = result.exporter
        report.notes.extend(result.notes)
        _check_artifact_opset(report, staging.path)
        if verify:
            try:
                _verify_artifact(report, staging.path, to, source, feeds, reference, tolerances, progress)
            except InvalidArtifact as exc:
                report.fail("target", f"{report.exporter} wrote an artifact that does not load: {exc}")
        else:
            report.notes.append("verification skipped (--no-verify): the artifact was not run or compared")
        if report.exit_code == 0:
            report.artifact = artifact_info(staging.publish(), to)
        else:
            rejected = staging.reject(Path(report_path).parent if report_path else out.parent)
            report.rejected_artifact = str(rejected)
            report.artifact = artifact_info(rejected, to)
    except ExportgateError as exc:
        report.fail(exc.kind, str(exc))
    finally:
        if staging is not None:
            staging.cleanup()
        if report.exit_code != 0 and remove_artifact(out, to):
            report.notes.append(f"removed the previous {out} so no stale artifact stands at --out")
        if report_path is not None:
            report.write_json(report_path)
    return report


def verify(
    artifact: str | Path,
    *,
    source: str,
    inputs: Sequence[str] = (),
    atol: Sequence[str] = (),
    rtol: Sequence[str] = (),
    seed: int = 0,
    batches: int = DEFAULT_BATCHES,
    report_path: str | Path | None = None,
    progress: Progress = _silent,
) -> Report:
    """Verify an existing artifact (from exportgate or any other tool) against its source model."""
    artifact = Path(artifact)
    report = Report(command="verify", model=source, seed=seed, batches=batches)
    try:
        tolerances = Tolerances.parse(list(atol), list(rtol))
        fmt = detect_format(artifact)
        report.format = fmt
        report.artifact = artifact_info(artifact, fmt)
        if fmt == "onnx":
            report.actual_opset = default_opset(load_structure(artifact))
        with _timed(report, "load_artifact"):
            progress(f"loading {artifact} in {runner_for(fmt).runtime}")
            runner = runner_for(fmt)(artifact)
        with _timed(report, "load_source"):
            progress(f"loading {source}")
            src = load_source(source, [parse_input_spec(s) for s in inputs], default_inputs=_specs_from(runner))
        feeds = make_batches(src, seed, batches)
        report.example_batch = src.example is not None
        with _timed(report, "reference"):
            progress(f"running the source model on {len(feeds)} batch(es)")
            reference = [src.run(feed) for feed in feeds]
        _compare(report, runner, feeds, reference, tolerances, progress)
    except ExportgateError as exc:
        report.fail(exc.kind, str(exc))
    finally:
        if report_path is not None:
            report.write_json(report_path)
    return report


def inspect(artifact: str | Path) -> dict[str, Any]:
    """Format, opsets, op counts, inputs and outputs of an artifact, without importing torch or TensorFlow."""
    fmt = detect_format(artifact)
    describe = DESCRIBERS.get(fmt)
    if describe is None:
        raise BadInput(f"{artifact}: inspecting {fmt} artifacts is not supported yet")
    return describe(artifact)


def artifact_info(path: Path, fmt: str) -> ArtifactInfo:
    data_files = [
        {"path": str(path.parent / name), "sha256": _sha256(path.parent / name),
         "size_bytes": (path.parent / name).stat().st_size}
        for name in companion_files(path, fmt)
    ]
    return ArtifactInfo(str(path), fmt, _sha256(path), path.stat().st_size, data_files)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_opset(opset: int | None) -> None:
    if opset is not None and opset < 1:
        raise BadInput(f"--opset {opset}: must be a positive opset number")


def _check_artifact_opset(report: Report, path: Path) -> None:
    if report.format != "onnx":
        return
    report.actual_opset = default_opset(load_structure(path))
    if report.requested_opset is not None and report.actual_opset != report.requested_opset:
        report.fail("opset", f"asked for opset {report.requested_opset}, the artifact has opset "
                             f"{report.actual_opset} ({report.exporter})")


def _verify_artifact(report, path, fmt, source, feeds, reference, tolerances, progress) -> None:
    with _timed(report, "load_artifact"):
        progress(f"loading the artifact in {runner_for(fmt).runtime}")
        runner = runner_for(fmt)(path)
    _compare(report, runner, feeds, reference, tolerances, progress)


def _compare(report: Report, runner: Runner, feeds, reference, tolerances: Tolerances, progress) -> None:
    ref_names, names_are_real = reference[0][0], reference[0][1]
    art_names = [o.name for o in runner.outputs]
    pairs = match_outputs(ref_names, names_are_real, art_names)
    unknown = tolerances.unknown_outputs(ref_names)
    if unknown:
        raise BadInput(f"tolerance given for unknown output(s) {', '.join(unknown)} "
                       f"(outputs: {', '.join(ref_names)})")
    with _timed(report, "run_artifact"):
        progress(f"running the artifact on {len(feeds)} batch(es)")
        artifact_outputs = []
        for feed in feeds:
            artifact_feed = _artifact_feed(runner, feed)
            try:
                artifact_outputs.append(runner.run(artifact_feed))
            except Exception as exc:
                raise InvalidArtifact(f"the artifact failed to run: {one_line(exc)}") from exc
    with _timed(report, "compare"):
        results, findings = compare_outputs(
            ref_names, art_names, pairs, [r[2] for r in reference], artifact_outputs, tolerances)
    report.outputs.extend(results)
    report.failures.extend(findings)


def _artifact_feed(runner: Runner, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Source inputs under the artifact's input names: by name when they match, else by order."""
    names = [i.name for i in runner.inputs]
    if set(names) <= set(feed):
        chosen = {name: feed[name] for name in names}
    elif len(names) == len(feed):
        chosen = dict(zip(names, feed.values()))
    else:
        raise BadInput(f"the artifact takes inputs {', '.join(names)} and the source "
                       f"{', '.join(feed)}; they cannot be matched by name or by order")
    for info in runner.inputs:
        value = chosen[info.name]
        if value.dtype.name != info.dtype:
            raise BadInput(f"input {info.name}: the artifact takes {info.dtype}, the source {value.dtype.name}")
    return chosen


def _specs_from(runner: Runner) -> list[InputSpec]:
    """Input specs read off an artifact, for sources that come without example inputs."""
    return [
        InputSpec(i.name, tuple(d if isinstance(d, int) and d > 0 else 2 for d in i.shape), i.dtype)
        for i in runner.inputs
    ]

