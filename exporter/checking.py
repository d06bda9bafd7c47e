"""`exportgate check`: every incompatibility of an artifact (from any tool) with a target, without
running it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from exporter.artifact_record import hash_in_background, record_artifact, report_artifact
from exporter.checks.target import check_target, target_named
from verifiers.formats import Artifact, open_artifact
from verifiers.report import Report
from verifiers.steps import Step
from verifiers.writers import check_reports


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
