"""The Python API: export, verify and inspect. Each returns what the CLI prints or writes.

The API never prints: progress on long steps goes to the `progress` callback.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from exporter.errors import BadInput, ExportgateError, one_line
from exporter.routes import ExportRequest, route_for
from exporter.routes.quiet import quiet_exporter
from exporter.sources import (
    InputSpec,
    Source,
    load_source,
    make_batches,
    parse_dynamic_axis,
    parse_input_spec,
)
from exporter.staging import Staging, companion_files, remove_artifact
from verifiers.compare import Tolerances, compare_outputs, match_outputs
from verifiers.formats import detect_format
from verifiers.onnx_model import default_opset, load_structure
from verifiers.onnx_model import describe as describe_onnx
from verifiers.report import ArtifactInfo, Report
from verifiers.runtimes import InvalidArtifact, Runner, runner_for

Progress = Callable[[str], None]
DEFAULT_BATCHES = 3


def _onnx_activation_sites(path: Path):
    from verifiers.gelu.inventory import onnx_inventory

    return onnx_inventory(load_structure(path))


def _describe_onnx(path: str | Path) -> dict[str, Any]:
    from verifiers.gelu.inventory import describe_sites

    info = describe_onnx(path)
    info["gelu"] = describe_sites(_onnx_activation_sites(Path(path)))
    return info


def _tflite_activation_sites(path: Path):
    from verifiers.gelu.tflite_fingerprint import tflite_inventory

    return tflite_inventory(path)


def _describe_tflite(path: str | Path) -> dict[str, Any]:
    from verifiers.gelu.inventory import describe_sites
    from verifiers.tflite_model import describe as describe_tflite

    info = describe_tflite(path)
    info["gelu"] = describe_sites(_tflite_activation_sites(Path(path)))
    return info


# Artifact format -> what inspect shows, and its GELU and ReLU sites in graph order (GELUs measured).
DESCRIBERS = {"onnx": _describe_onnx, "tflite": _describe_tflite}
ARTIFACT_INVENTORIES = {"onnx": _onnx_activation_sites, "tflite": _tflite_activation_sites}
SENSITIVITY_MAX_BYTES = 1 << 30


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
    quantize: str | None = None,
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
                    batches=batches, verified=verify, quantize=quantize)
    staging = None
    try:
        tolerances = Tolerances.parse(list(atol), list(rtol))
        if quantize is not None:
            report.notes.append(tolerances.scale_for(quantize))
        _check_opset(opset)
        with _timed(report, "load_source"):
            progress(f"loading {model}")
            source = load_source(model, [parse_input_spec(s) for s in inputs])
        route = route_for(source.framework.name, to, exporter, quantize)
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
        request = ExportRequest(to, opset, exporter, axes, output_names=reference[0][0], sample_inputs=feeds[0],
                                quantize=quantize)
        with _timed(report, "export"):
            result = route.export(source, request, staging.path, progress)
        report.exporter = result.exporter
        report.notes.extend(result.notes)
        _record_artifact_facts(report, staging.path, to)
        if verify:
            try:
                _verify_artifact(report, staging.path, to, source, feeds, reference, tolerances, progress)
            except InvalidArtifact as exc:
                message = str(exc).replace(f"{staging.path}: ", "")
                report.fail("target", f"{report.exporter} wrote an artifact that does not load: {message}")
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
        _record_artifact_facts(report, artifact, fmt)
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
        comparison = _compare(report, runner, feeds, reference, tolerances, progress)
        _judge_gelu(report, src, artifact, fmt, feeds[0], comparison, tolerances, progress)
    except ExportgateError as exc:
        report.fail(exc.kind, str(exc))
    finally:
        if report_path is not None:
            report.write_json(report_path)
    return report


def inspect(artifact: str | Path) -> dict[str, Any]:
    """Format, opsets, op counts, inputs and outputs, and the GELU sites with their claimed and
    measured flavours, without importing torch or TensorFlow."""
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


def _onnx_facts(report: Report, path: Path) -> None:
    report.actual_opset = default_opset(load_structure(path))
    if report.requested_opset is not None and report.actual_opset != report.requested_opset:
        report.fail("opset", f"asked for opset {report.requested_opset}, the artifact has opset "
                             f"{report.actual_opset} ({report.exporter})")


def _tflite_facts(report: Report, path: Path) -> None:
    from verifiers.tflite_model import describe as describe_tflite

    info = describe_tflite(path)
    report.min_runtime_version = info["min_runtime_version"]
    if info["min_runtime_version_source"] == "computed":
        report.notes.append(f"min_runtime_version {info['min_runtime_version']} computed from the op "
                            "versions (the file carries no metadata)")


# Artifact format -> what the report records about an artifact (its opset, its runtime version).
ARTIFACT_FACTS = {"onnx": _onnx_facts, "tflite": _tflite_facts}


def _record_artifact_facts(report: Report, path: Path, fmt: str) -> None:
    ARTIFACT_FACTS[fmt](report, path)


def _verify_artifact(report, path, fmt, source, feeds, reference, tolerances, progress) -> None:
    with _timed(report, "load_artifact"):
        progress(f"loading the artifact in {runner_for(fmt).runtime}")
        runner = runner_for(fmt)(path)
    comparison = _compare(report, runner, feeds, reference, tolerances, progress)
    _judge_gelu(report, source, path, fmt, feeds[0], comparison, tolerances, progress)


def _compare(report: Report, runner: Runner, feeds, reference, tolerances: Tolerances, progress) -> Comparison:
    ref_names, names_are_real = reference[0][0], reference[0][1]
    art_names = [o.name for o in runner.outputs]
    pairs = match_outputs(ref_names, names_are_real, art_names)
    unknown = tolerances.unknown_outputs(ref_names)
    if unknown:
        raise BadInput(f"tolerance given for unknown output(s) {', '.join(unknown)} "
                       f"(outputs: {', '.join(ref_names)})")
    artifact_feeds = [_artifact_feed(runner, feed) for feed in feeds]
    with _timed(report, "run_artifact"):
        progress(f"running the artifact on {len(feeds)} batch(es)")
        runs: dict[str, list[list[np.ndarray]]] = {variant: [] for variant in runner.variants}
        for feed in artifact_feeds:
            try:
                outputs = runner.run_all(feed)
            except Exception as exc:
                raise InvalidArtifact(f"the artifact failed to run: {one_line(exc)}") from exc
            for variant in runner.variants:
                runs[variant].append(outputs[variant])
    comparison = Comparison(ref_names, art_names, pairs, [r[2] for r in reference], artifact_feeds)
    with _timed(report, "compare"):
        for k, variant in enumerate(runner.variants):
            results, findings = comparison.against(runs[variant], tolerances)
            if k == 0:
                report.outputs.extend(results)
            else:
                report.variant_outputs[variant] = results
                for finding in findings:
                    finding.message = f"({variant}) {finding.message}"
            report.failures.extend(findings)
    if len(runner.variants) > 1:
        report.notes.append(f"{runner.runtime} ran the artifact {len(runner.variants)} ways: "
                            f"{', '.join(runner.variants)} (outputs: {runner.variants[0]})")
    return comparison


@dataclass
class Comparison:
    """Source outputs and how they pair with the artifact's, to judge any run of the artifact."""

    reference_names: list[str]
    artifact_names: list[str]
    pairs: list[tuple[int, int]]
    reference_outputs: list[list[np.ndarray]]
    artifact_feeds: list[dict[str, np.ndarray]]

    def against(self, artifact_outputs, tolerances: Tolerances):
        return compare_outputs(self.reference_names, self.artifact_names, self.pairs,
                               self.reference_outputs, artifact_outputs, tolerances)


