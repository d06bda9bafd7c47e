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
    if target.float16 is not None and _holds_float16(artifact):
        report.notes.append(float16_on_target(target))


def _holds_float16(artifact: Artifact) -> bool:
    """Whether the artifact has float16 weights or ops that compute on float16 tensors."""
    precision = artifact.precision()
    return precision.mode == "fp16" or any(op.dtype == "float16" for op in precision.float_ops)


def float16_on_target(target: Target) -> str:
    """What a float16 artifact's ops compute in on `target`, and which of verify's runs that is."""
    from verifiers.target_facts import cite

    if target.float16 == "float16":
        says = ("compute in float16 there: verify's run in float16 arithmetic (its `float16` variant) is the one "
                "that shows what it gives")
    else:
        says = "are cast up to float32 there, so values beyond float16's 65504 do not overflow on it"
    return f"{target.name}: the artifact's float16 ops {says} ({cite(target, 'float16')})"
