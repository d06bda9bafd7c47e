"""`exportgate check`: every incompatibility of an artifact (from any tool) with a target, without
running it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from exporter.artifact_record import hash_in_background, record_artifact, report_artifact
from verifiers.errors import BadInput
from verifiers.formats import Artifact, open_artifact
from verifiers.report import Report
from verifiers.steps import Step
from verifiers.targets import Target
from verifiers.writers import check_reports


def target_named(name: str, matrix: str | Path | None, fmt: str | None) -> Target:
    """The target `name` of the packaged matrix plus `matrix`; one that runs another format than
    `fmt` (when given) is bad input."""
    from verifiers.target_matrix import get_target, load_targets

    chosen = get_target(name, load_targets(Path(matrix) if matrix else None))
    if fmt is not None and chosen.format != fmt:
        raise BadInput(f"--target {name} runs {chosen.format} artifacts, not {fmt} (use --to {chosen.format})")
    return chosen


def check_target(report: Report, artifact: Artifact, target: Target) -> None:
    """Every incompatibility of `artifact` with `target`, as findings and report.target_checks."""
    from verifiers.target_check import check_artifact, to_findings

    found = check_artifact(artifact, target)
    findings = to_findings(found, target, report.command)
    report.target_checks = [{"kind": i.kind, "message": f.message} for i, f in zip(found, findings)]
    report.failures.extend(findings)


@dataclass
class Checking:
    report: Report
    path: Path
    target_name: str
    matrix: str | Path | None
    reports: dict[str, Path]
    artifact: Artifact | None = None
    cleanups: contextlib.ExitStack | None = None


def _artifact_facts(run: Checking) -> None:
    """The artifact's facts; its digests are hashed beside the target check and reported at the end."""
    run.artifact = open_artifact(run.path)
    record_artifact(run.report, run.artifact)
    run.cleanups.callback(report_artifact, run.report, run.artifact, hash_in_background(run.artifact))


CHECK_STEPS = (
    Step("options", lambda run: check_reports(run.reports)),
    Step("artifact_facts", _artifact_facts),
    Step("target_check", lambda run: check_target(run.report, run.artifact,
                                                  target_named(run.target_name, run.matrix, None))),
)
