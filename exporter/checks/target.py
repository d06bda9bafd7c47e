"""The target check: every incompatibility of an artifact with a target device or runtime (its
ops, opset, IR version, types, shapes), read off the artifact without running it. export runs it
before the artifact is judged; check runs it alone."""

from __future__ import annotations

from pathlib import Path

from verifiers.errors import BadInput
from verifiers.formats import Artifact
from verifiers.report import Report
from verifiers.targets import Target


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