def _judge_gelu(report: Report, source: Source, path: Path, fmt: str, feed, comparison: Comparison,
                tolerances: Tolerances, progress, declared: dict[str, str] | None = None) -> None:
    """Find every GELU on both sides, measure the artifact's, and fail on any silent change."""
    from verifiers.gelu.verdict import DECLARED, SiteFlavour, judge

    with _timed(report, "gelu"):
        progress("finding the GELU sites of the source and measuring the artifact's")
        try:
            with quiet_exporter():
                source_sites = [SiteFlavour(s, s.claimed) for s in source.framework.activation_sites(source, feed)]
        except ExportgateError:
            raise
        except Exception as exc:
            report.gelu_guard = f"skipped: the source graph could not be read ({one_line(exc)})"
            return
        artifact_sites = ARTIFACT_INVENTORIES[fmt](path)
        verdicts = judge(source_sites, artifact_sites, declared)
    report.gelu_guard = "checked"
    report.gelu = [v.to_dict() for v in verdicts]
    for verdict in verdicts:
        if verdict.failed:
            side = verdict.artifact or verdict.source
            report.fail("gelu", verdict.message(), site=side.site.site_id)
        elif verdict.status == DECLARED:
            report.notes.append(verdict.message())
    if fmt == "onnx":
        with _timed(report, "gelu_sensitivity"):
            _gelu_sensitivity(report, path, artifact_sites, comparison, tolerances)


def _gelu_sensitivity(report, path, artifact_sites, comparison: Comparison, tolerances) -> None:
    """Say when the output tolerance alone could not have told exact GELU from tanh."""
    import onnx

    from verifiers.gelu.onnx_normalize import split_duplicate_gemms
    from verifiers.gelu.sensitivity import run_variant, swapped_variant

    if path.stat().st_size + sum(f.stat().st_size for f in _data_paths(path)) > SENSITIVITY_MAX_BYTES:
        report.notes.append("GELU tolerance check skipped: the model is too large to run twice")
        return
    try:
        variant = swapped_variant(split_duplicate_gemms(onnx.load(str(path))), artifact_sites)
    except ValueError as exc:  # a site the rewrite cannot isolate
        report.notes.append(f"GELU tolerance check skipped: {exc}")
        return
    if variant is None:
        return
    results, _ = comparison.against(run_variant(variant, comparison.artifact_feeds), tolerances)
    for result in results:
        report.gelu_swap_effect[result.name] = result.max_abs_err
        if result.passed:
            report.notes.append(
                f"output {result.name}: atol {result.atol:g} / rtol {result.rtol:g} cannot tell exact GELU "
                f"from tanh here (swapping every GELU's flavour moves it by at most {result.max_abs_err:.2g} "
                f"and would still pass); only the GELU guard sees such a change")


def _data_paths(path: Path) -> list[Path]:
    return [path.parent / name for name in companion_files(path, "onnx")]


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

