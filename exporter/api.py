"""The Python API: export, verify, check, measure, targets and inspect. Each returns what the CLI
prints or writes.

export, verify, check and measure are short lists of named steps (exporter.exporting, exporter.verifying,
exporter.checking; the checks export and verify share are exporter.checks), run by
verifiers.steps: progress, timings, errors and the report. Options are passed by the names
exporter.options declares. The API never prints: progress on long steps goes to the `progress`
callback.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.checking import CHECK_STEPS, Checking
from exporter.exporting import EXPORT_STEPS, Export, check_options
from exporter.measuring import MEASURE_STEPS, Measuring
from exporter.options import given
from exporter.verifying import VERIFY_STEPS, Verify
from verifiers.judging import describe_artifact
from verifiers.report import Report
from verifiers.steps import Progress, run_steps, silent


def export(model: str, *, report_path: str | Path | None = None, reports: Mapping[str, str | Path] | None = None,
           progress: Progress = silent, **options: Any) -> Report:
    """Export MODEL to `to` at `opset` (or for `target`, with GELU in the form it runs under the
    `gelu` policy), check it against the target, verify it, and publish it at `out` only if all pass.
    The options are `exportgate export`'s, by name (exporter.options)."""
    run = _export_run(model, options, progress, _reports(report_path, reports))
    return run_steps(run.report, EXPORT_STEPS, run, progress, run.reports)


def check_export_options(model: str, **options: Any) -> None:
    """Every check `export(model, **options)` makes of its options before the model loads (BadInput,
    Incompatible, naming the option), without loading, running or writing anything."""
    check_options(_export_run(model, options, silent, {}))


def _export_run(model: str, options: Mapping[str, Any], progress: Progress, reports: dict[str, Path]) -> Export:
    options = given("export", options)
    report = Report(command="export", model=model, format=options["to"], requested_opset=options["opset"],
                    seed=options["seed"], quantize=options["quantize"],
                    full_lists=options["full_lists"])
    return Export(report, progress, options, reports, model=model, out=Path(options["out"]), opset=options["opset"],
                  verifying=options["verify"])


def verify(artifact: str | Path, *, report_path: str | Path | None = None,
           reports: Mapping[str, str | Path] | None = None, progress: Progress = silent, **options: Any) -> Report:
    """Verify an existing artifact (from exportgate or any other tool) against its source model,
    run in `runtime` (by default the one its format names: onnxruntime, ai-edge-litert). The
    options are `exportgate verify`'s, by name (exporter.options)."""
    options = given("verify", options)
    report = Report(command="verify", model=options["source"], seed=options["seed"], full_lists=options["full_lists"])
    run = Verify(report, progress, options, _reports(report_path, reports), path=Path(artifact),
                 model=options["source"])
    return run_steps(report, VERIFY_STEPS, run, progress, run.reports)


def check(artifact: str | Path, *, report_path: str | Path | None = None,
          reports: Mapping[str, str | Path] | None = None, **options: Any) -> Report:
    """Every incompatibility of an artifact (from any tool) with a target; exit 4 when there is one.
    The options are `exportgate check`'s, by name (exporter.options)."""
    options = given("check", options)
    report = Report(command="check", target=options["target"], full_lists=options["full_lists"])
    run = Checking(report, Path(artifact), options["target"], options["matrix"], _reports(report_path, reports))
    return run_steps(report, CHECK_STEPS, run, silent, run.reports)


def measure(artifact: str | Path, *, report_path: str | Path | None = None,
            reports: Mapping[str, str | Path] | None = None, progress: Progress = silent, **options: Any) -> Report:
    """What an artifact (from any tool) costs in its runtime, with no source model: load time,
    latency, throughput and peak memory (report.measurement). The options are `exportgate
    measure`'s, by name (exporter.options)."""
    options = given("measure", options)
    report = Report(command="measure")
    run = Measuring(report, progress, options, _reports(report_path, reports), Path(artifact))
    return run_steps(report, MEASURE_STEPS, run, progress, run.reports)


def inspect(artifact: str | Path) -> dict[str, Any]:
    """Format, opsets, op counts, inputs and outputs, and the GELU sites with their claimed and
    measured flavours, without importing torch or TensorFlow."""
    return describe_artifact(artifact)


def targets(matrix: str | Path | None = None) -> list[dict[str, Any]]:
    """The known targets (the packaged matrix plus `matrix`), as `exportgate targets` lists them."""
    from dataclasses import asdict

    from verifiers.target_matrix import load_targets

    return [asdict(t) for t in load_targets(Path(matrix) if matrix else None).values()]


def _reports(report_path: str | Path | None, reports: Mapping[str, str | Path] | None) -> dict[str, Path]:
    """The report files asked for, by writer name (verifiers.writers): `report_path` is the JSON one."""
    paths = {name: Path(path) for name, path in (reports or {}).items()}
    if report_path is not None:
        paths["json"] = Path(report_path)
    return paths
