"""The verification steps every command shares: run the artifact beside the source, compare the
outputs, and judge every GELU. Per-format pieces are found in the registries at the top."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verifiers.errors import BadInput, ExportgateError, one_line
from verifiers.quiet import quiet_exporter
from exporter.sources import InputSpec, Source
from exporter.staging import companion_files
from verifiers.compare import Tolerances, compare_outputs, match_outputs
from verifiers.onnx_model import default_opset, load_structure, malformed_onnx_is_bad_input
from verifiers.onnx_model import describe as describe_onnx
from verifiers.report import Report
from verifiers.runtimes import InvalidArtifact, Runner, open_runner, runner_for
from verifiers.runtimes import isolation


def _onnx_activation_sites(path: Path):
    from verifiers.gelu.inventory import onnx_inventory

    return malformed_onnx_is_bad_input(path, lambda: onnx_inventory(load_structure(path)))


def _describe_onnx(path: str | Path) -> dict[str, Any]:
    from verifiers.gelu.inventory import describe_sites

    info = malformed_onnx_is_bad_input(Path(path), describe_onnx, path)
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


def describe_artifact(path: Path, fmt: str) -> dict[str, Any]:
    """Format, opsets or runtime version, op counts, inputs and outputs, and the GELU sites with
    their claimed and measured flavours (no torch or TensorFlow import; the measuring runs in a
    runtime worker)."""
    return isolation.call(DESCRIBERS[fmt], Path(path), runtime=runner_for(fmt).runtime,
                          step="measuring the artifact's GELU sites")


def artifact_inventory(path: Path, fmt: str, runner: Runner | None = None) -> list:
    """The artifact's GELU and ReLU sites, measured on the probes in a runtime worker (the
    runner's, when there is one)."""
    return isolation.call(ARTIFACT_INVENTORIES[fmt], Path(path), runtime=runner_for(fmt).runtime,
                          step="measuring the artifact's GELU sites", runner=runner)


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


def record_artifact_facts(report: Report, path: Path, fmt: str) -> None:
    ARTIFACT_FACTS[fmt](report, path)


def verify_artifact(report, path, fmt, source, feeds, reference, tolerances, progress,
                    declared: dict[str, str] | None = None, gelu_guard: bool = True,
                    captured: list | str | None = None) -> None:
    with report.timed("load_artifact"):
        progress(f"loading the artifact in {runner_for(fmt).runtime}")
        runner = open_runner(fmt, path)
    comparison = compare(report, runner, feeds, reference, tolerances, progress)
    judge_gelu(report, source, path, fmt, feeds[0], comparison, tolerances, progress, declared, gelu_guard,
               captured)


def compare_artifact(report, path, fmt, feeds, reference, tolerances, progress) -> None:
    """Only the output comparison (no GELU verdict), e.g. for an export before a declared rewrite."""
    compare(report, open_runner(fmt, path), feeds, reference, tolerances, progress)


def compare(report: Report, runner: Runner, feeds, reference, tolerances: Tolerances, progress) -> Comparison:
    ref_names, names_are_real = reference[0][0], reference[0][1]
    art_names = [o.name for o in runner.outputs]
    pairs = match_outputs(ref_names, names_are_real, art_names)
    unknown = tolerances.unknown_outputs(ref_names)
    if unknown:
        raise BadInput(f"tolerance given for unknown output(s) {', '.join(unknown)} "
                       f"(outputs: {', '.join(ref_names)})")
    artifact_feeds = [_artifact_feed(runner, feed) for feed in feeds]
    with report.timed("run_artifact"):
        progress(f"running the artifact on {len(feeds)} batch(es)")
        runs: dict[str, list[list[np.ndarray]]] = {variant: [] for variant in runner.variants}
        for feed in artifact_feeds:
            try:
                outputs = runner.run_all(feed)
            except Exception as exc:
                raise InvalidArtifact(f"the artifact failed to run: {one_line(exc)}") from exc
            for variant in runner.variants:
                runs[variant].append(outputs[variant])
    comparison = Comparison(ref_names, art_names, pairs, [r[2] for r in reference], artifact_feeds, runner)
    with report.timed("compare"):
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
    runner: Runner | None = None  # what ran the artifact: its worker also runs the GELU probes

    def against(self, artifact_outputs, tolerances: Tolerances):
        return compare_outputs(self.reference_names, self.artifact_names, self.pairs,
                               self.reference_outputs, artifact_outputs, tolerances)


def capture_source_sites(source: Source, feed) -> list | str:
    """The source's activation sites, read as its framework runs it, or why they could not be.

    An export reads them before exporting: an exporter may change the model it is given (the
    TorchScript exporter's tracing leaves transformers' Swin with tensor window sizes)."""
    try:
        with quiet_exporter():
            return source.framework.activation_sites(source, feed)
    except ExportgateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any capture failure is reported, not raised
        return one_line(exc)


def judge_gelu(report: Report, source: Source, path: Path, fmt: str, feed, comparison: Comparison,
                tolerances: Tolerances, progress, declared: dict[str, str] | None = None,
                enabled: bool = True, captured: list | str | None = None) -> None:
    """Find every GELU on both sides, measure the artifact's, and fail on any silent change.

    `captured` is what `capture_source_sites` gave, when it ran earlier. A source graph that
    cannot be read fails the run (the guard cannot vouch for the artifact) unless the user turned
    the guard off, which the report records."""
    from verifiers.gelu.verdict import DECLARED, SiteFlavour, judge

    if not enabled:
        report.gelu_guard = "off (--no-gelu-guard)"
        report.notes.append("GELU guard off (--no-gelu-guard): no GELU site was checked")
        return
    with report.timed("gelu"):
        progress("finding the GELU sites of the source and measuring the artifact's")
        if captured is None:
            captured = capture_source_sites(source, feed)
        if isinstance(captured, str):
            report.gelu_guard = "failed: the source graph could not be read"
            report.fail("gelu_guard", f"the GELU guard could not read the source graph ({captured}); "
                                      "pass --no-gelu-guard to ship without the guard")
            return
        source_sites = [SiteFlavour(s, s.claimed, scale=s.scale) for s in captured]
        artifact_sites = artifact_inventory(path, fmt, comparison.runner)
        verdicts = judge(source_sites, artifact_sites, declared)
    report.gelu_guard = "checked"
    report.gelu = [v.to_dict() for v in verdicts]
    for verdict in verdicts:
        if verdict.failed:
            side = verdict.artifact or verdict.source
            report.fail("gelu", verdict.message(), site=side.site.site_id)
        elif verdict.status == DECLARED:
            report.notes.append(verdict.message())
    if any(v.status == DECLARED for v in verdicts) and not any(v.failed for v in verdicts):
        _accept_declared_differences(report)
    if fmt == "onnx":
        with report.timed("gelu_sensitivity"):
            _gelu_sensitivity(report, path, artifact_sites, comparison, tolerances)


def _accept_declared_differences(report: Report) -> None:
    """Outputs differ from the source's when a GELU's flavour changed as the user asked: with every
    other GELU kept, such differences are reported, not failed."""
    numeric = [f for f in report.failures if f.kind == "numeric" and "non-finite" not in f.message
               and "shape differs" not in f.message]
    for finding in numeric:
        report.failures.remove(finding)
        report.notes.append(f"{finding.message} -- expected from the declared GELU change, not a failure")


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
    runs = isolation.call(run_variant, variant, comparison.artifact_feeds, runtime="onnxruntime",
                          step="running the GELU-swapped variant", runner=comparison.runner)
    results, _ = comparison.against(runs, tolerances)
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
        mismatch = shape_mismatch(info.shape, list(value.shape))
        if mismatch:
            raise BadInput(f"input {info.name}: {mismatch}")
    return chosen


def shape_mismatch(declared: list, fed: list[int]) -> str | None:
    """Why an input of the declared shape (None or a name for a dynamic axis) cannot take an
    array of shape `fed`, or None. Runtimes that resize inputs (LiteRT) would run it anyway and
    only the outputs would be wrong; a permutation of the same sizes is named as a layout."""
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
    for i, dim in enumerate(declared):
        candidates = [j for j in range(len(fed)) if j not in used and (not isinstance(dim, int) or fed[j] == dim)]
        if not candidates:
            return None
        j = candidates[0]
        used.add(j)
        perm.append(j)
    return perm


def input_specs_of(runner: Runner) -> list[InputSpec]:
    """Input specs read off an artifact, for sources that come without example inputs."""
    return [
        InputSpec(i.name, tuple(d if isinstance(d, int) and d > 0 else 2 for d in i.shape), i.dtype)
        for i in runner.inputs
    ]

